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
    """The run's metrics/train.json.

    ``final_loss`` (mean train loss since the second-to-last evaluation: over the last epoch by default),
    ``mean_loss`` (over all steps), ``steps`` (optimizer steps), ``epochs`` (epochs run, the last maybe in part),
    ``evaluations`` (validations run), ``best_epoch``, ``best_step`` and ``best_validation_<metric>`` (the kept
    evaluation ``kept``, by ``metric_for_best``), ``stopped_early``, ``pruned`` (a search's pruner stopped the run:
    ``finetune.train.trial``), ``resumed_from_step`` (0: a fresh run),
    ``train_samples`` (examples seen), ``train_seconds`` (wall seconds of the optimisation steps, validation and
    checkpoints excluded), ``samples_per_second`` (train samples/s), ``wall_seconds`` (the whole call: loading,
    training, validation, saving), ``peak_memory_mb`` (peak RSS, MiB; on GPU also ``peak_gpu_memory_mb``),
    ``parameters``, ``padding_fraction`` (padding / all tokens of the training batches), ``real_tokens``,
    ``mixed_precision``, ``device`` (``describe_device``), ``numerics`` (what decides the last digits: CPU vendor and
    model, threads, matmul and vector instructions; ``finetune.hardware.numerics``), ``validation_baseline`` (the
    constant model of train's labels scored on validation: ``finetune.evaluate.collapse.constant_baseline``), ``collapse``
    (``collapse_check``'s verdict over the evaluations: ``finetune.evaluate.collapse.end_of_run``), with ``torch_compile``
    ``compile_seconds``, and with distillation ``distillation`` (``distillation_metrics``).
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
    """train.json's ``distillation``: the teacher (``distill.teacher``) and its model type, ``alpha``,
    ``temperature``, the last evaluation's (``last``) mean ``final_hard_loss`` and ``final_soft_loss``, and
    ``transfer`` (its ``rows``, ``kind`` and ``weight``, or None)."""
    transfer = run.distill.teacher.get("transfer")  # teacher.json's record of the transfer set, or None
    return {"teacher": run.distill.teacher["teacher"], "teacher_model_type": run.distill.teacher["model_type"],
            "alpha": run.distill.alpha, "temperature": run.distill.temperature,
            "final_hard_loss": round(last["train/hard_loss"], 4), "final_soft_loss": round(last["train/soft_loss"], 4),
            "transfer": transfer and {"rows": transfer["rows"], "kind": transfer["params"]["kind"],
                                      "weight": run.distill.transfer_weight}}


@dataclass
class EarlyStopping:
    """Track a validation metric across evaluations: is this one the best so far, and is it time to stop?

    ``mode`` 'max' for accuracy/F1, 'min' for loss. An evaluation improves when it beats the best by more than
    ``threshold``; training stops after ``patience`` evaluations in a row without improvement (None: never),
    like transformers' ``EarlyStoppingCallback``.
    """

    mode: str
    patience: int | None = None
    threshold: float = 0.0
    best: float | None = None
    best_epoch: int = 0
    best_step: int = 0
    bad_evaluations: int = 0

    def update(self, value: float, epoch: int, step: int = 0) -> bool:
        """Record ``value`` of the evaluation at optimizer step ``step`` of ``epoch``; True when it is a new best."""
        sign = 1 if self.mode == "max" else -1
        if self.best is None or sign * (value - self.best) > self.threshold:
            self.best, self.best_epoch, self.best_step, self.bad_evaluations = value, epoch, step, 0
            return True
        self.bad_evaluations += 1
        return False

    @property
    def should_stop(self) -> bool:
        return self.patience is not None and self.bad_evaluations >= self.patience
