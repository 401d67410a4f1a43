"""Stage 4, train: fine-tune the pretrained checkpoint on MRPC train with an explicit loop on Accelerate.

The loop of the Hugging Face course, chapter 3 "A full training" (https://huggingface.co/learn/llm-course/chapter3/4):
AdamW, a learning-rate schedule from ``transformers.get_scheduler``, ``accelerator.backward``; validation at the
end of every epoch. Writes models/finetuned/ (model + tokenizer, save_pretrained), metrics/train.json and the
DVCLive logs dvclive/train/steps (train loss and learning rate by optimizer step) and dvclive/train/epochs
(train and validation loss, validation accuracy and F1 by epoch).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from datasets import load_from_disk
from tqdm.auto import tqdm
from transformers import AutoTokenizer, get_scheduler

from stages.common import (FINETUNED_DIR, LIVE_DIR, METRICS_DIR, PRETRAINED_DIR, TOKENIZED_DIR, EvaluateParams, TrainParams,
                           atomic_dir, load_params, open_live, peak_memory_mb, resolve_mixed_precision, setup_logging,
                           write_json)
from stages.data import make_collator, train_dataloader
from stages.modeling import evaluate_split, evaluation_batches, load_classifier, load_metric

log = setup_logging()


def make_optimizer(model: torch.nn.Module, p: TrainParams) -> torch.optim.AdamW:
    """``torch.optim.AdamW`` with ``p.lr`` and ``p.weight_decay``, in the implementation ``p.adamw_impl``.

    'foreach' batches the update over tensors, 'fused' runs it as one kernel per parameter group (CPU and
    CUDA since torch 2.4); 'default' lets torch choose. All three compute the same update
    (https://pytorch.org/docs/stable/generated/torch.optim.AdamW.html).
    """
    impl = {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}[p.adamw_impl]
    return torch.optim.AdamW(model.parameters(), lr=p.lr, weight_decay=p.weight_decay, **impl)


def train(p: TrainParams, tokenized_dir: Path, pretrained_dir: Path, output_dir: Path,
          live_dir: Path | None = None, evaluation: EvaluateParams | None = None) -> dict:
    """Fine-tune ``pretrained_dir`` on the train split of ``tokenized_dir``; save the result to ``output_dir``.

    ``p.seed`` drives the head's initialisation, dropout and the order of batches. Training runs
    ``p.max_steps`` optimizer steps if set, else ``p.epochs`` epochs; the validation split is evaluated
    after every epoch, batched as ``evaluation`` says (default: 32, row order). With ``live_dir``, DVCLive logs go to
    ``live_dir/steps`` (``train/loss``: mean over the last ``p.log_every`` steps, ``train/lr``) and
    ``live_dir/epochs`` (``train/loss``, ``validation/loss``, ``validation/accuracy``, ``validation/f1``).

    Returns:
        metrics: ``final_loss`` (mean train loss over the last epoch), ``mean_loss`` (over all steps),
        ``steps`` (optimizer steps), ``epochs``, ``train_samples`` (examples seen), ``train_seconds``
        (wall seconds of the optimisation steps, validation excluded), ``samples_per_second`` (train
        samples/s), ``wall_seconds`` (the whole call: loading, training, validation, saving),
        ``peak_memory_mb`` (peak RSS of the process, MiB; on GPU also ``peak_gpu_memory_mb``) and
        ``parameters`` (all parameters of the classifier), ``padding_fraction`` (padding / all tokens of the
        training batches), ``real_tokens`` (non-padding training tokens) and, with ``p.torch_compile``,
        ``compile_seconds`` (the first optimizer step, which compiles; it stays inside ``train_seconds``).
    """
    start_wall = time.perf_counter()
    if p.num_threads:
        torch.set_num_threads(p.num_threads)
    mixed_precision = resolve_mixed_precision(p.mixed_precision)
    accelerator = Accelerator(mixed_precision=mixed_precision)
    set_seed(p.seed)
    tokenizer = AutoTokenizer.from_pretrained(pretrained_dir)
    model = load_classifier(pretrained_dir)
    parameters = sum(t.numel() for t in model.parameters())
    tokenized = load_from_disk(str(tokenized_dir))
    collator = make_collator(tokenizer)
    train_dl = train_dataloader(tokenized["train"], collator, p.batch_size, p.seed, p.group_by_length)
    val_dl, _ = evaluation_batches(tokenized["validation"], collator,
                                   evaluation or EvaluateParams(batch_size=32, sort_by_length=False, splits=["validation"]))
    optimizer = make_optimizer(model, p)
    if p.torch_compile:
        model = torch.compile(model)
    model, optimizer, train_dl, val_dl = accelerator.prepare(model, optimizer, train_dl, val_dl)

    # len(train_dl) is per process after prepare, so the schedule is sized in this process's optimizer steps.
    num_training_steps = p.max_steps or p.epochs * len(train_dl)
    num_epochs = math.ceil(num_training_steps / len(train_dl))
    lr_scheduler = get_scheduler(
        p.scheduler, optimizer=optimizer, num_warmup_steps=p.warmup_steps, num_training_steps=num_training_steps
    )
    log.info("Training %d steps (%d epochs of %d batches of %d) on %s, mixed precision %s, lr %g, %s schedule, warmup %d",
             num_training_steps, num_epochs, len(train_dl), p.batch_size, accelerator.device, mixed_precision, p.lr,
             p.scheduler, p.warmup_steps)

    logging_enabled = live_dir is not None and accelerator.is_main_process
    live_steps = open_live(Path(live_dir) / "steps") if logging_enabled else None
    live_epochs = open_live(Path(live_dir) / "epochs") if logging_enabled else None
    if live_steps:
        live_steps.log_params(p.model_dump())

    losses, epoch_losses, samples, step, train_seconds = [], [], 0, 0, 0.0
    real_tokens = padded_tokens = 0
    compile_seconds = None
    progress = tqdm(total=num_training_steps, desc="train", unit="step", disable=not accelerator.is_local_main_process)
    for epoch in range(1, num_epochs + 1):
        model.train()
        epoch_losses = []
        epoch_start = time.perf_counter()
        for batch in train_dl:
            step_start = time.perf_counter()
            outputs = model(**batch)
            loss = outputs.loss
            accelerator.backward(loss)
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()

            step += 1
            if step == 1 and p.torch_compile:
                compile_seconds = time.perf_counter() - step_start
            samples += batch["labels"].shape[0] * accelerator.num_processes
            real_tokens += int(batch["attention_mask"].sum())
            padded_tokens += batch["attention_mask"].numel()
            losses.append(loss.item())
            epoch_losses.append(losses[-1])
            progress.update(1)
            progress.set_postfix(epoch=epoch, loss=f"{losses[-1]:.4f}", lr=f"{lr_scheduler.get_last_lr()[0]:.2e}")
            if live_steps and (step % p.log_every == 0 or step == num_training_steps):
                recent = losses[-p.log_every:]
                live_steps.step = step
                live_steps.log_metric("train/loss", sum(recent) / len(recent))
                live_steps.log_metric("train/lr", lr_scheduler.get_last_lr()[0])
                live_steps.make_summary()
            if step == num_training_steps:
                break
        train_seconds += time.perf_counter() - epoch_start

        validation, _ = evaluate_split(model, val_dl, accelerator, load_metric())
        train_loss = sum(epoch_losses) / len(epoch_losses)
        log.info("Epoch %d/%d: train loss %.4f | validation loss %.4f, accuracy %.4f, F1 %.4f", epoch, num_epochs,
                 train_loss, validation["loss"], validation["accuracy"], validation["f1"])
        if live_epochs:
            live_epochs.step = epoch
            live_epochs.log_metric("train/loss", train_loss)
            for name, value in validation.items():
                live_epochs.log_metric(f"validation/{name}", value)
            live_epochs.make_summary()
    progress.close()

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        with atomic_dir(output_dir) as tmp:
            accelerator.unwrap_model(model, keep_torch_compile=False).save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
        log.info("Saved the fine-tuned model to %s", output_dir)
    for live in (live_steps, live_epochs):
        if live:
            live.end()
    metrics = {
        "final_loss": round(sum(epoch_losses) / len(epoch_losses), 4),
        "mean_loss": round(sum(losses) / len(losses), 4),
        "steps": step,
        "epochs": num_epochs,
        "train_samples": samples,
        "train_seconds": round(train_seconds, 1),
        "samples_per_second": round(samples / train_seconds, 2),
        "wall_seconds": round(time.perf_counter() - start_wall, 1),
        "peak_memory_mb": peak_memory_mb(),
        "parameters": parameters,
        "padding_fraction": round(1 - real_tokens / padded_tokens, 4),
        "real_tokens": real_tokens,
        "mixed_precision": mixed_precision,
    }
    if compile_seconds is not None:
        metrics["compile_seconds"] = round(compile_seconds, 1)
    if torch.cuda.is_available():
        metrics["peak_gpu_memory_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return metrics


def main() -> None:
    params = load_params()
    metrics = train(params.train, TOKENIZED_DIR, PRETRAINED_DIR, FINETUNED_DIR, LIVE_DIR / "train", params.evaluate)
    log.info("Train metrics: %s", metrics)
    write_json(METRICS_DIR / "train.json", metrics)


if __name__ == "__main__":
    main()
