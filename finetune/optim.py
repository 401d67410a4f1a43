"""The optimizer and the learning-rate schedule of the training loop."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, get_scheduler
from transformers.trainer_pt_utils import get_parameter_names

from finetune.errors import ParamsError
from finetune.params import TrainParams


def make_optimizer(model: torch.nn.Module, p: TrainParams) -> torch.optim.AdamW:
    """``torch.optim.AdamW`` with ``p.lr``; ``p.weight_decay`` on every weight except biases and LayerNorm weights.

    Excluding biases and normalisation weights from decay follows BERT's original optimizer and
    run_glue_no_trainer.py. With ``p.layer_lr_decay`` below 1, each layer gets its own learning rate
    (``layer_learning_rates``). ``p.adamw_impl`` picks the implementation: 'foreach' batches the update over
    tensors, 'fused' runs one kernel per parameter group (CPU and CUDA since torch 2.4), 'default' lets torch
    choose; all compute the same update (https://pytorch.org/docs/stable/generated/torch.optim.AdamW.html).
    """
    decay = set(get_parameter_names(model, [torch.nn.LayerNorm], ["bias", "layernorm", "rmsnorm"]))
    rates = layer_learning_rates(model, p.lr, p.layer_lr_decay)
    groups = {}
    for name, tensor in model.named_parameters():
        wd = p.weight_decay if name in decay else 0.0
        groups.setdefault((rates[name], wd), []).append(tensor)
    impl = {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}[p.adamw_impl]
    return torch.optim.AdamW([{"params": tensors, "lr": lr, "weight_decay": wd}
                              for (lr, wd), tensors in groups.items()], lr=p.lr, **impl)


# Encoder layer i of every family: encoder.layer.<i>. (BERT, RoBERTa, ELECTRA, DeBERTa-v2, MPNet),
# transformer.layer.<i>. (DistilBERT), encoder.layers.<i>. (others)
LAYER = re.compile(r"(?:^|\.)(?:encoder|transformer)\.layers?\.(\d+)\.")


def layer_learning_rates(model: torch.nn.Module, lr: float, decay: float) -> dict[str, float]:
    """The learning rate of every parameter of ``model`` under layer-wise learning-rate decay.

    Counting depth from the top: the head (classifier, pooler: everything outside the encoder) gets ``lr``, the
    last encoder layer ``lr * decay``, layer ``i`` of ``L`` ``lr * decay ** (L - i)`` (``i`` from 0) and the
    embeddings ``lr * decay ** (L + 1)``, as in ELECTRA's fine-tuning (Clark et al. 2020,
    https://arxiv.org/abs/2003.10555, appendix A: 0.8 for small models). ``decay`` 1.0 gives every parameter
    ``lr``.

    Layers are found by name (``LAYER``: ``encoder.layer.<i>.``, DistilBERT's ``transformer.layer.<i>.``) inside the
    encoder (``model.base_model``). The encoder's other weights go with the embeddings: the word, position and
    token-type embeddings and ELECTRA's ``embeddings_project``, but also the relative-position tables that all layers
    share (DeBERTa-v2's ``encoder.rel_embeddings`` and its LayerNorm, MPNet's ``encoder.relative_attention_bias``).
    A pooler inside the encoder (BERT's, RoBERTa's, MPNet's) goes with the head.

    Raises:
        ParamsError: ``decay`` is below 1 and no encoder layer is found (a model type whose layers are named
            otherwise); the message names the model type.
    """
    base = model.base_model if isinstance(model, PreTrainedModel) else model
    in_encoder = {id(t) for name, t in base.named_parameters() if ".pooler." not in f".{name}"}
    layer_of = {name: int(m.group(1)) for name, t in model.named_parameters()
                if id(t) in in_encoder and (m := LAYER.search(name))}
    if decay != 1.0 and not layer_of:
        model_type = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
        raise ParamsError(f"params.yaml: train.layer_lr_decay {decay}: no encoder layers found in this "
                          f"{model_type!r} model (no parameter named like encoder.layer.<i>. or "
                          "transformer.layer.<i>.); set train.layer_lr_decay: 1.0")
    layers = max(layer_of.values(), default=-1) + 1

    def depth(name: str, tensor: torch.Tensor) -> int:  # steps down from the head
        if name in layer_of:
            return layers - layer_of[name]
        return layers + 1 if id(tensor) in in_encoder else 0

    return {name: lr * decay ** depth(name, tensor) for name, tensor in model.named_parameters()}


@dataclass(frozen=True)
class Schedule:
    """How long a run is, in optimizer steps (each takes ``gradient_accumulation_steps`` batches per process)."""

    steps_per_epoch: int
    total_steps: int  # p.max_steps, else p.epochs x steps_per_epoch
    epochs: int  # the epochs those steps take (the last may be partial)
    warmup_steps: int  # p.warmup_steps, else p.warmup_ratio of total_steps, rounded up

    @classmethod
    def of(cls, p: TrainParams, batches_per_epoch: int) -> "Schedule":
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
