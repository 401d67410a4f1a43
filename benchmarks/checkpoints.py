"""Checkpoints side by side (``--checkpoints``): each through the project's stages with the same settings, one
subprocess each; writes CHECKPOINTS.md and checkpoints.json (default to benchmarks/)."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

from benchmarks.machine import ceiling_line, machine, training_flops
from benchmarks.side_by_side import run_way
from finetune.runtime import markdown_table

HERE = Path(__file__).parent

# The base-size runs' recipe (the course's: batch 8, lr 5e-5, linear, no warmup) with the project's speed settings.
CHECKPOINT_SETTINGS = {"train": {"batch_size": 8, "lr": 5e-5, "scheduler": "linear", "warmup_ratio": 0.0}}
CHECKPOINT_STEPS = 200


def checkpoint_record(checkpoint: str, r: dict) -> dict:
    """One checkpoint's row of checkpoints.json from its project run ``r`` (``run_way``): its shape, steps, samples,
    train seconds, samples/s, peak RSS MB, real tokens, training GFLOP/s and the settings it ran with."""
    return {"checkpoint": checkpoint, **r["shape"], "steps": r["steps"], "samples": r["samples"],
            "train_seconds": r["train_seconds"], "samples_per_s": r["samples_per_second"],
            "peak_rss_mb": r["peak_rss_mb"], "real_tokens": r["real_tokens"],
            # FLOPs per sample x samples/s: train_seconds is rounded to 0.1 s, too coarse for short runs
            "train_gflops": training_flops(r["real_tokens"], r["real_tokens"] / r["samples"], r["shape"])
            / r["samples"] * r["samples_per_second"] / 1e9, "settings": r["settings"]}


def compare_checkpoints(checkpoints: list[str], max_steps: int | None, ceiling: dict, out_dir: Path = HERE) -> None:
    """Each checkpoint through the project's stages with the same settings (CHECKPOINT_SETTINGS), one subprocess
    each, ``max_steps`` optimizer steps (None: whole runs); writes CHECKPOINTS.md and checkpoints.json to ``out_dir``.

    Reported per checkpoint: train seconds, train samples/s, peak RSS, training GFLOP/s and, against the first
    checkpoint, the measured time per sample and the ratio of training FLOPs per sample expected from the shapes
    (``training_flops`` at the same tokens: the first checkpoint's real-token count and mean length).
    """
    records = [checkpoint_record(c, run_way("project", max_steps, CHECKPOINT_SETTINGS, c)) for c in checkpoints]
    first = records[0]
    tokens, mean_length = first["real_tokens"], first["real_tokens"] / first["samples"]
    for r in records:
        r["expected_flops_ratio"] = training_flops(tokens, mean_length, r) / training_flops(tokens, mean_length, first)
        r["measured_time_ratio"] = first["samples_per_s"] / r["samples_per_s"]
    info = machine()
    command = "python -m benchmarks.benchmark --checkpoints " + " ".join(checkpoints) + (
        " --mode full" if max_steps is None else "")
    (out_dir / "checkpoints.json").write_text(json.dumps(
        {"command": command, "date": date.today().isoformat(), "machine": info, "matmul_ceiling": ceiling,
         "checkpoints": records}, indent=2) + "\n")
    (out_dir / "CHECKPOINTS.md").write_text(checkpoints_report(records, max_steps, ceiling, info, command))
    print((out_dir / "CHECKPOINTS.md").read_text())


def checkpoints_report(records: list[dict], max_steps: int | None, ceiling: dict, info: dict, command: str) -> str:
    """The Markdown of CHECKPOINTS.md: command, date, machine, the shared settings, one row per checkpoint, the
    matmul ceiling."""
    lines = [f"# Checkpoints side by side ({'whole runs' if max_steps is None else f'{max_steps} optimizer steps'})",
             "", f"Command: `{command}`  ", f"Date: {date.today().isoformat()}  ",
             f"Machine: {info['cpu']}, {info['cores']} threads, torch {info['torch']}, CPU flags: "
             f"{info['bf16_flags'] or 'no bf16 instructions'}", "",
             f"Settings, the same for each: `{json.dumps(records[0]['settings'])}`", "",
             markdown_table(["checkpoint", "type", "layers × hidden", "parameters", "train s", "train samples/s",
                             "peak RSS MB", "GFLOP/s", "FLOPs per sample, expected ratio",
                             "time per sample, measured ratio"],
                            [[r["checkpoint"], r["model_type"], f"{r['layers']} × {r['hidden']}",
                              f"{r['parameters'] / 1e6:.1f} M", f"{r['train_seconds']:.0f}",
                              f"{r['samples_per_s']:.1f}",
                              f"{r['peak_rss_mb']:.0f}", f"{r['train_gflops']:.0f}", f"{r['expected_flops_ratio']:.2f}",
                              f"{r['measured_time_ratio']:.2f}"] for r in records]).rstrip(), "",
             ceiling_line(ceiling)]
    return "\n".join(lines) + "\n"
