"""Scoring one split: its logits (``finetune.inference.predictor.Predictor``), the loss and the task's metric, loaded
from the local module finetune/evaluate/glue_metric.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import evaluate
import torch

from finetune.params import EvaluateParams
from finetune.tasks import Task, predictions_of

if TYPE_CHECKING:
    from datasets import Dataset

    from finetune.inference.predictor import Predictor

METRIC_SCRIPT = Path(__file__).with_name("glue_metric.py")  # loaded by path: finetune.code counts it as run code


def load_metric(task: Task) -> evaluate.EvaluationModule:
    """The task's metric, loaded offline by path from glue_metric.py under ``task.metric_config`` (see that module)."""
    return evaluate.load(str(METRIC_SCRIPT), config_name=task.metric_config)


def loss_of(logits: torch.Tensor, labels: torch.Tensor, task: Task) -> torch.Tensor:
    """Summed loss of a batch (a scalar): cross-entropy for classification, squared error for regression; ``logits``
    ``[batch, num_labels]``, ``labels`` class ids or scores ``[batch]``."""
    if task.is_regression:
        return torch.nn.functional.mse_loss(logits[:, 0], labels.float(), reduction="sum")
    return torch.nn.functional.cross_entropy(logits, labels, reduction="sum")


def evaluate_split(predictor: Predictor, rows: Dataset, metric: evaluate.EvaluationModule | None,
                   p: EvaluateParams, desc: str = "evaluate") -> tuple[dict, torch.Tensor]:
    """Evaluate one tokenized split: ``(metrics, logits)``, its logits ``[examples, num_labels]`` in row order
    (``predictor.logits`` in batches of ``p.batch_size``, sorted by length with ``p.sort_by_length``), and metrics
    ``{"loss", <the task's metrics>}`` against its ``labels`` (loss: mean cross-entropy, or mean squared error for
    regression, per example), or ``{}`` without ``metric`` (an unlabeled split). ``desc`` labels the progress bar."""
    logits = predictor.logits(rows, batch_size=p.batch_size, sort_by_length=p.sort_by_length, desc=desc)
    if metric is None:
        return {}, logits
    task, labels = predictor.task, torch.tensor(rows["labels"])
    loss = loss_of(logits, labels, task).item() / labels.numel()
    return {"loss": loss, **score(metric, task, predictions_of(logits, task), labels)}, logits


def score(metric: evaluate.EvaluationModule, task: Task, predictions, references) -> dict[str, float]:
    """The task's metrics (name -> value) of ``predictions`` against ``references`` (class ids or scores
    ``[examples]``); binary own data scores the F1 of ``task.positive_label``."""
    options = {"pos_label": task.positive_label} if task.metric_config == "binary" else {}
    return metric.compute(predictions=predictions, references=references, **options)
