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

from stages.common import (FINETUNED_DIR, LIVE_DIR, METRICS_DIR, PRETRAINED_DIR, TOKENIZED_DIR, TrainParams, atomic_dir,
                           load_params, open_live, peak_memory_mb, setup_logging, write_json)
from stages.data import eval_dataloader, make_collator, train_dataloader
from stages.modeling import evaluate_split, load_classifier, load_metric

log = setup_logging()


def train(p: TrainParams, tokenized_dir: Path, pretrained_dir: Path, output_dir: Path,
          live_dir: Path | None = None, eval_batch_size: int = 32) -> dict:
    """Fine-tune ``pretrained_dir`` on the train split of ``tokenized_dir``; save the result to ``output_dir``.

    ``p.seed`` drives the head's initialisation, dropout and the order of batches. Training runs
    ``p.max_steps`` optimizer steps if set, else ``p.epochs`` epochs; the validation split is evaluated
    (batches of ``eval_batch_size``) after every epoch. With ``live_dir``, DVCLive logs go to
    ``live_dir/steps`` (``train/loss``: mean over the last ``p.log_every`` steps, ``train/lr``) and
    ``live_dir/epochs`` (``train/loss``, ``validation/loss``, ``validation/accuracy``, ``validation/f1``).

    Returns:
        metrics: ``final_loss`` (mean train loss over the last epoch), ``mean_loss`` (over all steps),
        ``steps`` (optimizer steps), ``epochs``, ``train_samples`` (examples seen), ``train_seconds``
        (wall seconds of the optimisation steps, validation excluded), ``samples_per_second`` (train
        samples/s), ``wall_seconds`` (the whole call: loading, training, validation, saving),
        ``peak_memory_mb`` (peak RSS of the process, MiB; on GPU also ``peak_gpu_memory_mb``) and
        ``parameters`` (all parameters of the classifier).
    """
    start_wall = time.perf_counter()
    accelerator = Accelerator(mixed_precision=p.mixed_precision)
    set_seed(p.seed)
    tokenizer = AutoTokenizer.from_pretrained(pretrained_dir)
    model = load_classifier(pretrained_dir)
    parameters = sum(t.numel() for t in model.parameters())
    tokenized = load_from_disk(str(tokenized_dir))
    collator = make_collator(tokenizer)
    train_dl = train_dataloader(tokenized["train"], collator, p.batch_size, p.seed)
    val_dl = eval_dataloader(tokenized["validation"], collator, eval_batch_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=p.lr, weight_decay=p.weight_decay)
    model, optimizer, train_dl, val_dl = accelerator.prepare(model, optimizer, train_dl, val_dl)

    # len(train_dl) is per process after prepare, so the schedule is sized in this process's optimizer steps.
    num_training_steps = p.max_steps or p.epochs * len(train_dl)
    num_epochs = math.ceil(num_training_steps / len(train_dl))
    lr_scheduler = get_scheduler(
        p.scheduler, optimizer=optimizer, num_warmup_steps=p.warmup_steps, num_training_steps=num_training_steps
    )
    log.info("Training %d steps (%d epochs of %d batches of %d) on %s, lr %g, %s schedule, warmup %d",
             num_training_steps, num_epochs, len(train_dl), p.batch_size, accelerator.device, p.lr, p.scheduler, p.warmup_steps)

    logging_enabled = live_dir is not None and accelerator.is_main_process
    live_steps = open_live(Path(live_dir) / "steps") if logging_enabled else None
    live_epochs = open_live(Path(live_dir) / "epochs") if logging_enabled else None
    if live_steps:
        live_steps.log_params(p.model_dump())

    losses, epoch_losses, samples, step, train_seconds = [], [], 0, 0, 0.0
    progress = tqdm(total=num_training_steps, desc="train", unit="step", disable=not accelerator.is_local_main_process)
    for epoch in range(1, num_epochs + 1):
        model.train()
        epoch_losses = []
        epoch_start = time.perf_counter()
        for batch in train_dl:
            outputs = model(**batch)
            loss = outputs.loss
            accelerator.backward(loss)
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()

            step += 1
            samples += batch["labels"].shape[0] * accelerator.num_processes
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
            accelerator.unwrap_model(model).save_pretrained(tmp)
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
    }
    if torch.cuda.is_available():
        metrics["peak_gpu_memory_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return metrics


def main() -> None:
    params = load_params()
    metrics = train(params.train, TOKENIZED_DIR, PRETRAINED_DIR, FINETUNED_DIR, LIVE_DIR / "train", params.evaluate.batch_size)
    log.info("Train metrics: %s", metrics)
    write_json(METRICS_DIR / "train.json", metrics)


if __name__ == "__main__":
    main()
