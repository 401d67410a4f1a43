"""The two ways the project's train stage is measured against, each with the course's settings (batch 8, lr 5e-5,
linear, no warmup, 3 epochs, fp32) on GLUE MRPC: the loop of the course chapter "A full training", as written, and
transformers.Trainer. Each returns train samples, optimizer steps, train seconds, wall seconds (tokenize + train +
evaluate) and validation accuracy and F1; ``benchmarks.benchmark`` runs each in its own subprocess."""

from __future__ import annotations

import tempfile
import time

import evaluate  # noqa: F401  (imported as the course does; the metric module is the project's local one)
import torch
from datasets import load_from_disk
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding, get_scheduler

from benchmarks.machine import sync
from benchmarks.workspace import PRETRAINED_DIR, RAW_DIR
from finetune.evaluate.evaluation import load_metric
from finetune.tasks import glue_task

# ---------------------------------------------------------------- the course's loop

def course_dataloaders() -> tuple:
    """The course's data preparation, as written: data/raw tokenized as pairs, padded per batch, batch 8; the
    train loader shuffled. Returns ``(train_dataloader, eval_dataloader)`` (eval: the validation split)."""
    raw_datasets = load_from_disk(str(RAW_DIR))
    tokenizer = AutoTokenizer.from_pretrained(PRETRAINED_DIR)

    def tokenize_function(example):
        return tokenizer(example["sentence1"], example["sentence2"], truncation=True)

    tokenized_datasets = raw_datasets.map(tokenize_function, batched=True, keep_in_memory=True)
    data_collator = DataCollatorWithPadding(tokenizer=tokenizer)
    tokenized_datasets = tokenized_datasets.remove_columns(["sentence1", "sentence2", "idx"])
    tokenized_datasets = tokenized_datasets.rename_column("label", "labels")
    tokenized_datasets.set_format("torch")
    train_dataloader = DataLoader(tokenized_datasets["train"], shuffle=True, batch_size=8, collate_fn=data_collator)
    eval_dataloader = DataLoader(tokenized_datasets["validation"], batch_size=8, collate_fn=data_collator)
    return train_dataloader, eval_dataloader


def course_evaluate(model, eval_dataloader, device: torch.device) -> dict:
    """The course's evaluation loop: argmax predictions over ``eval_dataloader`` into the GLUE MRPC metric (the
    project's local metric module). Returns ``{"accuracy": ..., "f1": ...}``."""
    metric = load_metric(glue_task("mrpc"))
    model.eval()
    for batch in eval_dataloader:
        batch = {k: v.to(device) for k, v in batch.items()}
        with torch.no_grad():
            outputs = model(**batch)
        predictions = torch.argmax(outputs.logits, dim=-1)
        metric.add_batch(predictions=predictions, references=batch["labels"])
    return metric.compute()


def course_loop(max_steps: int | None) -> dict:
    """The loop of the course chapter "A full training", as written: random batches, fp32, batch 8, lr 5e-5.

    Besides the common keys, returns ``real_tokens`` (attention-mask ones trained on) and ``padding_fraction``
    (the share of padded positions in the train batches)."""
    start = time.perf_counter()
    train_dataloader, eval_dataloader = course_dataloaders()

    torch.manual_seed(42)
    model = AutoModelForSequenceClassification.from_pretrained(PRETRAINED_DIR, num_labels=2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
    num_epochs = 3
    num_training_steps = max_steps or num_epochs * len(train_dataloader)
    lr_scheduler = get_scheduler("linear", optimizer=optimizer, num_warmup_steps=0,
                                 num_training_steps=num_training_steps)
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    model.to(device)

    progress_bar = tqdm(range(num_training_steps))
    train_start, samples, tokens, padded, step = time.perf_counter(), 0, 0, 0, 0
    model.train()
    while step < num_training_steps:
        for batch in train_dataloader:
            batch = {k: v.to(device) for k, v in batch.items()}
            outputs = model(**batch)
            loss = outputs.loss
            loss.backward()
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
            progress_bar.update(1)
            samples, step = samples + len(batch["labels"]), step + 1
            tokens, padded = tokens + int(batch["attention_mask"].sum()), padded + batch["attention_mask"].numel()
            if step == num_training_steps:
                break
    sync()
    train_seconds = time.perf_counter() - train_start

    result = course_evaluate(model, eval_dataloader, device)
    return {"samples": samples, "real_tokens": tokens, "steps": step, "train_seconds": train_seconds,
            "padding_fraction": 1 - tokens / padded, "wall_s": time.perf_counter() - start, **result}


# ---------------------------------------------------------------- transformers.Trainer

def trainer(max_steps: int | None) -> dict:
    """transformers.Trainer with the course's settings: batch 8, lr 5e-5, linear, no warmup, 3 epochs, fp32."""
    from transformers import Trainer, TrainingArguments  # heavy, this way's own: the others' peak RSS stays their own

    start = time.perf_counter()
    raw = load_from_disk(str(RAW_DIR))
    tokenizer = AutoTokenizer.from_pretrained(PRETRAINED_DIR)
    tokenized = raw.map(lambda b: tokenizer(b["sentence1"], b["sentence2"], truncation=True), batched=True,
                        keep_in_memory=True)
    model = AutoModelForSequenceClassification.from_pretrained(PRETRAINED_DIR, num_labels=2)
    metric = load_metric(glue_task("mrpc"))

    def compute_metrics(eval_pred):
        logits, labels = eval_pred
        return metric.compute(predictions=logits.argmax(-1), references=labels)

    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=8, per_device_eval_batch_size=8,
                                 learning_rate=5e-5, num_train_epochs=3, max_steps=max_steps or -1,
                                 lr_scheduler_type="linear", warmup_steps=0, weight_decay=0.0, seed=42,
                                 save_strategy="no", eval_strategy="no", report_to=[], logging_steps=50,
                                 use_cpu=not torch.cuda.is_available())
        run = Trainer(model=model, args=args, train_dataset=tokenized["train"],
                      data_collator=DataCollatorWithPadding(tokenizer),
                      compute_metrics=compute_metrics, processing_class=tokenizer)
        train_start = time.perf_counter()
        output = run.train()
        sync()
        train_seconds = time.perf_counter() - train_start
        result = run.evaluate(tokenized["validation"])
    steps = output.global_step
    return {"samples": steps * 8, "steps": steps, "train_seconds": train_seconds, "wall_s": time.perf_counter() - start,
            "accuracy": result["eval_accuracy"], "f1": result["eval_f1"]}
