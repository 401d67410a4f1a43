"""Issue 32's distillation screen in one go, on a machine without DVC (a lent GPU): base-size teachers, the teacher
stage for each transfer configuration, then students over seeds, each run a plain sequence of the pipeline's own
stages (``python -m stages.<name>``) in its own project folder, many runs at once.

Runs, in three waves (each wave's runs in parallel, ``--parallel`` at a time):

1. teachers (``--teacher``: the full train split, and each of ``--folds`` folds with ``train.holdout_fold``) and the
   students without a teacher (``none``, one per seed);
2. per student configuration (``CONFIGS``): download, tokenize and the teacher stage once;
3. the students of each configuration, seed 42 first, sharing that configuration's data/teacher.

Every run writes metrics/train.json and metrics/eval.json (validation only: the test split is read once, for the
finalist, by the real pipeline). ``--out``/results.jsonl gets one line per finished run (so a run cut short still
reports what finished), results.csv a table at the end, and teachers.tar the data/teacher folders (the logits).

    python benchmarks/distill_screen.py --work /tmp/ds --out $OUT --teacher /tmp/models/mpnet \
        --student /tmp/models/minilm --glue /tmp/glue              # the screen
    python benchmarks/distill_screen.py ... --smoke                # 40 rows a split, 1 epoch, 2 folds, 2 seeds
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ruamel.yaml import YAML

REPO = Path(__file__).resolve().parents[1]
CODE = ("finetune", "stages", "configs", "params.yaml")
# The base teacher's recipe (issue 20: metrics/sweeps, docs/distillation.md)
TEACHER = {"train.batch_size": 16, "train.lr": 2e-5, "train.scheduler": "linear", "train.warmup_ratio": 0.06}
NEIGHBOURS = {"distill.transfer.kind": "neighbours", "distill.transfer.k": 20, "distill.transfer.max_similarity": 0.9}
# Student configurations: what a run sets beside the defaults. "fold" in a value is replaced by the fold teachers.
CONFIGS = {
    "insample-5k": {"distill.teacher": "models/own/teacher", **NEIGHBOURS, "distill.transfer.min_similarity": 0.3},
    "crossfit-5k": {"distill.teacher": "models/own/teacher", "distill.fold_teachers": "fold", **NEIGHBOURS,
                    "distill.transfer.min_similarity": 0.3},
    "crossfit-20k": {"distill.teacher": "models/own/teacher", "distill.fold_teachers": "fold", **NEIGHBOURS,
                     "distill.transfer.min_similarity": 0.1, "distill.transfer.max_pairs": 20000},
}


def write_params(folder: Path, settings: dict) -> None:
    """params.yaml of the repository with dotted ``settings`` (``{"train.lr": 2e-5}``) applied, into ``folder``."""
    yaml = YAML()
    params = yaml.load((REPO / "params.yaml").read_text())
    for key, value in settings.items():
        *sections, last = key.split(".")
        node = params
        for section in sections:
            node = node[section]
        node[last] = value
    with open(folder / "params.yaml", "w") as f:
        yaml.dump(params, f)


def project(folder: Path, settings: dict, like: Path | None = None) -> Path:
    """A project folder holding the repository's code and params with ``settings``; with ``like``, that project's
    data and models too (its outputs reused, not recomputed)."""
    if like is not None:
        shutil.copytree(like, folder, symlinks=True)
    else:
        folder.mkdir(parents=True)
        for name in CODE:
            (shutil.copytree if (REPO / name).is_dir() else shutil.copy)(REPO / name, folder / name)
    write_params(folder, settings)
    return folder


def stages(folder: Path, names: list[str]) -> float:
    """Run the stages ``names`` in ``folder`` one after another; the seconds taken. Raises CalledProcessError
    (its log is ``folder``/run.log)."""
    start = time.time()
    with open(folder / "run.log", "a") as log:
        for name in names:
            subprocess.run([sys.executable, "-m", f"stages.{name}"], cwd=folder, stdout=log, stderr=log, check=True)
    return time.time() - start


def result(folder: Path, run: str, role: str, seconds: float) -> dict:
    """One line of results.jsonl: the run's validation metrics, train seconds and steps, and its distillation."""
    train = json.loads((folder / "metrics/train.json").read_text())
    evaluation = json.loads((folder / "metrics/eval.json").read_text())["validation"]
    return {"run": run, "role": role, "accuracy": evaluation.get("accuracy"), "f1": evaluation.get("f1"),
            "train_seconds": train.get("train_seconds"), "steps": train.get("steps"), "wall_seconds": round(seconds, 1),
            "mixed_precision": train.get("mixed_precision"), "device": train.get("device"),
            "distillation": train.get("distillation")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True, help="folder for the run projects (made; must not exist)")
    parser.add_argument("--out", type=Path, required=True, help="folder for results.jsonl, results.csv, teachers.tar")
    parser.add_argument("--teacher", required=True, help="the teachers' pretrained checkpoint folder")
    parser.add_argument("--student", required=True, help="the students' pretrained checkpoint folder")
    parser.add_argument("--glue", required=True, help="a local GLUE copy (data.dataset)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 1, 2, 3, 4])
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--parallel", type=int, default=8, help="runs at a time")
    parser.add_argument("--smoke", action="store_true", help="40 rows a split, 1 epoch, 2 folds, 2 seeds")
    args = parser.parse_args()
    if args.smoke:
        args.seeds, args.folds = args.seeds[:2], 2
    base = {"data.dataset": args.glue, "data.local_copy": None, "evaluate.splits": ["validation"],
            "train.num_threads": 2 if not args.smoke else None}
    if args.smoke:
        base.update({"data.max_samples": 40, "train.epochs": 1, "distill.transfer.max_pairs": 30})
    args.out.mkdir(parents=True, exist_ok=True)
    results = args.out / "results.jsonl"
    pool = ThreadPoolExecutor(args.parallel)

    def full(run: str, role: str, settings: dict) -> Path:
        folder = project(args.work / run, {**base, **settings})
        seconds = stages(folder, ["download", "tokenize", "teacher", "train", "evaluate"])
        with open(results, "a") as f:
            f.write(json.dumps(result(folder, run, role, seconds)) + "\n")
        print(f"{run}: done in {seconds:.0f} s", flush=True)
        return folder

    # 1. teachers and the students without one
    teacher = {**TEACHER, "model.checkpoint": args.teacher}
    folds = [{**teacher, "train.holdout_fold": {"folds": args.folds, "fold": k, "seed": 42}} for k in range(args.folds)]
    wave = {"teacher": pool.submit(full, "teacher", "teacher", teacher)}
    wave |= {f"fold-{k}": pool.submit(full, f"fold-{k}", "teacher", s) for k, s in enumerate(folds)}
    student = {"model.checkpoint": args.student}
    nones = [pool.submit(full, f"none-{seed}", "student", {**student, "train.seed": seed}) for seed in args.seeds]
    teachers = args.work / "teachers"
    teachers.mkdir()
    for name, future in wave.items():
        shutil.copytree(future.result() / "models/trained", teachers / name)

    # 2. each configuration's teacher stage
    def settings_of(config: str, seed: int = 42) -> dict:
        settings = {**base, **student, **CONFIGS[config], "train.seed": seed}
        if settings.get("distill.fold_teachers") == "fold":
            settings["distill.fold_teachers"] = [f"models/own/fold-{k}" for k in range(args.folds)]
        return settings

    def prepare(config: str) -> Path:
        folder = project(args.work / config, settings_of(config))
        (folder / "models").mkdir()
        (folder / "models/own").symlink_to(teachers)
        seconds = stages(folder, ["download", "tokenize", "teacher"])
        print(f"{config}: teacher stage and data in {seconds:.0f} s", flush=True)
        return folder

    prepared = {config: pool.submit(prepare, config) for config in args.configs}

    # 3. the students, seed 42 of every configuration first
    def distil(config: str, seed: int) -> None:
        run = f"{config}-{seed}"
        folder = project(args.work / run, settings_of(config, seed), like=prepared[config].result())
        seconds = stages(folder, ["train", "evaluate"])
        with open(results, "a") as f:
            f.write(json.dumps(result(folder, run, "student", seconds)) + "\n")
        print(f"{run}: done in {seconds:.0f} s", flush=True)

    runs = [pool.submit(distil, config, seed) for seed in args.seeds for config in args.configs]
    with tarfile.open(args.out / "teachers.tar", "w") as tar:  # the logits, as soon as they exist
        for config in args.configs:
            tar.add(prepared[config].result() / "data/teacher", arcname=config)
    for future in [*nones, *runs]:
        future.result()
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    import pandas as pd

    pd.DataFrame(lines).drop(columns=["distillation"]).to_csv(args.out / "results.csv", index=False)
    print(pd.DataFrame(lines).drop(columns=["distillation"]).to_string(), flush=True)


if __name__ == "__main__":
    main()
