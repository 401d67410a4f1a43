"""Evaluation: the course's evaluation loop over one split, and the task's metric (finetune/evaluate/glue_metric.py)."""

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
    """The task's metric: GLUE's for a GLUE task (e.g. MRPC: accuracy and F1 of label 1), else accuracy and F1
    (binary) or macro-F1, or Pearson, Spearman and MSE (regression).

    ``evaluate.load("glue", "mrpc")`` fetches its script from the Hub; this loads the project's local module
    (finetune/evaluate/glue_metric.py) by path instead, so it works offline.
    """
    return evaluate.load(str(METRIC_SCRIPT), config_name=task.metric_config)


def predictions_of(logits: torch.Tensor, task: Task) -> torch.Tensor:
    """Predicted class ids ``[examples]`` (argmax of ``logits [examples, num_labels]``), or the predicted score
    ``[examples]`` for regression (``logits [examples, 1]``)."""
    return logits[:, 0] if task.is_regression else logits.argmax(dim=-1)


def with_predictions(table: pd.DataFrame, logits: torch.Tensor, task: Task) -> pd.DataFrame:
    """``table`` (one row per example, in the order of ``logits [examples, num_labels]``) with ``prediction`` (the
    class name, or the score for regression, 5 decimals) and for classification ``probability_<name>`` per class
    (softmax, 5 decimals)."""
    predicted = predictions_of(logits, task).numpy()
    if task.is_regression:
        return table.assign(prediction=predicted.round(5))
    probabilities = logits.softmax(dim=-1).numpy().round(5)
    return table.assign(prediction=np.array(task.label_names)[predicted],
                        **{f"probability_{name}": probabilities[:, i] for i, name in enumerate(task.label_names)})


def loss_of(logits: torch.Tensor, labels: torch.Tensor, task: Task) -> torch.Tensor:
    """Summed loss of a batch: cross-entropy for classification, squared error for regression (what the model's
    own loss averages: the family's ``*ForSequenceClassification`` or ``MeanPooledForSequenceClassification`` with
    ``problem_type``)."""
    if task.is_regression:
        return torch.nn.functional.mse_loss(logits[:, 0], labels.float(), reduction="sum")
    return torch.nn.functional.cross_entropy(logits, labels, reduction="sum")


@torch.no_grad()
def split_logits(model: PreTrainedModel, dataloader: DataLoader, accelerator: Accelerator,
                 desc: str = "evaluate") -> tuple[torch.Tensor, torch.Tensor | None]:
    """The course's evaluation loop: forward each batch without gradients.

    ``accelerator.gather_for_metrics`` collects every process's batch and drops the samples that
    distributed sampling duplicates, so each example counts once.

    Returns:
        ``(logits, labels)`` on the CPU in the dataloader's order: logits ``[examples, num_labels]`` (float32) and
        labels ``[examples]``, or None when the batches carry none.
    """
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
    """Evaluate one split: its logits (``split_logits``), then the loss and ``metric.compute``.

    Args:
        metric: None for an unlabeled split (loss and metrics are then omitted).
        desc: the progress bar's label.

    Returns:
        ``(metrics, logits)``: metrics ``{"loss", <the task's metrics>}`` (loss: mean cross-entropy, or mean
        squared error for regression, per example) and logits ``[examples, num_labels]`` on the CPU, in the
        dataloader's order.
    """
    logits, labels = split_logits(model, dataloader, accelerator, desc)
    if metric is None:
        return {}, logits
    loss = loss_of(logits, labels, task).item() / labels.numel()
    return {"loss": loss, **score(metric, task, predictions_of(logits, task), labels)}, logits


def score(metric: evaluate.EvaluationModule, task: Task, predictions, references) -> dict[str, float]:
    """The task's metrics of ``predictions`` against ``references`` (both ``[examples]``: class ids, or scores for
    regression); binary own data scores the F1 of ``task.positive_label``."""
    options = {"pos_label": task.positive_label} if task.metric_config == "binary" else {}
    return metric.compute(predictions=predictions, references=references, **options)
