"""Stage 4, train: fine-tune the pretrained checkpoint on MRPC train with an explicit loop on Accelerate.

The loop of the Hugging Face course, chapter 3 "A full training" (https://huggingface.co/learn/llm-course/chapter3/4):
AdamW, a learning-rate schedule from ``transformers.get_scheduler``, ``accelerator.backward``.
Writes models/finetuned/ (model + tokenizer, save_pretrained) and metrics/train.json.
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

from stages.common import FINETUNED_DIR, METRICS_DIR, PRETRAINED_DIR, TOKENIZED_DIR, TrainParams, atomic_dir, load_params, setup_logging, write_json
from stages.data import make_collator, train_dataloader
from stages.modeling import load_classifier

log = setup_logging()


def train(p: TrainParams, tokenized_dir: Path, pretrained_dir: Path, output_dir: Path) -> dict:
    """Fine-tune ``pretrained_dir`` on the train split of ``tokenized_dir``; save the result to ``output_dir``.

    ``p.seed`` drives the head's initialisation, dropout and the order of batches. Training runs
    ``p.max_steps`` optimizer steps if set, else ``p.epochs`` epochs.

    Returns:
        metrics: ``final_loss`` (mean train loss over the last epoch), ``mean_loss`` (over all steps),
        ``steps`` (optimizer steps), ``epochs``, ``train_samples`` (examples seen), ``train_seconds``
        (wall seconds of the loop) and ``samples_per_second`` (train samples/s).
    """
    accelerator = Accelerator(mixed_precision=p.mixed_precision)
    set_seed(p.seed)
    tokenizer = AutoTokenizer.from_pretrained(pretrained_dir)
    model = load_classifier(pretrained_dir)
    train_ds = load_from_disk(str(tokenized_dir))["train"]
    train_dl = train_dataloader(train_ds, make_collator(tokenizer), p.batch_size, p.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=p.lr, weight_decay=p.weight_decay)
    model, optimizer, train_dl = accelerator.prepare(model, optimizer, train_dl)

    # len(train_dl) is per process after prepare, so the schedule is sized in this process's optimizer steps.
    num_training_steps = p.max_steps or p.epochs * len(train_dl)
    num_epochs = math.ceil(num_training_steps / len(train_dl))
    lr_scheduler = get_scheduler(
        p.scheduler, optimizer=optimizer, num_warmup_steps=p.warmup_steps, num_training_steps=num_training_steps
    )
    log.info("Training %d steps (%d epochs of %d batches of %d) on %s, lr %g, %s schedule, warmup %d",
             num_training_steps, num_epochs, len(train_dl), p.batch_size, accelerator.device, p.lr, p.scheduler, p.warmup_steps)

    losses, epoch_losses, samples, step = [], [], 0, 0
    progress = tqdm(total=num_training_steps, desc="train", unit="step", disable=not accelerator.is_local_main_process)
    start = time.perf_counter()
    model.train()
    for epoch in range(num_epochs):
        epoch_losses = []
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
            progress.set_postfix(epoch=epoch + 1, loss=f"{losses[-1]:.4f}", lr=f"{lr_scheduler.get_last_lr()[0]:.2e}")
            if step == num_training_steps:
                break
        log.info("Epoch %d/%d: mean train loss %.4f", epoch + 1, num_epochs, sum(epoch_losses) / len(epoch_losses))
    seconds = time.perf_counter() - start
    progress.close()

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        with atomic_dir(output_dir) as tmp:
            accelerator.unwrap_model(model).save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
        log.info("Saved the fine-tuned model to %s", output_dir)
    return {
        "final_loss": round(sum(epoch_losses) / len(epoch_losses), 4),
        "mean_loss": round(sum(losses) / len(losses), 4),
        "steps": step,
        "epochs": num_epochs,
        "train_samples": samples,
        "train_seconds": round(seconds, 1),
        "samples_per_second": round(samples / seconds, 2),
    }


def main() -> None:
    params = load_params().train
    metrics = train(params, TOKENIZED_DIR, PRETRAINED_DIR, FINETUNED_DIR)
    log.info("Train metrics: %s", metrics)
    write_json(METRICS_DIR / "train.json", metrics)


if __name__ == "__main__":
    main()
