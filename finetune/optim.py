"""The optimizer and the learning-rate schedule of the training loop."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from transformers import get_scheduler
from transformers.trainer_pt_utils import get_parameter_names

from finetune.params import TrainParams


def make_optimizer(model: torch.nn.Module, p: TrainParams) -> torch.optim.AdamW:
    """``torch.optim.AdamW`` with ``p.lr``; ``p.weight_decay`` on every weight except biases and LayerNorm weights.

    Excluding biases and normalisation weights from decay follows BERT's original optimizer and
    run_glue_no_trainer.py. ``p.adamw_impl`` picks the implementation: 'foreach' batches the update over tensors,
    'fused' runs one kernel per parameter group (CPU and CUDA since torch 2.4), 'default' lets torch choose; all
    compute the same update (https://pytorch.org/docs/stable/generated/torch.optim.AdamW.html).
    """
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
        """The schedule of ``p`` for ``batches_per_epoch`` batches of this process (``len(loader)`` after
        ``accelerator.prepare``: every process takes its optimizer steps together with the others)."""
        steps_per_epoch = math.ceil(batches_per_epoch / p.gradient_accumulation_steps)
        total_steps = p.max_steps or p.epochs * steps_per_epoch
        return cls(steps_per_epoch=steps_per_epoch, total_steps=total_steps,
                   epochs=math.ceil(total_steps / steps_per_epoch),
                   warmup_steps=p.warmup_steps or math.ceil(p.warmup_ratio * total_steps))


def make_scheduler(optimizer: torch.optim.Optimizer, p: TrainParams, schedule: Schedule):
    """``transformers.get_scheduler(p.scheduler)`` over ``schedule.total_steps`` optimizer steps with its warmup.

    Step it by hand after each real optimizer step (not prepared by accelerate, which would step it per batch).
    """
    return get_scheduler(p.scheduler, optimizer=optimizer, num_warmup_steps=schedule.warmup_steps,
                         num_training_steps=schedule.total_steps)
