#!/usr/bin/env bash
# CPU check of the GPU screen's insample-5k student through distill.logits (the carried logits), seeds 1 and 2,
# then the default student for seeds 1 and 2 (seed 42 of both is already known)
set -euo pipefail
cd /work/main
/work/main/.venv/bin/python - <<'PY'
import sys, json, shutil
from pathlib import Path
sys.path.insert(0, "benchmarks")
import distill_screen as ds
settings = {"evaluate.splits": ["validation"], "distill.logits": "data/teachers/mpnet-mrpc",
            "distill.transfer.kind": "neighbours", "distill.transfer.k": 20, "distill.transfer.min_similarity": 0.3}
prep = Path("/tmp/cpu/carried")
prep.mkdir(parents=True)
shutil.copytree("data/teachers", prep / "data/teachers")

for name in ds.CODE:
    (shutil.copytree if Path(name).is_dir() else shutil.copy)(name, prep / name)
ds.write_params(prep, settings)
print("prep", ds.stages(prep, ["download", "tokenize", "teacher"]), flush=True)
def record(run, seconds):
    line = ds.result(run, run.name, "student", seconds)
    with open("/tmp/cpu/results.jsonl", "a") as f:
        f.write(json.dumps(line) + "\n")
    print(line, flush=True)
for seed in [1, 2]:
    run = Path(f"/tmp/cpu/carried-{seed}")
    ds.project(run, {**settings, "train.seed": seed}, like=prep)
    record(run, ds.stages(run, ["train", "evaluate"]))
for seed in [1, 2]:
    run = Path(f"/tmp/cpu/none-{seed}")
    ds.project(run, {"evaluate.splits": ["validation"], "train.seed": seed})
    record(run, ds.stages(run, ["download", "tokenize", "teacher", "train", "evaluate"]))
PY
