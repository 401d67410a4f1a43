"""What a training run records and reports: each optimizer step's loss and learning rate (``record_step``: the
run's state, the progress bar, DVCLive), each evaluation (``evaluation_entry``, ``record_evaluation``: the log line,
the collapse check, DVCLive), the log lines of the setup, a resume and early stopping, and metrics/train.json
(``train_metrics``). The functions read the ``FineTuneRecipe`` (or its state) they are given; the ``record_*`` ones
add to its state. DVCLive's files are ``finetune.train.live``'s.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from tqdm.auto import tqdm

from finetune.distill.loss import Distillation, Teacher
from finetune.evaluate.collapse import collapse_check, end_of_run, note_evaluation
from finetune.hardware import describe_device, numerics
from finetune.params import DistillParams
from finetune.runtime import peak_memory_mb
from finetune.tasks import predictions_of
from finetune.train.live import TrainLog
from finetune.train.resume import RunState

if TYPE_CHECKING:  # the recipe imports this module; its class is needed for the annotations only
    from pathlib import Path

    from finetune.train.recipe import FineTuneRecipe

log = logging.getLogger(__name__)


def log_setup(recipe: FineTuneRecipe, threads: int) -> None:
    """One line for the run's length, processes, batches, precision, learning rate and schedule; ``threads``: the
    CPU threads in use (``set_cpu_threads``)."""
    p, schedule, accelerator = recipe.p, recipe.schedule, recipe.accelerator
    log.info("Training up to %d optimizer steps (%d epochs of %d) on %d process(es) (%s), batch %d x %d "
             "accumulation, mixed precision %s, lr %g, %s schedule%s, %d warmup steps, %s head, %d CPU threads",
             schedule.total_steps, schedule.epochs, schedule.steps_per_epoch, accelerator.num_processes,
             accelerator.device, p.batch_size, p.gradient_accumulation_steps, recipe.mixed_precision, p.lr,
             p.scheduler, f" {p.scheduler_kwargs}" if p.scheduler_kwargs else "", schedule.warmup_steps,
             recipe.params.model.pooling, threads)


def log_distillation(d: DistillParams, teacher: Teacher, train_rows: int) -> None:
    """One line for the distillation loss on ``teacher``'s logits; ``train_rows``: rows of the train split, transfer
    pairs included."""
    log.info("Distilling from %s (%s): loss = %g x hard + %g x soft, temperature %g%s", d.teacher,
             teacher.identity["model_type"], 1 - d.alpha, d.alpha, d.temperature,
             "" if teacher.transfer is None else f"; {len(teacher.transfer)} transfer pairs among the "
             f"{train_rows} train rows, their loss {d.transfer.weight:g} x soft")


def log_resume(state: RunState, steps_per_epoch: int, checkpoint: Path) -> None:
    """One line for a run resumed from ``checkpoint`` at ``state``: its step and where in its epoch."""
    into = state.step - state.epoch * steps_per_epoch
    log.info("Resuming from step %d (epoch %d done%s) from %s", state.step, state.epoch,
             f", {into} steps into epoch {state.epoch + 1}" if into else "", checkpoint)


@contextlib.contextmanager
def open_logs(recipe: FineTuneRecipe) -> Iterator[tuple[TrainLog, tqdm]]:
    """The run's DVCLive logs (``TrainLog.open``: written by the main process, replaced on exit; a resumed run's
    steps and evaluations replayed into them) and its progress bar, from ``state.step`` on."""
    state, schedule, accelerator = recipe.state, recipe.schedule, recipe.accelerator
    with TrainLog.open(recipe.paths.train_logs, accelerator.is_main_process, recipe.p.log_every,
                       schedule.total_steps, recipe.unit) as logs:
        logs.replay(state.losses, state.lrs, state.evaluations, state.loss_parts)
        yield logs, tqdm(total=schedule.total_steps, initial=state.step, desc="train", unit="step",
                         disable=not accelerator.is_local_main_process)


def record_batch(state: RunState, batch: dict, num_processes: int) -> None:
    """Count one training ``batch`` (``attention_mask`` ``[batch, seq_len]``) into ``state``'s samples (all
    processes) and this process's real and padded tokens."""
    state.samples += batch["labels"].shape[0] * num_processes
    state.real_tokens += int(batch["attention_mask"].sum())
    state.padded_tokens += batch["attention_mask"].numel()


def record_step(recipe: FineTuneRecipe, epoch: int, losses: list[float], parts: dict[str, list[float]]) -> None:
    """Record the optimizer step ``recipe.state.step`` of ``epoch``: the mean of its batches' ``losses`` (and of
    each of distillation's loss ``parts``) and the learning rate into the state, then the progress bar and DVCLive."""
    state = recipe.state
    state.losses.append(sum(losses) / len(losses))
    state.lrs.append(recipe.scheduler.get_last_lr()[0])
    for name, values in parts.items():
        state.loss_parts.setdefault(name, []).append(finite_mean(values))
    recipe.progress.update(1)
    recipe.progress.set_postfix(epoch=epoch, loss=f"{state.losses[-1]:.4f}", lr=f"{state.lrs[-1]:.2e}")
    recipe.logs.log_step(state.step, state.losses, state.lrs, state.loss_parts)


def evaluation_entry(state: RunState, validation: dict[str, float], steps_per_epoch: int) -> dict:
    """The evaluation at ``state.step``, for ``state.evaluations``: ``epoch`` (in progress), ``step``, the mean
    ``train/loss`` (and distillation's loss parts) since the previous evaluation, and ``validation/<metric>``."""
    since = state.evaluations[-1]["step"] if state.evaluations else 0  # the steps since the previous evaluation
    parts = {name: values[since:] for name, values in state.loss_parts.items()}  # distillation's
    losses = state.losses[since:]
    return {"epoch": math.ceil(state.step / steps_per_epoch), "step": state.step,
            "train/loss": sum(losses) / len(losses),
            **{name: finite_mean(values) for name, values in parts.items()},
            **{f"validation/{name}": value for name, value in validation.items()}}


def record_evaluation(recipe: FineTuneRecipe, entry: dict, validation: dict[str, float], logits: torch.Tensor,
                      improved: bool) -> None:
    """Report the evaluation ``entry`` (its ``validation`` metrics; ``logits`` ``[rows, num_labels]`` of the
    validation split; ``improved``: the best so far): its log line, the collapse check (a collapse noted in
    ``state.collapsed``), DVCLive."""
    task, unit = recipe.task, recipe.unit
    log_evaluation(recipe, entry, validation, improved)
    report = collapse_check(task, validation, predictions_of(logits, task), recipe.baseline)
    about = note_evaluation(entry[unit], task, validation, report, unit)
    if about is not None:
        recipe.state.collapsed[str(entry[unit])] = about
    recipe.logs.log_evaluation(entry)


def log_evaluation(recipe: FineTuneRecipe, entry: dict, validation: dict[str, float], improved: bool) -> None:
    """One line for the evaluation ``entry``: where the run is, its train loss (and loss parts), the validation
    metrics beside the constant baseline, and whether it is the best so far."""
    state, schedule, main = recipe.state, recipe.schedule, recipe.task.metrics[0]
    scores = ", ".join(f"{name} {value:.4f}" for name, value in validation.items())
    where = (f"Epoch {state.epoch}/{schedule.epochs}" if recipe.unit == "epoch" else
             f"Step {state.step}/{schedule.total_steps} (epoch {entry['epoch']})")
    parts = [name for name in entry if name in state.loss_parts]
    log.info("%s: train loss %.4f%s | validation %s (constant baseline: %s %.4f)%s", where, entry["train/loss"],
             "".join(f", {name.removeprefix('train/').replace('_', ' ')} {entry[name]:.4f}" for name in parts),
             scores, main, recipe.baseline[main],
             f" | best {recipe.metric_for_best} so far" if improved else
             f" | no improvement for {recipe.stopping.bad_evaluations} evaluation(s)")


def stopped_early(recipe: FineTuneRecipe) -> bool:
    """Early stopping ended the run before its last step."""
    return recipe.stopping.should_stop and recipe.state.step < recipe.schedule.total_steps


def log_early_stopping(recipe: FineTuneRecipe) -> None:
    """One line when early stopping ended the run before its last step: where, and the best evaluation."""
    if not stopped_early(recipe):
        return
    state, stopping, unit = recipe.state, recipe.stopping, recipe.unit
    log.info("Early stopping at step %d (epoch %d): %s did not improve for %d evaluations (best %.4f, %s %d)",
             state.step, math.ceil(state.step / recipe.schedule.steps_per_epoch), recipe.metric_for_best,
             stopping.bad_evaluations, stopping.best, unit,
             stopping.best_step if unit == "step" else stopping.best_epoch)


def kept_evaluation(recipe: FineTuneRecipe) -> dict:
    """The entry of ``state.evaluations`` whose model is kept: the best with ``keep_best``, else the last."""
    if recipe.p.keep_best:
        return next(e for e in recipe.state.evaluations if e["step"] == recipe.stopping.best_step)
    return recipe.state.evaluations[-1]


def log_kept_model(recipe: FineTuneRecipe) -> None:
    """One line for the kept model copied to ``paths.trained``: its epoch or step."""
    unit = recipe.unit
    log.info("Saved the model of %s %d to %s", unit, kept_evaluation(recipe)[unit], recipe.paths.trained)


def train_metrics(recipe: FineTuneRecipe) -> dict:
    """metrics/train.json of the finished run.

    Returns:
        Besides the self-named keys: ``final_loss`` (train loss since the evaluation before the last),
        ``mean_loss`` (all steps), ``steps`` (optimizer steps), ``best_validation_<metric_for_best>`` (of the kept
        evaluation), ``train_seconds`` (optimizer steps only), ``wall_seconds`` (since the recipe was made),
        ``peak_memory_mb`` (peak RSS, MiB), ``padding_fraction`` (padding / all train tokens), ``collapse`` (the
        collapse verdict on the kept evaluation, ``finetune.evaluate.collapse.end_of_run``, logged here); optional
        ``compile_seconds``, ``distillation`` (``distillation_metrics``), ``peak_gpu_memory_mb`` (MiB).
    """
    wall_seconds = time.perf_counter() - recipe.start
    state, kept, last, unit = recipe.state, kept_evaluation(recipe), recipe.state.evaluations[-1], recipe.unit
    collapse = end_of_run(state.collapsed, len(state.evaluations), kept[unit], unit)  # logged
    device = recipe.accelerator.device
    metrics = {
        "final_loss": round(last["train/loss"], 4),
        "mean_loss": round(sum(state.losses) / len(state.losses), 4),
        "steps": state.step,
        "epochs": math.ceil(state.step / recipe.schedule.steps_per_epoch),
        "evaluations": len(state.evaluations),
        "best_epoch": kept["epoch"],
        "best_step": kept["step"],
        f"best_validation_{recipe.metric_for_best}": round(kept[f"validation/{recipe.metric_for_best}"], 4),
        "stopped_early": stopped_early(recipe),
        "pruned": recipe.pruned,
        "resumed_from_step": recipe.resumed_from,
        "train_samples": state.samples,
        "train_seconds": round(state.train_seconds, 1),
        "samples_per_second": round(state.samples / state.train_seconds, 2),
        "wall_seconds": round(wall_seconds, 1),
        "peak_memory_mb": peak_memory_mb(),
        "parameters": recipe.parameters,
        "padding_fraction": round(1 - state.real_tokens / state.padded_tokens, 4),
        "real_tokens": state.real_tokens,
        "mixed_precision": recipe.mixed_precision,
        "device": describe_device(device),
        "numerics": numerics(device, recipe.mixed_precision),
        "validation_baseline": recipe.baseline,
        "collapse": collapse,
    }
    if recipe.compile_seconds is not None:
        metrics["compile_seconds"] = round(recipe.compile_seconds, 1)
    if recipe.distill is not None:
        metrics["distillation"] = distillation_metrics(recipe.distill, last)
    if torch.cuda.is_available():
        metrics["peak_gpu_memory_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return metrics


def distillation_metrics(distill: Distillation, last: dict) -> dict:
    """train.json's ``distillation`` (``last`` is the last evaluation); its ``transfer`` (``rows``, ``kind``,
    ``weight``) is None without a transfer set."""
    transfer = distill.teacher.get("transfer")  # teacher.json's record of the transfer set, or None
    return {"teacher": distill.teacher["teacher"], "teacher_model_type": distill.teacher["model_type"],
            "alpha": distill.alpha, "temperature": distill.temperature,
            "final_hard_loss": round(last["train/hard_loss"], 4),
            "final_soft_loss": round(last["train/soft_loss"], 4),
            "transfer": transfer and {"rows": transfer["rows"], "kind": transfer["params"]["kind"],
                                      "weight": distill.transfer_weight}}


def finite_mean(values: list[float]) -> float:
    """The mean of the non-NaN ``values``; NaN when none is (a batch of transfer rows alone has no hard loss)."""
    kept = [v for v in values if not math.isnan(v)]
    return sum(kept) / len(kept) if kept else math.nan
