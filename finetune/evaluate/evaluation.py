"""Scoring one split: the course's evaluation loop (logits, loss) and the task's metric, loaded from the local
module finetune/evaluate/glue_metric.py.
"""

from __future__ import annotations

from pathlib import Path

import evaluate
import numpy as np
import pandas as pd
import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from finetune.tasks import Task

METRIC_SCRIPT = Path(__file__).with_name("glue_metric.py")  # loaded by path: finetune.code counts it as run code


def load_metric(task: Task) -> evaluate.EvaluationModule:
    """The task's metric, loaded offline by path from glue_metric.py under ``task.metric_config`` (see that module)."""
    return evaluate.load(str(METRIC_SCRIPT), config_name=task.metric_config)


def predictions_of(logits: torch.Tensor, task: Task) -> torch.Tensor:
    """Class ids (argmax) ``[examples]`` of logits ``[examples, num_labels]``; for regression, scores ``[examples]``."""
    return logits[:, 0] if task.is_regression else logits.argmax(dim=-1)


def with_predictions(table: pd.DataFrame, logits: torch.Tensor, task: Task) -> pd.DataFrame:
    """``table`` (one row per example, in the order of ``logits`` ``[examples, num_labels]``) plus ``prediction`` (the
    class name, or the score rounded to 5 decimals) and, for classification, ``probability_<name>`` per class (softmax,
    5 decimals)."""
    predicted = predictions_of(logits, task).numpy()
    if task.is_regression:
        return table.assign(prediction=predicted.round(5))
    probabilities = logits.softmax(dim=-1).numpy().round(5)
    return table.assign(prediction=np.array(task.label_names)[predicted],
                        **{f"probability_{name}": probabilities[:, i] for i, name in enumerate(task.label_names)})


def loss_of(logits: torch.Tensor, labels: torch.Tensor, task: Task) -> torch.Tensor:
    """Summed loss of a batch (a scalar): cross-entropy for classification, squared error for regression; ``logits``
    ``[batch, num_labels]``, ``labels`` class ids or scores ``[batch]``."""
    if task.is_regression:
        return torch.nn.functional.mse_loss(logits[:, 0], labels.float(), reduction="sum")
    return torch.nn.functional.cross_entropy(logits, labels, reduction="sum")


@torch.no_grad()
def split_logits(model: PreTrainedModel, dataloader: DataLoader, accelerator: Accelerator,
                 desc: str = "evaluate") -> tuple[torch.Tensor, torch.Tensor | None]:
    """The course's evaluation loop: each batch forwarded without gradients, gathered across processes
    (``accelerator.gather_for_metrics``: each example once). Returns, on the CPU in the dataloader's order, logits
    ``[examples, num_labels]`` (float32) and labels ``[examples]``, or None when the batches carry none. ``desc``
    labels the progress bar."""
    model.eval()
    all_logits, all_labels = [], []
    for batch in tqdm(dataloader, desc=desc, unit="batch", leave=False,
                      disable=not accelerator.is_local_main_process):
        labels = batch.pop("labels", None)
        all_logits.append(accelerator.gather_for_metrics(model(**batch).logits).float().cpu())
        if labels is not None:
            all_labels.append(accelerator.gather_for_metrics(labels).cpu())
    return torch.cat(all_logits), torch.cat(all_labels) if all_labels else None


def evaluate_split(model: PreTrainedModel, dataloader: DataLoader, accelerator: Accelerator, task: Task,
                   metric: evaluate.EvaluationModule | None, desc: str = "evaluate") -> tuple[dict, torch.Tensor]:
    """Evaluate one split: ``(metrics, logits)``, its logits (``split_logits``) ``[examples, num_labels]`` on the CPU in
    the dataloader's order, and metrics ``{"loss", <the task's metrics>}`` (loss: mean cross-entropy, or mean squared
    error for regression, per example), or ``{}`` without ``metric`` (an unlabeled split)."""
    logits, labels = split_logits(model, dataloader, accelerator, desc)
    if metric is None:
        return {}, logits
    loss = loss_of(logits, labels, task).item() / labels.numel()
    return {"loss": loss, **score(metric, task, predictions_of(logits, task), labels)}, logits


def score(metric: evaluate.EvaluationModule, task: Task, predictions, references) -> dict[str, float]:
    """The task's metrics (name -> value) of ``predictions`` against ``references`` (class ids or scores
    ``[examples]``); binary own data scores the F1 of ``task.positive_label``."""
    options = {"pos_label": task.positive_label} if task.metric_config == "binary" else {}
    return metric.compute(predictions=predictions, references=references, **options)
