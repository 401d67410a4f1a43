"""Cost as the rows grow: the pipeline's stages on 3.7 k, 67 k and about 400 k train rows, time and peak RSS each.

Each size is a temporary DVC project (this checkout's stages/, finetune/, configs/, dvc.yaml and params.yaml, with
``dvc init --no-scm``) whose stages run one by one with ``dvc repro -s <stage>`` under GNU time: wall seconds and
peak RSS of the stage's process tree (DVC's hashing and caching included, as a user pays them). Sizes:

- ``mrpc``: GLUE MRPC from the local copy (its train, validation and test splits).
- ``sst2-xK``: SST-2's train split repeated K times as own files under data/own (K 1: 67 k, K 3: 202 k, K 6: 404 k
  rows), its validation split, and a test split of every 10th train row (6.7 k to 40 k rows: the size of QQP's or
  MNLI's evaluation splits), all labeled.

Training is bounded by ``train.max_steps`` (``--max-steps``, with a validation every ``--max-steps / 2`` steps), so
its time measures what grows with the rows (loading, the length-grouped sampler) plus a fixed number of steps.
The teacher stage runs with distillation off (it scores train rows with the evaluation loop that evaluate measures).

    python -m benchmarks.scale                         # mrpc, sst2-x1, -x3, -x6
    python -m benchmarks.scale --sizes sst2-x1 --max-steps 20

Writes benchmarks/SCALE.md and benchmarks/scale.json (with the command, date and machine).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

import pandas as pd
from datasets import load_dataset
from ruamel.yaml import YAML

from finetune.hardware import cpu_model
from finetune.overrides import with_overrides
from finetune.params import load_params
from finetune.runtime import markdown_table, write_json

HERE = Path(__file__).parent
REPO = HERE.parent
GLUE = REPO.parent / "shared" / "datasets" / "glue"  # the local copy of GLUE (params.yaml data.local_copy)
PROJECT_FILES = ["stages", "finetune", "configs", "dvc.yaml", "params.yaml", ".dvcignore"]
STAGES = ["download", "tokenize", "collate-check", "teacher", "train", "evaluate"]
ROW_STAGES = {"download": "train + validation + test", "tokenize": "train + validation + test",
              "evaluate": "validation + test"}  # the rows each per-row time is counted over


def write_own_files(own: Path, repeat: int) -> None:
    """SST-2 from the local GLUE copy as own parquet files: train repeated ``repeat`` times, validation, and every
    10th train row as test; labels as class names."""
    sst2 = load_dataset(str(GLUE), "sst2")
    names = sst2["train"].features["label"].names
    frames = {split: sst2[split].to_pandas()[["sentence", "label"]] for split in ("train", "validation")}
    for frame in frames.values():
        frame["label"] = [names[i] for i in frame["label"]]
    frames["train"] = pd.concat([frames["train"]] * repeat, ignore_index=True)
    frames["test"] = frames["train"].iloc[::10].reset_index(drop=True)
    own.mkdir(parents=True, exist_ok=True)
    for split, frame in frames.items():
        frame.to_parquet(own / f"{split}.parquet", index=False)


def make_project(root: Path, size: str, max_steps: int) -> None:
    """A DVC project in ``root`` with this checkout's code and params.yaml plus the size's data and overrides."""
    for name in PROJECT_FILES:
        source = REPO / name
        (shutil.copytree if source.is_dir() else shutil.copy2)(source, root / name)
    for folder in ("data/own", "models/own"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    train = {"max_steps": max_steps, "eval_every_steps": max(1, max_steps // 2)}
    if size == "mrpc":
        data = {"local_copy": str(GLUE)}
        splits = ["validation", "test"]
    else:
        write_own_files(root / "data" / "own", int(size.removeprefix("sst2-x")))
        data = {"dataset": None, "config": None, "local_copy": None, "text_columns": ["sentence"],
                "files": {split: f"data/own/{split}.parquet" for split in ("train", "validation", "test")}}
        splits = ["validation", "test"]
    params = with_overrides(load_params(REPO / "params.yaml"),
                            {"data": data, "train": train, "evaluate": {"splits": splits}}, "benchmark overrides")
    with (root / "params.yaml").open("w") as f:
        YAML().dump(json.loads(params.model_dump_json()), f)
    subprocess.run([dvc_bin(), "init", "--no-scm", "-q"], cwd=root, check=True)


def dvc_bin() -> str:
    return str(Path(sys.executable).with_name("dvc"))


def run_stage(root: Path, stage: str) -> dict:
    """``dvc repro -s stage`` under GNU time: ``wall_seconds`` and ``peak_rss_mb`` of its process tree.

    Raises:
        SystemExit: the stage failed (its output's tail in the message).
    """
    timing = root / ".time"
    done = subprocess.run(["/usr/bin/time", "-f", "%e %M", "-o", str(timing), dvc_bin(), "repro", "-s", stage],
                          cwd=root, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"stage {stage} failed in {root}:\n{(done.stdout + done.stderr)[-3000:]}")
    wall, rss_kb = timing.read_text().split()[-2:]
    return {"wall_seconds": round(float(wall), 1), "peak_rss_mb": round(int(rss_kb) / 1024, 1)}


def folder_mb(folder: Path) -> float:
    return round(sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20, 1)


def measure(size: str, max_steps: int) -> dict:
    """Run every stage of one size; rows per split, per-stage cost, train.json's speed, disk of cache and data."""
    with tempfile.TemporaryDirectory(prefix=f"scale-{size}-") as tmp:
        root = Path(tmp)
        make_project(root, size, max_steps)
        stages = {}
        for stage in STAGES:
            print(f"[{size}] {stage} ...", flush=True)
            stages[stage] = run_stage(root, stage)
            print(f"[{size}] {stage}: {stages[stage]}", flush=True)
        dataset = json.loads((root / "metrics" / "provenance.json").read_text())["dataset"]
        rows = {split: s["rows"] for split, s in dataset["splits"].items()}
        train = json.loads((root / "metrics" / "train.json").read_text())
        check = json.loads((root / "metrics" / "collate_check.json").read_text())
        record = {"size": size, "rows": rows, "stages": stages,
                  "train": {k: train[k] for k in ("steps", "train_samples", "train_seconds", "samples_per_second",
                                                  "wall_seconds", "peak_memory_mb", "evaluations")},
                  "collate_check_batches": {split: s.get("batches") for split, s in check.items()
                                            if isinstance(s, dict)},
                  "dvc_cache_mb": folder_mb(root / ".dvc" / "cache"),
                  "disk_mb": {name: folder_mb(root / name) for name in ("data/raw", "data/tokenized",
                                                                         "data/predictions")}}
    for stage, splits in ROW_STAGES.items():
        n = sum(rows.get(s, 0) for s in splits.split(" + "))
        record["stages"][stage]["rows"] = n
        record["stages"][stage]["ms_per_row"] = round(1000 * record["stages"][stage]["wall_seconds"] / n, 4)
    return record


def marginal_ms_per_row(a: dict, b: dict, stage: str) -> float:
    """The extra wall milliseconds per extra row of ``stage`` from size ``a`` to the bigger ``b`` (fixed costs such as
    imports and the checkpoint's copy cancel out)."""
    extra_rows = b["stages"][stage]["rows"] - a["stages"][stage]["rows"]
    return round(1000 * (b["stages"][stage]["wall_seconds"] - a["stages"][stage]["wall_seconds"]) / extra_rows, 4)


def report(records: list[dict], command: str) -> str:
    """SCALE.md: per size and stage wall seconds and peak RSS; per-row times; for the SST-2 sizes, the growth of
    peak RSS from the smallest to the largest (goal below 2x) and the marginal time per row between consecutive sizes
    (goal: flat within 20 %)."""
    head = ["size", "train rows", *[f"{s} s / MB" for s in STAGES], "DVC cache MB"]
    rows = [[r["size"], f"{r['rows']['train']:,}",
             *[f"{r['stages'][s]['wall_seconds']} / {r['stages'][s]['peak_rss_mb']:.0f}" for s in STAGES],
             r["dvc_cache_mb"]] for r in records]
    per_row = [[r["size"], *[r["stages"][s]["ms_per_row"] for s in ROW_STAGES],
                r["train"]["samples_per_second"], round(r["train"]["wall_seconds"] - r["train"]["train_seconds"], 1)]
               for r in records]
    lines = [f"# Cost as the rows grow\n\n`{command}` on {date.today()}, {cpu_model()} ({platform.machine()}), "
             f"train.max_steps {records[0]['train']['steps']}.\n",
             "Wall seconds / peak RSS (MB) per stage (`dvc repro -s <stage>` under GNU time: the stage's process "
             "tree, DVC's hashing and caching included):\n", markdown_table(head, rows), "",
             "Per row (ms, wall over the rows the stage reads, fixed costs included) and training (train.json):\n",
             markdown_table(["size", *[f"{s} ms/row" for s in ROW_STAGES], "train samples/s",
                                 "train stage s outside steps"], per_row), ""]
    sst2 = sorted((r for r in records if r["size"].startswith("sst2")), key=lambda r: r["rows"]["train"])
    if len(sst2) >= 2:
        first, last = sst2[0], sst2[-1]
        pairs = list(zip(sst2, sst2[1:]))
        growth = [[s, f"{last['stages'][s]['peak_rss_mb'] / first['stages'][s]['peak_rss_mb']:.2f}x",
                   *([marginal_ms_per_row(a, b, s) for a, b in pairs] if s in ROW_STAGES else ["—"] * len(pairs))]
                  for s in STAGES]
        lines += [f"SST-2 from {first['rows']['train']:,} to {last['rows']['train']:,} train rows: peak RSS growth "
                  "(goal below 2x) and the marginal ms per extra row between consecutive sizes (goal: flat within "
                  "20 %):\n",
                  markdown_table(["stage", "peak RSS", *[f"ms/row {a['size']} to {b['size']}" for a, b in pairs]],
                                 growth), ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["mrpc", "sst2-x1", "sst2-x3", "sst2-x6"])
    parser.add_argument("--max-steps", type=int, default=60)
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    for size in args.sizes:
        if size != "mrpc" and not (size.startswith("sst2-x") and size.removeprefix("sst2-x").isdigit()):
            parser.error(f"--sizes: {size!r} is not mrpc or sst2-x<K>")
    command = "python -m benchmarks.scale " + " ".join(sys.argv[1:])
    records = [measure(size, args.max_steps) for size in args.sizes]
    write_json(args.out / "scale.json", {"command": command, "date": str(date.today()), "cpu": cpu_model(),
                                         "records": records})
    (args.out / "SCALE.md").write_text(report(records, command.strip()))
    print(report(records, command.strip()))


if __name__ == "__main__":
    main()
