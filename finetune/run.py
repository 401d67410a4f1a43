"""The run: everything one training run works with (Accelerator, tokenizer, model, DataLoaders, optimizer,
schedule, distillation), built once from params and the stages' artifacts by ``build_run``, for the loop in
finetune/training.py.

Setup as in the Hugging Face course chapter "A full training" and accelerate's examples/nlp_example.py: the model
and the DataLoaders, then ``accelerator.prepare`` of model, optimizer and DataLoaders together, then the schedule
sized in optimizer steps of the prepared train DataLoader (finetune/optim.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from datasets import load_from_disk
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from finetune.batches import evaluation_loader, make_collator, train_dataloader
from finetune.collapse import constant_baseline
from finetune.distill import Distillation, load_teacher, with_teacher_logits
from finetune.errors import ParamsError
from finetune.evaluation import load_metric
from finetune.hardware import resolve_mixed_precision
from finetune.modeling import load_classifier
from finetune.optim import Schedule, make_optimizer, make_scheduler
from finetune.params import Params, TrainParams
from finetune.paths import Paths
from finetune.resume import run_fingerprint
from finetune.runtime import make_accelerator, set_cpu_threads
from finetune.tasks import Task
from finetune.trial import TrialReport

log = logging.getLogger(__name__)


@dataclass
class Run:
    """What one training run works with, built once by ``build_run``."""

    p: TrainParams
    task: Task
    metric_for_best: str  # train.metric_for_best, or the task's main metric
    accelerator: Accelerator
    tokenizer: PreTrainedTokenizerBase
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    train_dl: torch.utils.data.DataLoader
    val_dl: torch.utils.data.DataLoader
    batch_order: torch.Generator  # reseeded every epoch: the batch order depends on seed and epoch only
    schedule: Schedule
    fingerprint: str
    mixed_precision: str
    parameters: int
    baseline: dict  # the constant model of train's labels on validation (finetune.collapse.constant_baseline)
    resumed_from: int = 0  # the optimizer step a resumed run continued from (0: a fresh run)
    compile_seconds: float | None = None  # the first optimizer step, with train.torch_compile
    distill: Distillation | None = None  # with distill.teacher: the loss on the teacher's logits too
    trial: TrialReport | None = None  # in a search (tools.tune): the Optuna trial each validation is reported to
    pruned: bool = False  # the search's pruner stopped the run

    @property
    def unit(self) -> str:
        """What evaluations are counted in: 'epoch' (one after every epoch) or 'step' (``train.eval_every_steps``)."""
        return "step" if self.p.eval_every_steps else "epoch"


def build_run(params: Params, paths: Paths) -> Run:
    """Accelerator, seed, tokenizer, model, DataLoaders, optimizer and schedule, prepared for the processes."""
    p = params.train
    threads = set_cpu_threads(p.num_threads)
    mixed_precision = resolve_mixed_precision(p.mixed_precision)
    accelerator = make_accelerator(mixed_precision=mixed_precision,
                                   gradient_accumulation_steps=p.gradient_accumulation_steps)
    set_seed(p.seed)
    tokenizer = AutoTokenizer.from_pretrained(paths.pretrained)
    task = Task.load(paths.tokenized)
    try:
        metric_for_best, _ = task.metric_for_best(p.metric_for_best)
    except ValueError as err:
        raise ParamsError(f"params.yaml: {err}") from None
    tokenized = load_from_disk(str(paths.tokenized))
    teacher = load_teacher(params.distill, paths.teacher, task, tokenized["train"])  # None: distillation off
    train_rows = tokenized["train"] if teacher is None else \
        with_teacher_logits(tokenized["train"], teacher, tokenizer, params.tokenize.max_length, task)
    model = load_classifier(paths.pretrained, task, params.model.pooling)
    parameters = sum(t.numel() for t in model.parameters())
    train_dl = train_dataloader(train_rows, make_collator(tokenizer), p.batch_size, p.seed, p.group_by_length)
    batch_order = train_dl.generator
    val_dl, _ = evaluation_loader(tokenized["validation"], tokenizer, params.evaluate)
    optimizer = make_optimizer(model, p)
    if p.torch_compile:
        model = torch.compile(model)
    model, optimizer, train_dl, val_dl = accelerator.prepare(model, optimizer, train_dl, val_dl)
    schedule = Schedule.of(p, len(train_dl))
    scheduler = make_scheduler(optimizer, p, schedule)
    accelerator.register_for_checkpointing(scheduler)
    log.info("Training up to %d optimizer steps (%d epochs of %d) on %d process(es) (%s), batch %d x %d accumulation, "
             "mixed precision %s, lr %g, %s schedule, %d warmup steps, %s head, %d CPU threads",
             schedule.total_steps, schedule.epochs, schedule.steps_per_epoch, accelerator.num_processes,
             accelerator.device, p.batch_size, p.gradient_accumulation_steps, mixed_precision, p.lr,
             p.scheduler, schedule.warmup_steps, params.model.pooling, threads)
    distill = None
    if teacher is not None:
        d = params.distill
        distill = Distillation(d.alpha, d.temperature, task.is_regression, teacher.identity, d.transfer.weight)
        log.info("Distilling from %s (%s): loss = %g x hard + %g x soft, temperature %g%s", d.teacher,
                 teacher.identity["model_type"], 1 - d.alpha, d.alpha, d.temperature,
                 "" if teacher.transfer is None else f"; {len(teacher.transfer)} transfer pairs among the "
                 f"{len(train_rows)} train rows, their loss {d.transfer.weight:g} x soft")
    fingerprint = run_fingerprint(params, paths, tokenized, accelerator.num_processes, mixed_precision,
                                  distilling=teacher is not None)
    baseline = constant_baseline(task, load_metric(task), tokenized["train"]["labels"],
                                 tokenized["validation"]["labels"])
    return Run(p, task, metric_for_best, accelerator, tokenizer, model, optimizer, scheduler, train_dl, val_dl,
               batch_order, schedule, fingerprint, mixed_precision, parameters, baseline,
               distill=distill)

