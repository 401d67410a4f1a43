"""Stage 4, train: fine-tune the pretrained checkpoint on MRPC train with an explicit loop on Accelerate.

The loop of the Hugging Face course, chapter 3 "A full training" (https://huggingface.co/learn/llm-course/chapter3/4)
and of transformers' examples/pytorch/text-classification/run_glue_no_trainer.py: AdamW, a schedule from
``transformers.get_scheduler``, ``accelerator.accumulate`` / ``accelerator.backward``, validation after every epoch.
On top: the best epoch is kept, early stopping, and a checkpoint after every epoch (``accelerator.save_state``) that
``train.resume`` continues from after an interruption.

Run as ``accelerate launch --config_file <train.accelerate_config> -m stages.train`` (dvc.yaml does), or plainly as
``python -m stages.train`` for one process. Writes models/finetuned/ (model + tokenizer), models/checkpoints/,
metrics/train.json and the DVCLive logs dvclive/train/steps and dvclive/train/epochs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import set_seed
from datasets import load_from_disk
from tqdm.auto import tqdm
from transformers import AutoTokenizer, get_scheduler
from transformers.trainer_pt_utils import get_parameter_names

from stages.common import (
    CHECKPOINTS_DIR,
    FINETUNED_DIR,
    LIVE_DIR,
    METRICS_DIR,
    PRETRAINED_DIR,
    TOKENIZED_DIR,
    EvaluateParams,
    TrainParams,
    atomic_dir,
    load_params,
    make_accelerator,
    open_live,
    peak_memory_mb,
    resolve_mixed_precision,
    set_cpu_threads,
    setup_logging,
    write_json,
)
from stages.data import make_collator, train_dataloader
from stages.modeling import evaluate_split, evaluation_batches, load_classifier, load_metric

log = setup_logging()

STATE_FILE = "trainer_state.json"  # inside each epoch checkpoint, beside accelerator.save_state's files


def make_optimizer(model: torch.nn.Module, p: TrainParams) -> torch.optim.AdamW:
    """``torch.optim.AdamW`` with ``p.lr``; ``p.weight_decay`` on every weight except biases and LayerNorm weights.

    Excluding biases and normalisation weights from decay follows BERT's original optimizer and
    run_glue_no_trainer.py. ``p.adamw_impl`` picks the implementation: 'foreach' batches the update over
    tensors, 'fused' runs one kernel per parameter group (CPU and CUDA since torch 2.4), 'default' lets torch
    choose; all compute the same update (https://pytorch.org/docs/stable/generated/torch.optim.AdamW.html).
    """
    decay = set(get_parameter_names(model, [torch.nn.LayerNorm], ["bias", "layernorm", "rmsnorm"]))
    groups = [
        {"params": [t for n, t in model.named_parameters() if n in decay], "weight_decay": p.weight_decay},
        {"params": [t for n, t in model.named_parameters() if n not in decay], "weight_decay": 0.0},
    ]
    impl = {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}[p.adamw_impl]
    return torch.optim.AdamW(groups, lr=p.lr, **impl)


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


@dataclass
class TrainerState:
    """Everything beyond accelerator.save_state needed to continue a run: saved as trainer_state.json per epoch."""

    fingerprint: str
    epoch: int = 0
    step: int = 0
    train_seconds: float = 0.0
    samples: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    losses: list = field(default_factory=list)  # train loss of every optimizer step
    lrs: list = field(default_factory=list)  # learning rate after every optimizer step
    epoch_logs: list = field(default_factory=list)  # one dict per epoch: train loss and validation metrics
    stopping: dict = field(default_factory=dict)  # EarlyStopping fields


def code_digest() -> str:
    """sha256 of the source of every loaded module of the ``stages`` package (the code a run executes)."""
    digest = hashlib.sha256()
    modules = {name: module for name, module in sys.modules.items() if name == "stages" or name.startswith("stages.")}
    for name in sorted(modules):
        path = getattr(modules[name], "__file__", None)
        if path:
            digest.update(name.encode() + b"\0" + Path(path).read_bytes())
    return digest.hexdigest()[:16]


def run_fingerprint(p: TrainParams, evaluation: EvaluateParams, tokenized_dir: Path, pretrained_dir: Path,
                    num_processes: int) -> str:
    """A hash of everything that decides the run's result, so ``resume`` never continues a different run.

    Covers the train params (except ``resume``, ``log_every``), the evaluation batching, the number of processes,
    the tokenized data (datasets' fingerprint of each split), the pretrained checkpoint's config and weights' sizes,
    and the code (``code_digest``): a run is never continued by changed training code.
    """
    tokenized = load_from_disk(str(tokenized_dir))
    weights = sorted((f.name, f.stat().st_size) for f in Path(pretrained_dir).glob("*.safetensors"))
    parts = {
        "train": p.model_dump(exclude={"resume", "log_every"}),
        "evaluate": evaluation.model_dump(include={"batch_size", "sort_by_length"}),
        "processes": num_processes,
        "data": {split: ds._fingerprint for split, ds in tokenized.items()},
        "config": (Path(pretrained_dir) / "config.json").read_text(),
        "weights": weights,
        "code": code_digest(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def last_checkpoint(checkpoints_dir: Path, fingerprint: str) -> Path | None:
    """The newest complete ``epoch-N`` checkpoint of the run ``fingerprint``, or None.

    A checkpoint is complete once its folder has its final name: it is written as ``.epoch-N.tmp`` and renamed.
    """
    found = []
    for folder in Path(checkpoints_dir).glob("epoch-*"):
        state_file = folder / STATE_FILE
        if state_file.is_file() and json.loads(state_file.read_text()).get("fingerprint") == fingerprint:
            found.append((int(folder.name.split("-")[1]), folder))
    return max(found)[1] if found else None


def save_checkpoint(accelerator: Accelerator, checkpoints_dir: Path, state: TrainerState) -> Path:
    """``accelerator.save_state`` (model, optimizer, scheduler, RNG states) plus ``state`` as ``epoch-N``.

    Written to ``.epoch-N.tmp`` and renamed when complete; older epoch checkpoints are then deleted. Every process
    must call it (save_state synchronises them).
    """
    final = Path(checkpoints_dir) / f"epoch-{state.epoch}"
    tmp = Path(checkpoints_dir) / f".epoch-{state.epoch}.tmp"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    if accelerator.is_main_process:
        (tmp / STATE_FILE).write_text(json.dumps(asdict(state)))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        for old in Path(checkpoints_dir).glob("epoch-*"):
            if old != final:
                shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def save_model(accelerator: Accelerator, model, tokenizer, folder: Path) -> None:
    """``save_pretrained`` of the unwrapped model and the tokenizer into ``folder``, atomically (main process)."""
    if accelerator.is_main_process:
        with atomic_dir(folder) as tmp:
            accelerator.unwrap_model(model, keep_torch_compile=False).save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
    accelerator.wait_for_everyone()


def replay_logs(state: TrainerState, live_steps, live_epochs, log_every: int) -> None:
    """Write the DVCLive logs of the epochs a resumed run already did, so its logs equal an uninterrupted run's."""
    for step in range(log_every, state.step + 1, log_every):
        live_steps.step = step
        recent = state.losses[step - log_every:step]
        live_steps.log_metric("train/loss", sum(recent) / len(recent))
        live_steps.log_metric("train/lr", state.lrs[step - 1])
    for entry in state.epoch_logs:
        live_epochs.step = entry["epoch"]
        for name, value in entry.items():
            if name != "epoch":
                live_epochs.log_metric(name, value)
    for live in (live_steps, live_epochs):
        live.make_summary()


def train(p: TrainParams, tokenized_dir: Path, pretrained_dir: Path, output_dir: Path,
          live_dir: Path | None = None, evaluation: EvaluateParams | None = None,
          checkpoints_dir: Path | None = None, reinit_head: bool = False) -> dict:
    """Fine-tune ``pretrained_dir`` on the train split of ``tokenized_dir``; save the kept model to ``output_dir``.

    ``p.seed`` drives the head's initialisation, dropout and the batch order (epoch ``e`` shuffles with seed
    ``p.seed + e``). One optimizer step takes ``p.gradient_accumulation_steps`` batches of ``p.batch_size`` per
    process; training runs ``p.max_steps`` optimizer steps if set, else ``p.epochs`` epochs, and stops sooner when
    ``p.early_stopping_patience`` epochs pass without the validation ``p.metric_for_best`` improving. The validation
    split is evaluated after every epoch (batched as ``evaluation`` says); ``output_dir`` gets the best epoch's
    weights with ``p.keep_best``, else the last epoch's.

    ``reinit_head``: see ``load_classifier``. With ``checkpoints_dir``, every epoch ends with a checkpoint there
    (``save_checkpoint``) and, with ``p.resume``, a run whose fingerprint (``run_fingerprint``) matches a
    checkpoint continues after its epoch, with the same result as an uninterrupted run. With ``live_dir``, DVCLive
    logs go to ``live_dir/steps`` (``train/loss``: mean over the last ``p.log_every`` steps, ``train/lr``) and
    ``live_dir/epochs`` (``train/loss``, ``validation/{loss,accuracy,f1}``); they are written to a temp folder and
    moved into place at the end.

    Returns:
        metrics: ``final_loss`` (mean train loss over the last epoch), ``mean_loss`` (over all steps), ``steps``
        (optimizer steps), ``epochs`` (epochs run), ``best_epoch`` and ``best_validation_<metric>`` (the kept
        epoch by ``p.metric_for_best``), ``stopped_early``, ``resumed_from_epoch`` (0: a fresh run),
        ``train_samples`` (examples seen), ``train_seconds`` (wall seconds of the optimisation steps, validation
        excluded), ``samples_per_second`` (train samples/s), ``wall_seconds`` (this call: loading, training,
        validation, saving), ``peak_memory_mb`` (peak RSS, MiB; on GPU also ``peak_gpu_memory_mb``),
        ``parameters``, ``padding_fraction`` (padding / all tokens of the training batches), ``real_tokens``,
        ``mixed_precision`` and, with ``p.torch_compile``, ``compile_seconds`` (the first optimizer step).
    """
    start_wall = time.perf_counter()
    threads = set_cpu_threads(p.num_threads)
    evaluation = evaluation or EvaluateParams(batch_size=32, sort_by_length=False, splits=["validation"])
    mixed_precision = resolve_mixed_precision(p.mixed_precision)
    accelerator = make_accelerator(mixed_precision=mixed_precision,
                                   gradient_accumulation_steps=p.gradient_accumulation_steps)
    set_seed(p.seed)
    tokenizer = AutoTokenizer.from_pretrained(pretrained_dir)
    model = load_classifier(pretrained_dir, reinit_head)
    parameters = sum(t.numel() for t in model.parameters())
    tokenized = load_from_disk(str(tokenized_dir))
    collator = make_collator(tokenizer)
    train_dl = train_dataloader(tokenized["train"], collator, p.batch_size, p.seed, p.group_by_length)
    batch_generator = train_dl.generator
    val_dl, _ = evaluation_batches(tokenized["validation"], collator, evaluation)
    optimizer = make_optimizer(model, p)
    if p.torch_compile:
        model = torch.compile(model)
    model, optimizer, train_dl, val_dl = accelerator.prepare(model, optimizer, train_dl, val_dl)

    # len(train_dl) is per process after prepare; the schedule counts this process's optimizer steps, which every
    # process takes together. The scheduler is stepped by hand after real optimizer steps, so it is not prepared.
    steps_per_epoch = math.ceil(len(train_dl) / p.gradient_accumulation_steps)
    num_training_steps = p.max_steps or p.epochs * steps_per_epoch
    num_epochs = math.ceil(num_training_steps / steps_per_epoch)
    num_warmup_steps = p.warmup_steps or math.ceil(p.warmup_ratio * num_training_steps)
    lr_scheduler = get_scheduler(p.scheduler, optimizer=optimizer, num_warmup_steps=num_warmup_steps,
                                 num_training_steps=num_training_steps)
    accelerator.register_for_checkpointing(lr_scheduler)
    log.info("Training up to %d optimizer steps (%d epochs of %d) on %d process(es) (%s), batch %d x %d accumulation, "
             "mixed precision %s, lr %g, %s schedule, %d warmup steps, %d CPU threads", num_training_steps, num_epochs,
             steps_per_epoch, accelerator.num_processes, accelerator.device, p.batch_size,
             p.gradient_accumulation_steps,
             mixed_precision, p.lr, p.scheduler, num_warmup_steps, threads)

    state = TrainerState(fingerprint=run_fingerprint(p, evaluation, tokenized_dir, pretrained_dir,
                                                     accelerator.num_processes))
    stopping = EarlyStopping(mode="min" if p.metric_for_best == "loss" else "max",
                             patience=p.early_stopping_patience, threshold=p.early_stopping_threshold)
    resumed_from = 0
    if checkpoints_dir is not None and p.resume and (checkpoint := last_checkpoint(checkpoints_dir, state.fingerprint)):
        accelerator.load_state(str(checkpoint))
        state = TrainerState(**json.loads((checkpoint / STATE_FILE).read_text()))
        stopping = EarlyStopping(**state.stopping)
        resumed_from = state.epoch
        log.info("Resuming after epoch %d (step %d) from %s", state.epoch, state.step, checkpoint)
    elif checkpoints_dir is not None and accelerator.is_main_process:
        shutil.rmtree(checkpoints_dir, ignore_errors=True)  # checkpoints of another run: never mixed with this one
    best_dir = Path(checkpoints_dir or output_dir.parent / f".{output_dir.name}.best") / "best"

    logging_enabled = live_dir is not None and accelerator.is_main_process
    with atomic_dir(live_dir) if logging_enabled else contextlib.nullcontext() as live_tmp:
        live_steps = open_live(live_tmp / "steps") if logging_enabled else None
        live_epochs = open_live(live_tmp / "epochs") if logging_enabled else None
        if live_steps and state.epoch:
            replay_logs(state, live_steps, live_epochs, p.log_every)

        compile_seconds = None
        progress = tqdm(total=num_training_steps, initial=state.step, desc="train", unit="step",
                        disable=not accelerator.is_local_main_process)
        while state.epoch < num_epochs and state.step < num_training_steps and not stopping.should_stop:
            epoch = state.epoch + 1
            batch_generator.manual_seed(p.seed + epoch)  # the batch order of an epoch depends on seed and epoch only
            model.train()
            epoch_losses, micro_losses = [], []
            epoch_start = time.perf_counter()
            for batch in train_dl:
                step_start = time.perf_counter()
                with accelerator.accumulate(model):
                    loss = model(**batch).loss
                    accelerator.backward(loss)
                    if accelerator.sync_gradients and p.max_grad_norm:
                        accelerator.clip_grad_norm_(model.parameters(), p.max_grad_norm)
                    optimizer.step()
                    optimizer.zero_grad()
                micro_losses.append(loss.item())
                state.samples += batch["labels"].shape[0] * accelerator.num_processes
                state.real_tokens += int(batch["attention_mask"].sum())
                state.padded_tokens += batch["attention_mask"].numel()
                if not accelerator.sync_gradients:
                    continue
                lr_scheduler.step()
                state.step += 1
                if state.step == 1 and p.torch_compile:
                    compile_seconds = time.perf_counter() - step_start
                state.losses.append(sum(micro_losses) / len(micro_losses))
                state.lrs.append(lr_scheduler.get_last_lr()[0])
                epoch_losses.append(state.losses[-1])
                micro_losses = []
                progress.update(1)
                progress.set_postfix(epoch=epoch, loss=f"{state.losses[-1]:.4f}", lr=f"{state.lrs[-1]:.2e}")
                if live_steps and (state.step % p.log_every == 0 or state.step == num_training_steps):
                    recent = state.losses[-p.log_every:]
                    live_steps.step = state.step
                    live_steps.log_metric("train/loss", sum(recent) / len(recent))
                    live_steps.log_metric("train/lr", state.lrs[-1])
                    live_steps.make_summary()
                if state.step == num_training_steps:
                    break
            state.train_seconds += time.perf_counter() - epoch_start
            state.epoch = epoch

            validation, _ = evaluate_split(model, val_dl, accelerator, load_metric())
            entry = {"epoch": epoch, "train/loss": sum(epoch_losses) / len(epoch_losses),
                     **{f"validation/{name}": value for name, value in validation.items()}}
            state.epoch_logs.append(entry)
            improved = stopping.update(validation[p.metric_for_best], epoch)
            state.stopping = asdict(stopping)
            log.info("Epoch %d/%d: train loss %.4f | validation loss %.4f, accuracy %.4f, F1 %.4f%s", epoch, num_epochs,
                     entry["train/loss"], validation["loss"], validation["accuracy"], validation["f1"],
                     f" | best {p.metric_for_best} so far" if improved else
                     f" | no improvement for {stopping.bad_epochs} epoch(s)")
            if live_epochs:
                live_epochs.step = epoch
                for name, value in entry.items():
                    if name != "epoch":
                        live_epochs.log_metric(name, value)
                live_epochs.make_summary()
            if improved or not p.keep_best:
                save_model(accelerator, model, tokenizer, best_dir)
            if checkpoints_dir is not None:
                save_checkpoint(accelerator, checkpoints_dir, state)
        progress.close()
        if stopping.should_stop and state.epoch < num_epochs:
            log.info("Early stopping after epoch %d: %s did not improve for %d epochs (best %.4f, epoch %d)",
                     state.epoch, p.metric_for_best, stopping.bad_epochs, stopping.best, stopping.best_epoch)

        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            with atomic_dir(output_dir) as tmp:
                shutil.copytree(best_dir, tmp, dirs_exist_ok=True)
            kept_epoch = stopping.best_epoch if p.keep_best else state.epoch
            log.info("Saved the model of epoch %d to %s", kept_epoch, output_dir)
        for live in (live_steps, live_epochs):
            if live:
                live.end()
    if checkpoints_dir is None and accelerator.is_main_process:
        shutil.rmtree(best_dir.parent, ignore_errors=True)

    last = state.epoch_logs[-1]
    kept = next(e for e in state.epoch_logs if e["epoch"] == stopping.best_epoch) if p.keep_best else last
    epoch_losses = [e["train/loss"] for e in state.epoch_logs]
    metrics = {
        "final_loss": round(epoch_losses[-1], 4),
        "mean_loss": round(sum(state.losses) / len(state.losses), 4),
        "steps": state.step,
        "epochs": state.epoch,
        "best_epoch": kept["epoch"],
        f"best_validation_{p.metric_for_best}": round(kept[f"validation/{p.metric_for_best}"], 4),
        "stopped_early": stopping.should_stop and state.epoch < num_epochs,
        "resumed_from_epoch": resumed_from,
        "train_samples": state.samples,
        "train_seconds": round(state.train_seconds, 1),
        "samples_per_second": round(state.samples / state.train_seconds, 2),
        "wall_seconds": round(time.perf_counter() - start_wall, 1),
        "peak_memory_mb": peak_memory_mb(),
        "parameters": parameters,
        "padding_fraction": round(1 - state.real_tokens / state.padded_tokens, 4),
        "real_tokens": state.real_tokens,
        "mixed_precision": mixed_precision,
    }
    if compile_seconds is not None:
        metrics["compile_seconds"] = round(compile_seconds, 1)
    if torch.cuda.is_available():
        metrics["peak_gpu_memory_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return metrics


def main() -> None:
    params = load_params()
    metrics = train(params.train, TOKENIZED_DIR, PRETRAINED_DIR, FINETUNED_DIR, LIVE_DIR / "train", params.evaluate,
                    CHECKPOINTS_DIR, params.model.reinit_head)
    if PartialState().is_main_process:
        log.info("Train metrics: %s", metrics)
        write_json(METRICS_DIR / "train.json", metrics)


if __name__ == "__main__":
    main()
