"""The classifier: loading a checkpoint with a 2-label head, the evaluation loop, and the MRPC metric."""

from __future__ import annotations

from pathlib import Path

import evaluate
import numpy as np
import torch
from accelerate import Accelerator
from datasets import Dataset
from torch.utils.data import DataLoader
from transformers import AutoConfig, AutoModelForSequenceClassification, PreTrainedModel

from stages.common import ID2LABEL, LABEL2ID, EvaluateParams
from stages.data import eval_dataloader, length_order

METRIC_SCRIPT = Path(__file__).with_name("mrpc_metric.py")


class CheckpointError(ValueError):
    """A checkpoint folder that can't be used: no config, no weights, no tokenizer, or a head of the wrong size."""


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer.model", "vocab.json")


def check_checkpoint(checkpoint_dir: str | Path, need_weights: bool = True) -> None:
    """Check that a local checkpoint folder has a config, weights (``need_weights``) and a tokenizer.

    Raises:
        CheckpointError: naming the folder and the missing files, before transformers fails deep inside.
    """
    folder = Path(checkpoint_dir)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: checkpoint folder not found")
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"{folder}: no config.json; not a transformers checkpoint folder")
    if need_weights and not any((folder / name).is_file() for name in WEIGHT_FILES):
        raise CheckpointError(f"{folder}: no model weights (one of {', '.join(WEIGHT_FILES)})")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise CheckpointError(f"{folder}: no tokenizer files (one of {', '.join(TOKENIZER_FILES)}); "
                              "save the tokenizer with the model (tokenizer.save_pretrained)")


def load_classifier(checkpoint_dir: str | Path, reinit_head: bool = False) -> PreTrainedModel:
    """Load a sequence classifier with the 2 MRPC labels from a local checkpoint folder.

    A checkpoint without a classification head (e.g. a plain ``BertModel``) gets a freshly initialised one,
    seeded by the caller's ``set_seed``; transformers logs which weights were new. A checkpoint whose head has
    another number of labels (e.g. an MNLI model, 3) is an error unless ``reinit_head``, which replaces that head
    with a new 2-label one (``ignore_mismatched_sizes``).

    Raises:
        CheckpointError: the folder lacks config, weights or tokenizer (``check_checkpoint``), or its head does not
            have 2 labels and ``reinit_head`` is false.
    """
    check_checkpoint(checkpoint_dir)
    config = AutoConfig.from_pretrained(checkpoint_dir)
    has_head = any(name.endswith("ForSequenceClassification") for name in config.architectures or [])
    if has_head and config.num_labels != len(ID2LABEL) and not reinit_head:
        raise CheckpointError(
            f"{checkpoint_dir}: the checkpoint's classification head has {config.num_labels} labels "
            f"({config.id2label}), MRPC needs {len(ID2LABEL)}; set model.reinit_head: true in params.yaml to replace "
            "it with a new 2-label head")
    return AutoModelForSequenceClassification.from_pretrained(
        checkpoint_dir, num_labels=len(ID2LABEL), id2label=ID2LABEL, label2id=LABEL2ID,
        ignore_mismatched_sizes=reinit_head)


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
