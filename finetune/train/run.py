"""What one training run works with (``Run``), built once by ``build_run``."""

from __future__ import annotations

import inspect
import logging
import math
from dataclasses import dataclass

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from datasets import Dataset, load_from_disk
from transformers import AutoTokenizer, PreTrainedTokenizerBase, SchedulerType, get_scheduler
from transformers.optimization import TYPE_TO_SCHEDULER_FUNCTION
from transformers.trainer_pt_utils import get_parameter_names

from finetune.data.batches import make_collator, train_dataloader
from finetune.distill.loss import Distillation, load_teacher, with_teacher_logits
from finetune.errors import ParamsError
from finetune.evaluate.collapse import constant_baseline
from finetune.evaluate.evaluation import load_metric
from finetune.hardware import resolve_mixed_precision
from finetune.inference.predictor import Predictor
from finetune.modeling import load_classifier
from finetune.params import LOOP_SCHEDULER_ARGS, EvaluateParams, Params, TrainParams
from finetune.paths import Paths
from finetune.runtime import make_accelerator, set_cpu_threads
from finetune.tasks import Task
from finetune.train.resume import run_fingerprint
from finetune.train.trial import TrialReport

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
    predictor: Predictor  # the model in training, for validation (``evaluation``'s batches)
    batch_order: torch.Generator  # reseeded every epoch: the batch order depends on seed and epoch only
    schedule: Schedule
    fingerprint: str
    mixed_precision: str
    parameters: int
    baseline: dict  # the constant model of train's labels on validation (finetune.evaluate.collapse.constant_baseline)
    validation: Dataset | None = None  # the tokenized validation split
    evaluation: EvaluateParams | None = None
    resumed_from: int = 0  # the optimizer step a resumed run continued from (0: a fresh run)
    compile_seconds: float | None = None  # the first optimizer step, with train.torch_compile
    distill: Distillation | None = None  # with distill.teacher: the loss on the teacher's logits too
    trial: TrialReport | None = None  # in a search (tools.tune): the Optuna trial each validation is reported to
    pruned: bool = False  # the search's pruner stopped the run

    @property
    def unit(self) -> str:
        """'epoch' (an evaluation after every epoch) or 'step' (every ``train.eval_every_steps``)."""
        return "step" if self.p.eval_every_steps else "epoch"


def build_run(params: Params, paths: Paths) -> Run:
    """The run of ``params``, prepared for the processes and not yet resumed
    (https://huggingface.co/learn/llm-course/chapter3/4).

    Raises:
        ParamsError: ``train.metric_for_best`` is not a metric of the task, ``train.warmup_steps`` is more than the
            run's steps, or ``train.scheduler_kwargs`` does not fit ``train.scheduler`` (``make_scheduler``).
        CheckpointError: ``paths.pretrained`` can't be loaded.
        TeacherError: with ``distill.teacher``, data/teacher does not fit the task or the train split.
    """
    p = params.train
    threads = set_cpu_threads(p.num_threads)
    mixed_precision = resolve_mixed_precision(p.mixed_precision)
    accelerator = make_accelerator(p.ddp_timeout, mixed_precision=mixed_precision,
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
    optimizer = make_optimizer(model, p)
    if p.torch_compile:
        model = torch.compile(model)
    model, optimizer, train_dl = accelerator.prepare(model, optimizer, train_dl)
    schedule = Schedule.of(p, len(train_dl))
    scheduler = make_scheduler(optimizer, p, schedule)
    accelerator.register_for_checkpointing(scheduler)
    log.info("Training up to %d optimizer steps (%d epochs of %d) on %d process(es) (%s), batch %d x %d accumulation, "
             "mixed precision %s, lr %g, %s schedule%s, %d warmup steps, %s head, %d CPU threads",
             schedule.total_steps, schedule.epochs, schedule.steps_per_epoch, accelerator.num_processes,
             accelerator.device, p.batch_size, p.gradient_accumulation_steps, mixed_precision, p.lr,
             p.scheduler, f" {p.scheduler_kwargs}" if p.scheduler_kwargs else "", schedule.warmup_steps,
             params.model.pooling, threads)
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
    predictor = Predictor(model, tokenizer, task, params.tokenize.max_length, accelerator=accelerator)
    return Run(p, task, metric_for_best, accelerator, tokenizer, model, optimizer, scheduler, train_dl, predictor,
               batch_order, schedule, fingerprint, mixed_precision, parameters, baseline,
               validation=tokenized["validation"], evaluation=params.evaluate, distill=distill)


def make_optimizer(model: torch.nn.Module, p: TrainParams) -> torch.optim.AdamW:
    """AdamW with ``p.weight_decay`` on every weight but biases and LayerNorm and RMSNorm weights (as
    run_glue_no_trainer.py) (https://pytorch.org/docs/stable/generated/torch.optim.AdamW.html)."""
    decay = set(get_parameter_names(model, [torch.nn.LayerNorm], ["bias", "layernorm", "rmsnorm"]))
    groups = [{"params": [t for n, t in model.named_parameters() if n in decay], "weight_decay": p.weight_decay},
              {"params": [t for n, t in model.named_parameters() if n not in decay], "weight_decay": 0.0}]
    impl = {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}[p.adamw_impl]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=p.lr, **impl)


@dataclass(frozen=True)
class Schedule:
    """How long a run is, in optimizer steps (each takes ``gradient_accumulation_steps`` batches per process)."""

    steps_per_epoch: int
    total_steps: int  # p.max_steps, else p.epochs x steps_per_epoch
    epochs: int  # the epochs those steps take (the last may be partial)
    warmup_steps: int  # p.warmup_steps, else p.warmup_ratio of total_steps, rounded up

    @classmethod
    def of(cls, p: TrainParams, batches_per_epoch: int) -> Schedule:
        """The schedule of ``p``; ``batches_per_epoch`` per process (``len(loader)`` after ``accelerator.prepare``)."""
        steps_per_epoch = math.ceil(batches_per_epoch / p.gradient_accumulation_steps)
        total_steps = p.max_steps or p.epochs * steps_per_epoch
        return cls(steps_per_epoch=steps_per_epoch, total_steps=total_steps,
                   epochs=math.ceil(total_steps / steps_per_epoch),
                   warmup_steps=p.warmup_steps or math.ceil(p.warmup_ratio * total_steps))


# Schedulers whose step() needs a metric; the loop steps the schedule once per optimizer step, without one.
METRIC_SCHEDULERS = (SchedulerType.REDUCE_ON_PLATEAU, SchedulerType.GREEDY)


def make_scheduler(optimizer: torch.optim.Optimizer, p: TrainParams,
                   schedule: Schedule) -> torch.optim.lr_scheduler.LRScheduler:
    """``transformers.get_scheduler(p.scheduler)`` over ``schedule``, with ``p.scheduler_kwargs``
    (https://huggingface.co/docs/transformers/main_classes/optimizer_schedules). The caller steps it once per
    optimizer step (accelerate would step a prepared one per batch).

    Raises:
        ParamsError: ``train.warmup_steps`` is more than the run's steps; ``train.scheduler_kwargs`` names an argument
            the scheduler does not take, or the scheduler refuses a value (every step's learning rate is computed
            here, so a bad value fails before training).
    """
    if schedule.warmup_steps > schedule.total_steps:
        raise ParamsError(f"params.yaml: train.warmup_steps: {schedule.warmup_steps} is more than the run's "
                          f"{schedule.total_steps} optimizer steps, so the learning rate would never reach train.lr "
                          f"({p.lr:g}); use at most {schedule.total_steps}, or train.warmup_ratio")
    name = SchedulerType(p.scheduler)
    own = [arg for arg in inspect.signature(TYPE_TO_SCHEDULER_FUNCTION[name]).parameters
           if arg not in LOOP_SCHEDULER_ARGS]
    if unknown := [key for key in p.scheduler_kwargs if key not in own]:
        raise ParamsError(f"params.yaml: train.scheduler_kwargs: {', '.join(unknown)}: not an argument of the "
                          f"{p.scheduler!r} scheduler (its own: {', '.join(own) or 'none'})")
    try:
        scheduler = get_scheduler(name, optimizer=optimizer, num_warmup_steps=schedule.warmup_steps,
                                  num_training_steps=schedule.total_steps,
                                  scheduler_specific_kwargs=dict(p.scheduler_kwargs))
        for lr_lambda in getattr(scheduler, "lr_lambdas", []):
            for step in range(schedule.total_steps + 1):
                lr_lambda(step)
    except (TypeError, ValueError, ArithmeticError) as err:
        raise ParamsError(f"params.yaml: train.scheduler_kwargs: the {p.scheduler!r} scheduler refuses "
                          f"{dict(p.scheduler_kwargs)}: {' '.join(str(err).split())}") from None
    return scheduler
