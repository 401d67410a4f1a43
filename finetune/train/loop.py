"""The training loop of the Hugging Face course's "A full training" (https://huggingface.co/learn/llm-course/chapter3/4)
on Accelerate: epochs of optimizer steps, evaluations, early stopping, the kept model and checkpoints.
"""

from __future__ import annotations

import logging
import math
import shutil
import time
from dataclasses import asdict, replace

import torch
from accelerate import Accelerator
from accelerate.utils import broadcast_object_list
from tqdm.auto import tqdm

from finetune.evaluate.collapse import collapse_check, end_of_run, note_evaluation
from finetune.evaluate.evaluation import evaluate_split, load_metric
from finetune.params import Params
from finetune.paths import Paths
from finetune.runtime import atomic_dir
from finetune.tasks import Task, predictions_of
from finetune.train.live import TrainLog
from finetune.train.metrics import EarlyStopping, final_metrics
from finetune.train.resume import RunState, last_checkpoint, load_checkpoint, save_checkpoint
from finetune.train.run import Run, build_run
from finetune.train.trial import trial_from_env

log = logging.getLogger(__name__)


def train(params: Params, paths: Paths) -> dict:
    """Fine-tune ``paths.pretrained`` on ``paths.tokenized``'s train split; returns metrics/train.json's content.
    Reads ``pretrained``, ``tokenized``, ``teacher``; writes ``trained``, ``checkpoints``, ``train_logs``.

    Raises:
        CheckpointError: ``paths.pretrained`` lacks config, weights or tokenizer, or has a head of another size; or
            a checkpoint could not be written (the disk is full).
        ParamsError: ``train.metric_for_best`` is not a metric of the data's task, or ``train.scheduler_kwargs`` does
            not fit ``train.scheduler``.
        TeacherError: with ``distill.teacher``, the teacher's logits do not fit the task or the train split.
    """
    start = time.perf_counter()
    run = build_run(params, paths)
    run.trial = trial_from_env(run.metric_for_best) if run.accelerator.is_main_process else None
    state, stopping = start_or_resume(run, paths)
    with TrainLog.open(paths.train_logs, run.accelerator.is_main_process, run.p.log_every,
                       run.schedule.total_steps, run.unit) as logs:
        logs.replay(state.losses, state.lrs, state.evaluations, state.loss_parts)
        progress = tqdm(total=run.schedule.total_steps, initial=state.step, desc="train", unit="step",
                        disable=not run.accelerator.is_local_main_process)
        while state.step < run.schedule.total_steps and not stopping.should_stop and not run.pruned:
            train_epoch(run, state, stopping, logs, progress, paths)
        progress.close()
        save_kept_model(run, state, stopping, paths)
    kept = kept_evaluation(run, state, stopping)
    collapse = end_of_run(state.collapsed, len(state.evaluations), kept[run.unit], run.unit)
    return final_metrics(run, state, kept, stopping, collapse, time.perf_counter() - start)


def start_or_resume(run: Run, paths: Paths) -> tuple[RunState, EarlyStopping]:
    """``(state, stopping)``: fresh, or with ``train.resume`` the newest checkpoint's of ``run.fingerprint`` (one saved
    before the first evaluation holds no early-stopping record: it resumes with a fresh one). Starting fresh deletes
    the checkpoints of other runs (main process)."""
    p = run.p
    stopping = EarlyStopping(mode=run.task.metric_for_best(run.metric_for_best)[1],
                             patience=p.early_stopping_patience, threshold=p.early_stopping_threshold)
    checkpoint = last_checkpoint(paths.checkpoints, run.fingerprint) if p.resume else None
    if checkpoint is None:
        if run.accelerator.is_main_process:
            shutil.rmtree(paths.checkpoints, ignore_errors=True)
        return RunState(run.fingerprint, stopping=asdict(stopping)), stopping
    state = load_checkpoint(run.accelerator, checkpoint)
    run.resumed_from = state.step
    into = state.step - state.epoch * run.schedule.steps_per_epoch
    log.info("Resuming from step %d (epoch %d done%s) from %s", state.step, state.epoch,
             f", {into} steps into epoch {state.epoch + 1}" if into else "", checkpoint)
    return state, replace(stopping, **state.stopping)  # a checkpoint from before the first evaluation may hold {}


def train_epoch(run: Run, state: RunState, stopping: EarlyStopping, logs: TrainLog, progress: tqdm,
                paths: Paths) -> None:
    """Run (the rest of) epoch ``state.epoch + 1`` with its evaluations and checkpoints, until it ends or the run,
    early stopping or a search's pruner stops; the batch order is seeded by ``train.seed + epoch``."""
    p, accelerator, schedule = run.p, run.accelerator, run.schedule
    epoch = state.epoch + 1
    done = state.step - state.epoch * schedule.steps_per_epoch  # steps of this epoch taken before a resume
    run.batch_order.manual_seed(p.seed + epoch)
    batches = accelerator.skip_first_batches(run.train_dl, done * p.gradient_accumulation_steps) if done else \
        run.train_dl
    run.model.train()
    micro_losses, micro_parts = [], {}  # of the batches of this optimizer step (distillation: hard and soft loss)
    tick = time.perf_counter()
    for batch in batches:
        step_start = time.perf_counter()
        micro_losses.append(train_batch(run, batch, micro_parts))
        state.samples += batch["labels"].shape[0] * accelerator.num_processes
        state.real_tokens += int(batch["attention_mask"].sum())
        state.padded_tokens += batch["attention_mask"].numel()
        if not accelerator.sync_gradients:
            continue
        run.scheduler.step()
        state.step += 1
        if state.step == 1 and p.torch_compile:
            run.compile_seconds = time.perf_counter() - step_start
        state.losses.append(sum(micro_losses) / len(micro_losses))
        state.lrs.append(run.scheduler.get_last_lr()[0])
        for name, values in micro_parts.items():
            state.loss_parts.setdefault(name, []).append(finite_mean(values))
        micro_losses, micro_parts = [], {}
        progress.update(1)
        progress.set_postfix(epoch=epoch, loss=f"{state.losses[-1]:.4f}", lr=f"{state.lrs[-1]:.2e}")
        logs.log_step(state.step, state.losses, state.lrs, state.loss_parts)
        state.train_seconds += time.perf_counter() - tick
        last = state.step == schedule.total_steps
        if last or state.step == epoch * schedule.steps_per_epoch:
            state.epoch = epoch
        if (state.step % p.eval_every_steps == 0 or last) if p.eval_every_steps else state.epoch == epoch:
            evaluate_and_keep(run, state, stopping, logs, paths)
            run.model.train()
        elif p.save_every_steps and state.step % p.save_every_steps == 0:
            save_checkpoint(accelerator, paths.checkpoints, state, p.save_total_limit)
        tick = time.perf_counter()
        if last or stopping.should_stop or run.pruned:
            break


def train_batch(run: Run, batch: dict, parts: dict[str, list[float]]) -> float:
    """Forward and backward of one batch, returning its loss; the optimizer steps on every
    ``gradient_accumulation_steps``-th batch, the gradient clipped to ``train.max_grad_norm`` first.

    Args:
        batch: ``input_ids``, ``attention_mask`` ``[batch, seq_len]``, ``labels`` ``[batch]``; with distillation
            ``teacher_logits`` ``[batch, num_labels]``.
        parts: with distillation, the batch's ``train/hard_loss`` and ``train/soft_loss`` are appended here.
    """
    accelerator, model = run.accelerator, run.model
    with accelerator.accumulate(model):
        if run.distill is None:
            loss = model(**batch).loss
        else:
            loss, hard, soft = run.distill.loss(model, batch)
            for name, value in zip(("train/hard_loss", "train/soft_loss"), torch.stack((hard, soft)).detach().tolist()):
                parts.setdefault(name, []).append(value)
        accelerator.backward(loss)
        if accelerator.sync_gradients and run.p.max_grad_norm:
            accelerator.clip_grad_norm_(model.parameters(), run.p.max_grad_norm)
        run.optimizer.step()
        run.optimizer.zero_grad()
    return loss.item()


def finite_mean(values: list[float]) -> float:
    """The mean of the non-NaN ``values``; NaN when none is (a batch of transfer rows alone has no hard loss)."""
    kept = [v for v in values if not math.isnan(v)]
    return sum(kept) / len(kept) if kept else math.nan


def evaluate_and_keep(run: Run, state: RunState, stopping: EarlyStopping, logs: TrainLog, paths: Paths) -> None:
    """Validate, append the evaluation to ``state.evaluations`` and log it, report it to a search's trial
    (setting ``run.pruned``), save the model to ``paths.checkpoints/best`` when it is the best so far (every time
    without ``train.keep_best``), and checkpoint the run. A collapsed evaluation is recorded in ``state.collapsed``.
    """
    p, main, unit = run.p, run.task.metrics[0], run.unit
    validation, logits = evaluate_split(run.predictor, run.validation, load_metric(run.task), run.evaluation,
                                        desc="validation")
    since = state.evaluations[-1]["step"] if state.evaluations else 0  # the steps since the previous evaluation
    parts = {name: values[since:] for name, values in state.loss_parts.items()}  # distillation's
    losses = state.losses[since:]
    entry = {"epoch": math.ceil(state.step / run.schedule.steps_per_epoch), "step": state.step,
             "train/loss": sum(losses) / len(losses),
             **{name: finite_mean(values) for name, values in parts.items()},
             **{f"validation/{name}": value for name, value in validation.items()}}
    state.evaluations.append(entry)
    improved = stopping.update(validation[run.metric_for_best], entry["epoch"], state.step)
    state.stopping = asdict(stopping)
    scores = ", ".join(f"{name} {value:.4f}" for name, value in validation.items())
    where = (f"Epoch {state.epoch}/{run.schedule.epochs}" if unit == "epoch" else
             f"Step {state.step}/{run.schedule.total_steps} (epoch {entry['epoch']})")
    log.info("%s: train loss %.4f%s | validation %s (constant baseline: %s %.4f)%s", where, entry["train/loss"],
             "".join(f", {name.removeprefix('train/').replace('_', ' ')} {entry[name]:.4f}" for name in parts),
             scores, main, run.baseline[main],
             f" | best {run.metric_for_best} so far" if improved else
             f" | no improvement for {stopping.bad_evaluations} evaluation(s)")
    report = collapse_check(run.task, validation, predictions_of(logits, run.task), run.baseline)
    about = note_evaluation(entry[unit], run.task, validation, report, unit)
    if about is not None:
        state.collapsed[str(entry[unit])] = about
    logs.log_evaluation(entry)
    pruned = [run.trial is not None and run.trial.report(validation, entry[unit])]  # a search's pruner (tools.tune)
    run.pruned = broadcast_object_list(pruned)[0]
    if improved or not p.keep_best:
        save_model(run.accelerator, run.model, run.tokenizer, run.task, paths.checkpoints / "best")
    save_checkpoint(run.accelerator, paths.checkpoints, state, p.save_total_limit)


def save_model(accelerator: Accelerator, model, tokenizer, task: Task, folder) -> None:
    """Save the unwrapped ``model``, ``tokenizer`` and ``task`` into ``folder`` atomically on the main process;
    every process waits for it."""
    if accelerator.is_main_process:
        with atomic_dir(folder) as tmp:
            accelerator.unwrap_model(model, keep_torch_compile=False).save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            task.save(tmp)
    accelerator.wait_for_everyone()


def save_kept_model(run: Run, state: RunState, stopping: EarlyStopping, paths: Paths) -> None:
    """Copy the kept evaluation's model (``paths.checkpoints/best``) to ``paths.trained``, atomically."""
    unit = run.unit
    if stopping.should_stop and state.step < run.schedule.total_steps:
        log.info("Early stopping at step %d (epoch %d): %s did not improve for %d evaluations (best %.4f, %s %d)",
                 state.step, math.ceil(state.step / run.schedule.steps_per_epoch), run.metric_for_best,
                 stopping.bad_evaluations, stopping.best, unit,
                 stopping.best_step if unit == "step" else stopping.best_epoch)
    run.accelerator.wait_for_everyone()
    if run.accelerator.is_main_process:
        with atomic_dir(paths.trained) as tmp:
            shutil.copytree(paths.checkpoints / "best", tmp, dirs_exist_ok=True)
        kept = kept_evaluation(run, state, stopping)
        log.info("Saved the model of %s %d to %s", unit, kept[unit], paths.trained)


def kept_evaluation(run: Run, state: RunState, stopping: EarlyStopping) -> dict:
    """The entry of ``state.evaluations`` whose model is kept: the best with ``keep_best``, else the last."""
    if run.p.keep_best:
        return next(e for e in state.evaluations if e["step"] == stopping.best_step)
    return state.evaluations[-1]
