"""Speed settings one at a time: the project's loop with the course's settings (batch 8, lr 5e-5, linear schedule
without warmup, no weight decay, fp32, random batches, default AdamW), then each speed setting alone, then all but
torch.compile, ``SHORT_STEPS`` optimizer steps each.
Writes benchmarks/ABLATION.md (train samples/s, ratio to the course settings, padding fraction, train seconds)."""

from __future__ import annotations

from datetime import date
from pathlib import Path

from benchmarks.machine import machine
from benchmarks.side_by_side import SHORT_STEPS, run_way
from finetune.runtime import markdown_table

HERE = Path(__file__).parent

# The course's settings in the project's loop, then each speed setting alone, then all of them.
COURSE_SETTINGS = {"train": {"batch_size": 8, "lr": 5e-5, "weight_decay": 0.0, "scheduler": "linear",
                             "warmup_steps": 0, "warmup_ratio": 0.0, "keep_best": False, "mixed_precision": "no",
                             "group_by_length": False, "adamw_impl": "default", "torch_compile": False,
                             "num_threads": None},
                   "evaluate": {"batch_size": 8, "sort_by_length": False}}
ABLATION = {
    "course settings": {},
    "length-grouped batches": {"train": {"group_by_length": True}},
    "bf16 autocast": {"train": {"mixed_precision": "bf16"}},
    "fused AdamW": {"train": {"adamw_impl": "fused"}},
    "batch 32": {"train": {"batch_size": 32}},
    "torch.compile": {"train": {"torch_compile": True}},
    "1 thread": {"train": {"num_threads": 1}},
    "all but compile": {"train": {"group_by_length": True, "mixed_precision": "bf16", "adamw_impl": "fused",
                                  "batch_size": 32}},
}


def ablation() -> None:
    """Short runs (SHORT_STEPS optimizer steps) of each ABLATION variant; writes benchmarks/ABLATION.md."""
    rows = []
    for name, change in ABLATION.items():
        overrides = {section: {**COURSE_SETTINGS[section], **change.get(section, {})} for section in COURSE_SETTINGS}
        r = run_way("project", SHORT_STEPS, overrides)
        rows.append((name, r["samples"] / r["train_seconds"], r["padding_fraction"], r["train_seconds"]))
        print(rows[-1], flush=True)
    base = rows[0][1]
    lines = ["# Speed settings, one at a time (short mode)", "",
             "Command: `python -m benchmarks.benchmark --ablation`  ", f"Date: {date.today().isoformat()}  ",
             f"Machine: {machine()['cpu']}, {machine()['cores']} threads", "",
             f"The project's loop with the course's settings (batch 8, lr 5e-5, linear without warmup, no weight "
             f"decay, fp32, random batches, default AdamW), then each "
             f"setting alone, then all but torch.compile; {SHORT_STEPS} optimizer steps each, train samples/s.", "",
             markdown_table(["variant", "train samples/s", "ratio", "padding fraction", "train s"],
                            [[n, f"{sps:.1f}", f"{sps / base:.2f}x", f"{pad:.3f}", f"{sec:.1f}"]
                             for n, sps, pad, sec in rows])]
    (HERE / "ABLATION.md").write_text("\n".join(lines))
    print((HERE / "ABLATION.md").read_text())
