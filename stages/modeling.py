"""The classifier: loading a checkpoint with a 2-label head, the evaluation loop, and the MRPC metric."""

from __future__ import annotations

from pathlib import Path

import evaluate
import numpy as np
import torch
from accelerate import Accelerator
from datasets import Dataset
from torch.utils.data import DataLoader
from transformers import AutoModelForSequenceClassification, PreTrainedModel

from stages.common import ID2LABEL, LABEL2ID, EvaluateParams
from stages.data import eval_dataloader, length_order

METRIC_SCRIPT = Path(__file__).with_name("mrpc_metric.py")


def load_classifier(checkpoint_dir: str | Path) -> PreTrainedModel:
    """Load a sequence classifier with the MRPC labels from a local checkpoint folder.

    A checkpoint without a classification head (e.g. a plain ``BertModel``) gets a freshly initialised one,
    seeded by the caller's ``set_seed``; transformers logs which weights were new.
    """
    return AutoModelForSequenceClassification.from_pretrained(
        checkpoint_dir, num_labels=len(ID2LABEL), id2label=ID2LABEL, label2id=LABEL2ID
    )


def load_metric() -> evaluate.EvaluationModule:
    """Accuracy and F1 of the positive class (equivalent), as GLUE reports them for MRPC.

    ``evaluate.load("glue", "mrpc")`` fetches its script from the Hub; this loads the project's local
    module (stages/mrpc_metric.py) by path instead, so it works offline.
    """
    return evaluate.load(str(METRIC_SCRIPT))


def evaluation_batches(ds: Dataset, collator, p: EvaluateParams) -> tuple[DataLoader, np.ndarray | None]:
    """The evaluation DataLoader of one tokenized split and the row order it follows.

    With ``p.sort_by_length`` the rows go shortest first (little padding) and ``order`` is returned: put
    outputs back in row order with ``out[order] = outputs``. Otherwise rows keep their order and ``order`` is None.
    """
    if not p.sort_by_length:
        return eval_dataloader(ds, collator, p.batch_size), None
    order = length_order(ds)
    return eval_dataloader(ds.select(order), collator, p.batch_size), order


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
