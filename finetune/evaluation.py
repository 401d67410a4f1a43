"""Evaluation: the course's evaluation loop over one split, and the MRPC metric (accuracy, F1)."""

from __future__ import annotations

from pathlib import Path

import evaluate
import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader
from transformers import PreTrainedModel

METRIC_SCRIPT = Path(__file__).with_name("mrpc_metric.py")  # loaded by path: finetune.code counts it as run code


def load_metric() -> evaluate.EvaluationModule:
    """Accuracy and F1 of the positive class (equivalent), as GLUE reports them for MRPC.

    ``evaluate.load("glue", "mrpc")`` fetches its script from the Hub; this loads the project's local
    module (finetune/mrpc_metric.py) by path instead, so it works offline.
    """
    return evaluate.load(str(METRIC_SCRIPT))


@torch.no_grad()
def evaluate_split(
    model: PreTrainedModel, dataloader: DataLoader, accelerator: Accelerator, metric: evaluate.EvaluationModule | None
) -> tuple[dict, torch.Tensor]:
    """The course's evaluation loop: forward each batch without gradients, argmax, ``metric.add_batch``.

    ``accelerator.gather_for_metrics`` collects every process's batch and drops the samples that
    distributed sampling duplicates, so each example counts once.

    Args:
        metric: None for an unlabeled split (loss and metrics are then omitted).

    Returns:
        ``(metrics, logits)``: metrics ``{"loss", "accuracy", "f1"}`` (mean cross-entropy per example)
        and logits ``[examples, 2]`` on the CPU, in the dataloader's order.
    """
    model.eval()
    all_logits, loss_sum, examples = [], 0.0, 0
    for batch in dataloader:
        if metric is None:
            batch = {k: v for k, v in batch.items() if k != "labels"}
        outputs = model(**batch)
        logits = accelerator.gather_for_metrics(outputs.logits)
        all_logits.append(logits.float().cpu())
        if metric is not None:
            labels = accelerator.gather_for_metrics(batch["labels"])
            loss_sum += torch.nn.functional.cross_entropy(logits.float(), labels, reduction="sum").item()
            examples += labels.numel()
            metric.add_batch(predictions=logits.argmax(dim=-1), references=labels)
    logits = torch.cat(all_logits)
    if metric is None:
        return {}, logits
    return {"loss": loss_sum / examples, **metric.compute()}, logits
