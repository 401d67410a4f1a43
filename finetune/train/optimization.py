"""What a run optimizes with: AdamW (``make_optimizer``), the run's length in optimizer steps (``Schedule``) and the
learning-rate schedule over it (``make_scheduler``)."""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass

import torch
from transformers import SchedulerType, get_scheduler
from transformers.optimization import TYPE_TO_SCHEDULER_FUNCTION
from transformers.trainer_pt_utils import get_parameter_names

from finetune.errors import ParamsError
from finetune.params import LOOP_SCHEDULER_ARGS, TrainParams


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
