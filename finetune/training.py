"""The training loop: fine-tune the pretrained checkpoint on the train split with an explicit loop on Accelerate.

The loop of the Hugging Face course, chapter 3 "A full training" (https://huggingface.co/learn/llm-course/chapter3/4)
and of transformers' examples/pytorch/text-classification/run_glue_no_trainer.py: AdamW, a schedule from
``transformers.get_scheduler``, ``accelerator.accumulate`` / ``accelerator.backward``, validation after every epoch.
On top: the best epoch is kept, early stopping, a checkpoint after every epoch that ``train.resume`` continues
from after an interruption (finetune/resume.py), and knowledge distillation from a teacher's logits
(``distill.*``, finetune/distill.py).
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import asdict, dataclass

import torch
from accelerate import Accelerator
from tqdm.auto import tqdm

from finetune.collapse import collapse_check, end_of_run, note_epoch
from finetune.evaluation import evaluate_split, load_metric, predictions_of
from finetune.hardware import describe_device, numerics
from finetune.live import TrainLog
from finetune.params import Params
from finetune.paths import Paths
from finetune.resume import RunState, last_checkpoint, load_checkpoint, save_checkpoint
from finetune.run import Run, build_run
from finetune.runtime import atomic_dir, peak_memory_mb
from finetune.tasks import Task

log = logging.getLogger(__name__)


@dataclass
class EarlyStopping:
    """Track a validation metric across epochs: is this epoch the best so far, and is it time to stop?

    ``mode`` 'max' for accuracy/F1, 'min' for loss. An epoch improves when it beats the best by more than
    ``threshold``; training stops after ``patience`` epochs in a row without improvement (None: never),
    like transformers' ``EarlyStoppingCallback``.
    """

    mode: str
    patience: int | None = None
    threshold: float = 0.0
    best: float | None = None
    best_epoch: int = 0
    bad_epochs: int = 0

    def update(self, value: float, epoch: int) -> bool:
        """Record ``value`` of ``epoch``; True when it is a new best."""
        sign = 1 if self.mode == "max" else -1
        if self.best is None or sign * (value - self.best) > self.threshold:
            self.best, self.best_epoch, self.bad_epochs = value, epoch, 0
            return True
        self.bad_epochs += 1
        return False

    @property
    def should_stop(self) -> bool:
        return self.patience is not None and self.bad_epochs >= self.patience


def train(params: Params, paths: Paths) -> dict:
    """Fine-tune ``paths.pretrained`` on the train split of ``paths.tokenized``; save the kept model to
    ``paths.trained``, a checkpoint per epoch to ``paths.checkpoints`` and DVCLive logs to ``paths.train_logs``.

    ``train.seed`` drives the head's initialisation, dropout and the batch order. One optimizer step takes
    ``gradient_accumulation_steps`` batches of ``batch_size`` per process; the run takes ``max_steps`` optimizer
    steps if set, else ``epochs`` epochs, and stops sooner after ``early_stopping_patience`` epochs without the
    validation ``metric_for_best`` improving. ``paths.trained`` gets the best epoch's weights with ``keep_best``,
    else the last epoch's. With ``resume``, a run whose fingerprint matches a checkpoint continues after its epoch.
    With ``distill.teacher``, the loss mixes the labels with the teacher's logits of ``paths.teacher``
    (``finetune.distill.distillation_loss``); without, nothing of distillation runs.

    Returns:
        metrics, see ``final_metrics``.

    Raises:
        CheckpointError: ``paths.pretrained`` lacks config, weights or tokenizer, or has a head of another size.
        ParamsError: ``train.metric_for_best`` is not a metric of the data's task.
        TeacherError: with ``distill.teacher``, the teacher's logits do not fit the task or the train split
            (``finetune.distill.load_teacher``).
    """
    start = time.perf_counter()
    # the run: model, data, optimizer, schedule; then a fresh state or the last checkpoint's
    run = build_run(params, paths)
    state, stopping = start_or_resume(run, paths)
    # epochs: train, then validate, early-stop, keep the best, checkpoint; logs replayed first on resume
    with TrainLog.open(paths.train_logs, run.accelerator.is_main_process, run.p.log_every,
                       run.schedule.total_steps) as logs:
        logs.replay(state.losses, state.lrs, state.epoch_logs, state.loss_parts)
        progress = tqdm(total=run.schedule.total_steps, initial=state.step, desc="train", unit="step",
                        disable=not run.accelerator.is_local_main_process)
        while state.epoch < run.schedule.epochs and state.step < run.schedule.total_steps and not stopping.should_stop:
            step_losses = train_epoch(run, state, logs, progress)
            end_of_epoch(run, state, stopping, step_losses, logs, paths)
        progress.close()
        save_kept_model(run, state, stopping, paths)
    # the collapse verdict on the kept model, and the run's metrics/train.json
    collapse = end_of_run(state.collapsed, state.epoch, stopping.best_epoch if run.p.keep_best else state.epoch)
    return final_metrics(run, state, stopping, collapse, time.perf_counter() - start)


def start_or_resume(run: Run, paths: Paths) -> tuple[RunState, EarlyStopping]:
    """A fresh run state, or with ``train.resume`` the state of the newest checkpoint of this run's fingerprint.

    Checkpoints of another run are deleted: they are never mixed with this one.
    """
    p = run.p
    checkpoint = last_checkpoint(paths.checkpoints, run.fingerprint) if p.resume else None
    if checkpoint is None:
        if run.accelerator.is_main_process:
            shutil.rmtree(paths.checkpoints, ignore_errors=True)
        return RunState(run.fingerprint), EarlyStopping(mode=run.task.metric_for_best(run.metric_for_best)[1],
                                                        patience=p.early_stopping_patience,
                                                        threshold=p.early_stopping_threshold)
    state = load_checkpoint(run.accelerator, checkpoint)
    run.resumed_from = state.epoch
    log.info("Resuming after epoch %d (step %d) from %s", state.epoch, state.step, checkpoint)
    return state, EarlyStopping(**state.stopping)


def train_epoch(run: Run, state: RunState, logs: TrainLog, progress: tqdm) -> list[float]:
    """One epoch of optimizer steps (fewer when the run's last step comes first); returns each step's train loss.
    With distillation, each step's hard and soft loss go to ``state.loss_parts``."""
    p, accelerator, model = run.p, run.accelerator, run.model
    epoch = state.epoch + 1
    run.batch_order.manual_seed(p.seed + epoch)
    run.train_collator.generator.manual_seed(p.seed + epoch)
    model.train()
    step_losses, micro_losses = [], []
    micro_parts: dict[str, list[float]] = {}  # distillation: hard and soft loss of each batch of this step
    epoch_start = time.perf_counter()
    for batch in run.train_dl:
        step_start = time.perf_counter()
        # forward, backward; the optimizer steps once every gradient_accumulation_steps batches
        with accelerator.accumulate(model):
            if run.distill is None:
                loss = model(**batch).loss
            else:
                loss, hard, soft = run.distill.loss(model, batch)
                parts = torch.stack((hard, soft)).detach().tolist()  # one device sync for both
                for name, value in zip(("train/hard_loss", "train/soft_loss"), parts):
                    micro_parts.setdefault(name, []).append(value)
            accelerator.backward(loss)
            if accelerator.sync_gradients and p.max_grad_norm:
                accelerator.clip_grad_norm_(model.parameters(), p.max_grad_norm)
            run.optimizer.step()
            run.optimizer.zero_grad()
        micro_losses.append(loss.item())
        state.samples += batch["labels"].shape[0] * accelerator.num_processes
        state.real_tokens += int(batch["attention_mask"].sum())
        state.padded_tokens += batch["attention_mask"].numel()
        if not accelerator.sync_gradients:
            continue
        # after an optimizer step: learning rate, loss, progress, logs
        run.scheduler.step()
        state.step += 1
        if state.step == 1 and p.torch_compile:
            run.compile_seconds = time.perf_counter() - step_start
        state.losses.append(sum(micro_losses) / len(micro_losses))
        state.lrs.append(max(run.scheduler.get_last_lr()))  # the head's, with train.layer_lr_decay
        step_losses.append(state.losses[-1])
        for name, values in micro_parts.items():
            state.loss_parts.setdefault(name, []).append(sum(values) / len(values))
        micro_losses, micro_parts = [], {}
        progress.update(1)
        progress.set_postfix(epoch=epoch, loss=f"{state.losses[-1]:.4f}", lr=f"{state.lrs[-1]:.2e}")
        logs.log_step(state.step, state.losses, state.lrs, state.loss_parts)
        if state.step == run.schedule.total_steps:
            break
    state.train_seconds += time.perf_counter() - epoch_start
    state.epoch = epoch
    return step_losses


def end_of_epoch(run: Run, state: RunState, stopping: EarlyStopping, step_losses: list[float], logs: TrainLog,
                 paths: Paths) -> None:
    """Validate (with the collapse check: an INFO line when the model does not beat the constant baseline yet, the
    verdict comes at the end of the run), log the epoch, keep the model if it is the best so far (or every epoch
    without ``keep_best``), and checkpoint the run."""
    p, main = run.p, run.task.metrics[0]
    validation, logits = evaluate_split(run.model, run.val_dls, run.accelerator, run.task, load_metric(run.task),
                                        desc="validation")
    parts = {name: values[-len(step_losses):] for name, values in state.loss_parts.items()}  # distillation's
    entry = {"epoch": state.epoch, "train/loss": sum(step_losses) / len(step_losses),
             **{name: sum(values) / len(values) for name, values in parts.items()},
             **{f"validation/{name}": value for name, value in validation.items()}}
    state.epoch_logs.append(entry)
    improved = stopping.update(validation[run.metric_for_best], state.epoch)
    state.stopping = asdict(stopping)
    scores = ", ".join(f"{name} {value:.4f}" for name, value in validation.items())
    log.info("Epoch %d/%d: train loss %.4f%s | validation %s (constant baseline: %s %.4f)%s", state.epoch,
             run.schedule.epochs, entry["train/loss"],
             "".join(f", {name.removeprefix('train/').replace('_', ' ')} {entry[name]:.4f}" for name in parts),
             scores, main, run.baseline[main],
             f" | best {run.metric_for_best} so far" if improved else
             f" | no improvement for {stopping.bad_epochs} epoch(s)")
    report = collapse_check(run.task, validation, predictions_of(logits, run.task), run.baseline)
    about = note_epoch(state.epoch, run.task, validation, report)
    if about is not None:
        state.collapsed[str(state.epoch)] = about
    logs.log_epoch(entry)
    if improved or not p.keep_best:
        save_model(run.accelerator, run.model, run.tokenizer, run.task, paths.checkpoints / "best")
    save_checkpoint(run.accelerator, paths.checkpoints, state)


def save_model(accelerator: Accelerator, model, tokenizer, task: Task, folder) -> None:
    """``save_pretrained`` of the unwrapped model and the tokenizer, and the task.json that ``tools.predict`` reads
    (text columns), into ``folder``, atomically (main process)."""
    if accelerator.is_main_process:
        with atomic_dir(folder) as tmp:
            accelerator.unwrap_model(model, keep_torch_compile=False).save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            task.save(tmp)
    accelerator.wait_for_everyone()


def save_kept_model(run: Run, state: RunState, stopping: EarlyStopping, paths: Paths) -> None:
    """Copy the kept epoch's model (``paths.checkpoints/best``) to ``paths.trained``, atomically."""
    if stopping.should_stop and state.epoch < run.schedule.epochs:
        log.info("Early stopping after epoch %d: %s did not improve for %d epochs (best %.4f, epoch %d)",
                 state.epoch, run.metric_for_best, stopping.bad_epochs, stopping.best, stopping.best_epoch)
    run.accelerator.wait_for_everyone()
    if run.accelerator.is_main_process:
        with atomic_dir(paths.trained) as tmp:
            shutil.copytree(paths.checkpoints / "best", tmp, dirs_exist_ok=True)
        kept_epoch = stopping.best_epoch if run.p.keep_best else state.epoch
        log.info("Saved the model of epoch %d to %s", kept_epoch, paths.trained)


def final_metrics(run: Run, state: RunState, stopping: EarlyStopping, collapse: dict, wall_seconds: float) -> dict:
    """The run's metrics/train.json.

    ``final_loss`` (mean train loss over the last epoch), ``mean_loss`` (over all steps), ``steps`` (optimizer
    steps), ``epochs`` (epochs run), ``best_epoch`` and ``best_validation_<metric>`` (the kept epoch by
    ``metric_for_best``), ``stopped_early``, ``resumed_from_epoch`` (0: a fresh run), ``train_samples`` (examples
    seen), ``train_seconds`` (wall seconds of the optimisation steps, validation excluded), ``samples_per_second``
    (train samples/s), ``wall_seconds`` (the whole call: loading, training, validation, saving), ``peak_memory_mb``
    (peak RSS, MiB; on GPU also ``peak_gpu_memory_mb``), ``parameters``, ``padding_fraction`` (padding / all tokens
    of the training batches), ``real_tokens``, ``mixed_precision``, ``device`` (``describe_device``), ``numerics``
    (what decides the last digits: CPU vendor and model, threads, matmul and vector instructions;
    ``finetune.hardware.numerics``), ``validation_baseline`` (the constant model of train's labels scored on
    validation: ``finetune.collapse.constant_baseline``), ``collapse`` (``collapse_check``'s verdict over the
    epochs: ``finetune.collapse.end_of_run``), with ``torch_compile``
    ``compile_seconds``, and with distillation ``distillation``: the teacher (``distill.teacher``) and its model type,
    ``alpha``, ``temperature`` and the last epoch's mean ``final_hard_loss`` and ``final_soft_loss``.
    """
    p = run.p
    kept = next(e for e in state.epoch_logs if e["epoch"] == stopping.best_epoch) if p.keep_best else \
        state.epoch_logs[-1]
    metrics = {
        "final_loss": round(state.epoch_logs[-1]["train/loss"], 4),
        "mean_loss": round(sum(state.losses) / len(state.losses), 4),
        "steps": state.step,
        "epochs": state.epoch,
        "best_epoch": kept["epoch"],
        f"best_validation_{run.metric_for_best}": round(kept[f"validation/{run.metric_for_best}"], 4),
        "stopped_early": stopping.should_stop and state.epoch < run.schedule.epochs,
        "resumed_from_epoch": run.resumed_from,
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
        last = state.epoch_logs[-1]
        metrics["distillation"] = {"teacher": run.distill.teacher["teacher"],
                              "teacher_model_type": run.distill.teacher["model_type"], "alpha": run.distill.alpha,
                              "temperature": run.distill.temperature,
                              "final_hard_loss": round(last["train/hard_loss"], 4),
                              "final_soft_loss": round(last["train/soft_loss"], 4)}
    if torch.cuda.is_available():
        metrics["peak_gpu_memory_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return metrics
