"""Side-by-side benchmark: the course's loop, transformers.Trainer and this project's train stage.

Each way tokenizes data/raw, trains the same checkpoint (models/pretrained) with the same epochs, batch size
and learning rate, and evaluates on validation, in its own subprocess (so peak RSS is its own). Reported per
way: train samples/s, wall seconds (tokenize + train + evaluate), peak RSS, validation accuracy and F1, and
the ratio of each to the course loop. The machine's dense matmul ceiling (fp32, bf16 GFLOP/s) is measured too,
and the project's training FLOP/s is reported as a fraction of it.

    python -m benchmarks.benchmark --mode short   # 40 optimizer steps per way, a few minutes
    python -m benchmarks.benchmark --mode full    # whole runs (3 epochs each)
    python -m benchmarks.benchmark --checkpoints sentence-transformers/all-MiniLM-L6-v2 \\
        sentence-transformers/all-mpnet-base-v2   # the project's stages on each checkpoint, same settings

The project's way calls the stages themselves (tokenize, train, evaluate on validation) in a temporary project
whose params are params.yaml with the benchmark's overrides, validated like params.yaml.
Needs data/raw and models/pretrained of GLUE MRPC (`dvc repro download` with params.yaml's data section as
committed); in a workspace whose params.yaml or data/raw hold another task it stops with one line saying what to
restore. Writes benchmarks/results.json and benchmarks/RESULTS.md (full mode) or benchmarks/results-short.json and
RESULTS-short.md (short mode); ``--checkpoints`` writes benchmarks/CHECKPOINTS.md and checkpoints.json.

This module is the command line; the ways are in benchmarks/baselines.py (the course's loop, transformers.Trainer)
and benchmarks/pipeline.py (the project's stages), the reports in side_by_side.py, ablation.py and checkpoints.py,
the matmul ceiling and FLOPs in machine.py, the workspace check in workspace.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.ablation import ablation
from benchmarks.baselines import course_loop, trainer
from benchmarks.checkpoints import CHECKPOINT_STEPS, compare_checkpoints
from benchmarks.machine import measure_ceiling
from benchmarks.pipeline import project
from benchmarks.side_by_side import HERE, WAYS, compare_ways
from benchmarks.workspace import check_workspace
from finetune.runtime import peak_memory_mb


def parser() -> argparse.ArgumentParser:
    """The command line: ``--mode``, ``--ways``, ``--checkpoints``, ``--out-dir``, ``--ablation``, and the internal
    options with which a subprocess runs one way (``--way``, ``--max-steps``, ``--overrides``, ``--checkpoint``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=["short", "full"], default="short")
    p.add_argument("--ways", nargs="+", choices=WAYS, default=WAYS)
    p.add_argument("--way", choices=WAYS, help=argparse.SUPPRESS)  # internal: run one way, print JSON
    p.add_argument("--max-steps", type=int, help=argparse.SUPPRESS)
    p.add_argument("--overrides", type=json.loads, help=argparse.SUPPRESS)
    p.add_argument("--checkpoint", help=argparse.SUPPRESS)  # internal: the project way on this checkpoint
    p.add_argument("--checkpoints", nargs="+", metavar="CHECKPOINT",
                   help=f"the project's stages on each checkpoint with the same settings, side by side "
                        f"({CHECKPOINT_STEPS} optimizer steps each; --mode full: whole runs)")
    p.add_argument("--out-dir", type=Path, default=HERE, help="where --checkpoints writes (default benchmarks/)")
    p.add_argument("--ablation", action="store_true",
                   help="short runs of the project's loop with each speed setting alone, then all together")
    return p


def run_one_way(args: argparse.Namespace) -> None:
    """Inside a way's subprocess: run ``args.way`` and print its result, with this process's peak RSS, as one JSON
    line (the last line of stdout, which ``run_way`` reads)."""
    if args.way == "project":
        result = project(args.max_steps, args.overrides, args.checkpoint)
    else:
        result = {"course_loop": course_loop, "trainer": trainer}[args.way](args.max_steps)
    print(json.dumps({**result, "peak_rss_mb": peak_memory_mb()}))


def main() -> None:
    args = parser().parse_args()
    problem = check_workspace()
    if problem:
        sys.exit(f"ERROR: python -m benchmarks.benchmark: {problem}")

    if args.way:
        run_one_way(args)
        return
    if args.ablation:
        ablation()
        return

    ceiling = measure_ceiling()
    print(f"matmul ceiling: {ceiling}", flush=True)
    if args.checkpoints:
        steps = args.max_steps or (CHECKPOINT_STEPS if args.mode == "short" else None)
        compare_checkpoints(args.checkpoints, steps, ceiling, args.out_dir)
        return
    compare_ways(args.ways, args.mode, ceiling)


if __name__ == "__main__":
    main()
