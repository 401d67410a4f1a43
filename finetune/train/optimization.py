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
from finetune.params import LOOP_SCHEDULER_ARGS


def make_optimizer(model: torch.nn.Module, lr: float, weight_decay: float, impl: str = "default") -> torch.optim.AdamW:
    """AdamW at ``lr`` with ``weight_decay`` on every weight but biases and LayerNorm and RMSNorm weights (as
    run_glue_no_trainer.py) (https://pytorch.org/docs/stable/generated/torch.optim.AdamW.html); ``impl``
    (``train.adamw_impl``): 'default', 'foreach' or 'fused'."""
    decay = set(get_parameter_names(model, [torch.nn.LayerNorm], ["bias", "layernorm", "rmsnorm"]))
    groups = [{"params": [t for n, t in model.named_parameters() if n in decay], "weight_decay": weight_decay},
              {"params": [t for n, t in model.named_parameters() if n not in decay], "weight_decay": 0.0}]
    options = {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}[impl]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, **options)


@dataclass(frozen=True)
class Schedule:
    """How long a run is, in optimizer steps (each takes ``gradient_accumulation_steps`` batches per process)."""

    steps_per_epoch: int
    total_steps: int  # train.max_steps, else train.epochs x steps_per_epoch
    epochs: int  # the epochs those steps take (the last may be partial)
    warmup_steps: int  # train.warmup_steps, else train.warmup_ratio of total_steps, rounded up

    @classmethod
    def of(cls, batches_per_epoch: int, accumulation: int, epochs: int, max_steps: int | None = None,
           warmup_steps: int = 0, warmup_ratio: float = 0.0) -> Schedule:
        """The schedule of ``batches_per_epoch`` per process (``len(loader)`` after ``accelerator.prepare``) in
        optimizer steps of ``accumulation`` batches, over ``max_steps`` or else ``epochs``; ``warmup_steps`` or else
        ``warmup_ratio`` of the steps warm up (the ``train.*`` params of the same names)."""
        steps_per_epoch = math.ceil(batches_per_epoch / accumulation)
        total_steps = max_steps or epochs * steps_per_epoch
        return cls(steps_per_epoch=steps_per_epoch, total_steps=total_steps,
                   epochs=math.ceil(total_steps / steps_per_epoch),
                   warmup_steps=warmup_steps or math.ceil(warmup_ratio * total_steps))


# Schedulers whose step() needs a metric; the loop steps the schedule once per optimizer step, without one.
METRIC_SCHEDULERS = (SchedulerType.REDUCE_ON_PLATEAU, SchedulerType.GREEDY)


def make_scheduler(optimizer: torch.optim.Optimizer, kind: str, kwargs: dict, schedule: Schedule,
                   lr: float) -> torch.optim.lr_scheduler.LRScheduler:
    """``transformers.get_scheduler(kind)`` over ``schedule``, with the scheduler's own ``kwargs``
    (``train.scheduler`` and ``train.scheduler_kwargs``; ``lr``, ``train.lr``, only names the peak in an error)
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
                          f"({lr:g}); use at most {schedule.total_steps}, or train.warmup_ratio")
    name = SchedulerType(kind)
    own = [arg for arg in inspect.signature(TYPE_TO_SCHEDULER_FUNCTION[name]).parameters
           if arg not in LOOP_SCHEDULER_ARGS]
    if unknown := [key for key in kwargs if key not in own]:
        raise ParamsError(f"params.yaml: train.scheduler_kwargs: {', '.join(unknown)}: not an argument of the "
                          f"{kind!r} scheduler (its own: {', '.join(own) or 'none'})")
    try:
        made = get_scheduler(name, optimizer=optimizer, num_warmup_steps=schedule.warmup_steps,
                             num_training_steps=schedule.total_steps,
                             scheduler_specific_kwargs=dict(kwargs))
        for lr_lambda in getattr(made, "lr_lambdas", []):
            for step in range(schedule.total_steps + 1):
                lr_lambda(step)
    except (TypeError, ValueError, ArithmeticError) as err:
        raise ParamsError(f"params.yaml: train.scheduler_kwargs: the {kind!r} scheduler refuses "
                          f"{dict(kwargs)}: {' '.join(str(err).split())}") from None
    return made
