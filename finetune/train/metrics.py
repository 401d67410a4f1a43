"""The train stage's metrics/train.json, from a finished run."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from finetune.hardware import describe_device, numerics
from finetune.runtime import peak_memory_mb
from finetune.train.resume import RunState
from finetune.train.run import Run


def final_metrics(run: Run, state: RunState, kept: dict, stopping: EarlyStopping, collapse: dict,
                  wall_seconds: float) -> dict:
    """metrics/train.json of a finished run; ``kept`` is the kept evaluation, ``collapse`` the collapse verdict.

    Returns:
        Besides the self-named keys: ``final_loss`` (train loss since the evaluation before the last), ``mean_loss``
        (all steps), ``steps`` (optimizer steps), ``best_validation_<metric_for_best>`` (of ``kept``),
        ``train_seconds`` (optimizer steps only), ``wall_seconds`` (the whole ``train`` call), ``peak_memory_mb``
        (peak RSS, MiB), ``padding_fraction`` (padding / all train tokens); optional ``compile_seconds``,
        ``distillation`` (``distillation_metrics``), ``peak_gpu_memory_mb`` (MiB).
    """
    last = state.evaluations[-1]
    metrics = {
        "final_loss": round(last["train/loss"], 4),
        "mean_loss": round(sum(state.losses) / len(state.losses), 4),
        "steps": state.step,
        "epochs": math.ceil(state.step / run.schedule.steps_per_epoch),
        "evaluations": len(state.evaluations),
        "best_epoch": kept["epoch"],
        "best_step": kept["step"],
        f"best_validation_{run.metric_for_best}": round(kept[f"validation/{run.metric_for_best}"], 4),
        "stopped_early": stopping.should_stop and state.step < run.schedule.total_steps,
        "pruned": run.pruned,
        "resumed_from_step": run.resumed_from,
        "train_samples": state.samples,
        "train_seconds": round(state.train_seconds, 1),
        "samples_per_second": round(state.samples / state.train_seconds, 2),
        "wall_seconds": round(wall_seconds, 1),
        "peak_memory_mb": peak_memory_mb(),
        "parameters": run.parameters,
        "padding_fraction": round(1 - state.real_tokens / state.padded_tokens, 4),
        "real_tokens": state.real_tokens,
        "mixed_precision": run.mixed_precision,
        "device": describe_device(run.accelerator.device),
        "numerics": numerics(run.accelerator.device, run.mixed_precision),
        "validation_baseline": run.baseline,
        "collapse": collapse,
    }
    if run.compile_seconds is not None:
        metrics["compile_seconds"] = round(run.compile_seconds, 1)
    if run.distill is not None:
        metrics["distillation"] = distillation_metrics(run, last)
    if torch.cuda.is_available():
        metrics["peak_gpu_memory_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return metrics


def distillation_metrics(run: Run, last: dict) -> dict:
    """train.json's ``distillation``; its ``transfer`` (``rows``, ``kind``, ``weight``) is None without a transfer
    set."""
    transfer = run.distill.teacher.get("transfer")  # teacher.json's record of the transfer set, or None
    return {"teacher": run.distill.teacher["teacher"], "teacher_model_type": run.distill.teacher["model_type"],
            "alpha": run.distill.alpha, "temperature": run.distill.temperature,
            "final_hard_loss": round(last["train/hard_loss"], 4), "final_soft_loss": round(last["train/soft_loss"], 4),
            "transfer": transfer and {"rows": transfer["rows"], "kind": transfer["params"]["kind"],
                                      "weight": run.distill.transfer_weight}}


@dataclass
class EarlyStopping:
    """Early stopping on a validation metric, like transformers' ``EarlyStoppingCallback``.

    Args:
        mode: 'max' (accuracy, F1) or 'min' (loss).
        patience: evaluations in a row without improvement before stopping; None: never.
        threshold: an improvement must beat the best by more than this.
    """

    mode: str
    patience: int | None = None
    threshold: float = 0.0
    best: float | None = None
    best_epoch: int = 0
    best_step: int = 0
    bad_evaluations: int = 0

    def update(self, value: float, epoch: int, step: int = 0) -> bool:
        """Record an evaluation's ``value``; True when it is a new best."""
        sign = 1 if self.mode == "max" else -1
        if self.best is None or sign * (value - self.best) > self.threshold:
            self.best, self.best_epoch, self.best_step, self.bad_evaluations = value, epoch, step, 0
            return True
        self.bad_evaluations += 1
        return False

    @property
    def should_stop(self) -> bool:
        return self.patience is not None and self.bad_evaluations >= self.patience
