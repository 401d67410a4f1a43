"""The ways side by side: each way in a fresh Python process (so that peak RSS is its own), then per way train
samples/s, wall seconds (tokenize + train + evaluate), peak RSS MB, validation accuracy and F1, the ratio of each to
the course loop, and the training GFLOP/s as a fraction of the matmul ceiling. Writes benchmarks/results.json and
RESULTS.md (full mode) or results-short.json and RESULTS-short.md (short mode)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import date
from pathlib import Path

from benchmarks.machine import ceiling_line, machine, training_flops
from finetune.runtime import markdown_table

HERE = Path(__file__).parent
WAYS = ["course_loop", "trainer", "project"]
SHORT_STEPS = 40


def run_way(way: str, max_steps: int | None, overrides: dict | None = None, checkpoint: str | None = None) -> dict:
    """Run one way in a fresh Python process; its own peak RSS is added as ``peak_rss_mb``."""
    cmd = [sys.executable, "-m", "benchmarks.benchmark", "--way", way]
    cmd += ["--max-steps", str(max_steps)] if max_steps else []
    cmd += ["--overrides", json.dumps(overrides)] if overrides else []
    cmd += ["--checkpoint", checkpoint] if checkpoint else []
    print(f"== {way}: {' '.join(cmd)}", flush=True)
    out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def way_record(way: str, r: dict, base: dict | None, ceiling: dict) -> dict:
    """One way's row of results.json from its run ``r`` (``run_way``): samples/s, and against ``base`` (the course
    loop's run, if it ran) the ratios; for a way that counts real tokens, its training GFLOP/s, TFLOPs and fractions
    of the fp32 and bf16 ceilings (``training_flops`` with models/pretrained's shape)."""
    record = {"name": way, "samples_per_s": r["samples"] / r["train_seconds"], "wall_s": r["wall_s"],
              "peak_rss_mb": r["peak_rss_mb"], "accuracy": r["accuracy"], "f1": r["f1"], "steps": r["steps"],
              "train_seconds": r["train_seconds"]}
    if base:
        record["ratio_to_course_loop"] = record["samples_per_s"] / (base["samples"] / base["train_seconds"])
        record["wall_ratio_to_course_loop"] = r["wall_s"] / base["wall_s"]
    for key in ("padding_fraction", "settings"):
        if key in r:
            record[key] = r[key]
    if "real_tokens" in r:
        flops = training_flops(r["real_tokens"], r["real_tokens"] / r["samples"])
        record["train_gflops"] = flops / r["train_seconds"] / 1e9
        record["train_tflops"] = flops / 1e12
        record["fraction_of_fp32_ceiling"] = record["train_gflops"] / ceiling["fp32_gflops"]
        record["fraction_of_bf16_ceiling"] = (record["train_gflops"] / ceiling["bf16_gflops"]
                                              if ceiling["bf16_gflops"] else None)
    return record


def compare_ways(ways: list[str], mode: str, ceiling: dict) -> None:
    """Each of ``ways`` in its own subprocess, ``SHORT_STEPS`` optimizer steps (``mode`` short) or whole runs
    (full); writes results{,-short}.json and RESULTS{,-short}.md to benchmarks/ and prints the Markdown."""
    max_steps = SHORT_STEPS if mode == "short" else None
    results = {way: run_way(way, max_steps) for way in ways}
    base = results.get("course_loop")
    records = [way_record(way, r, base, ceiling) for way, r in results.items()]
    suffix = "" if mode == "full" else "-short"
    command = "python -m benchmarks.benchmark --mode " + mode + ("" if ways == WAYS else " --ways " + " ".join(ways))
    (HERE / f"results{suffix}.json").write_text(json.dumps(
        {"mode": mode, "command": command, "date": date.today().isoformat(), "machine": machine(),
         "matmul_ceiling": ceiling, "ways": records}, indent=2) + "\n")
    (HERE / f"RESULTS{suffix}.md").write_text(report(records, ceiling, mode, command))
    print((HERE / f"RESULTS{suffix}.md").read_text())


def report(records: list[dict], ceiling: dict, mode: str, command: str) -> str:
    """The Markdown table of RESULTS.md."""
    info = machine()
    lines = [f"# Benchmark ({mode} mode)", "",
             f"Command: `{command}`  ", f"Date: {date.today().isoformat()}  ",
             f"Machine: {info['cpu']}, {info['cores']} threads, torch {info['torch']}"
             + (f", {info['gpu']}" if "gpu" in info else ""),
             "", markdown_table(
                 ["way", "train samples/s", "wall s", "peak RSS MB", "val accuracy", "val F1", "samples/s ratio",
                  "wall ratio"],
                 [[r["name"], f"{r['samples_per_s']:.1f}", f"{r['wall_s']:.0f}", f"{r['peak_rss_mb']:.0f}",
                   f"{r['accuracy']:.4f}", f"{r['f1']:.4f}", f"{r['ratio_to_course_loop']:.2f}x",
                   f"{r['wall_ratio_to_course_loop']:.2f}"] for r in records]).rstrip()]
    lines += ["", ceiling_line(ceiling)]
    for r in records:
        if "train_tflops" in r:
            bf16 = (f", {100 * r['fraction_of_bf16_ceiling']:.0f} % of bf16" if r.get("fraction_of_bf16_ceiling")
                    else "")
            lines.append(f"{r['name']}: training at {r['train_gflops']:.1f} GFLOP/s = "
                         f"{100 * r['fraction_of_fp32_ceiling']:.0f} % "
                         f"of the fp32 ceiling{bf16} (6 × non-embedding parameters × real tokens + attention).")
    project_settings = next((r.get("settings") for r in records if r["name"] == "project"), None)
    if project_settings:
        lines += ["", f"Project settings (params.yaml): `{json.dumps(project_settings)}`"]
    return "\n".join(lines) + "\n"
