"""The classifier: a checkpoint loaded with a head for the task's labels (or one output for regression)."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoConfig, AutoModelForSequenceClassification, PreTrainedModel

from finetune.errors import CheckpointError
from finetune.sources import check_checkpoint
from finetune.tasks import Task


def load_classifier(checkpoint_dir: str | Path, task: Task, reinit_head: bool = False) -> PreTrainedModel:
    """Load a sequence classifier for ``task`` from a local checkpoint folder.

    The config gets the task's ``num_labels`` (1 for regression), ``id2label`` / ``label2id`` (the class names, so
    ``pipeline("text-classification")`` prints them) and ``problem_type`` (MSE loss for regression,
    cross-entropy otherwise). A checkpoint without a classification head (e.g. a plain ``BertModel``) gets a
    freshly initialised one, seeded by the caller's ``set_seed``; transformers logs which weights were new. A
    checkpoint whose head has another number of outputs (e.g. an MNLI model, 3) is an error unless
    ``reinit_head``, which replaces that head with a new one (``ignore_mismatched_sizes``).

    Raises:
        CheckpointError: the folder lacks config, weights or tokenizer (``check_checkpoint``), or its head does not
            have the task's number of outputs and ``reinit_head`` is false.
    """
    check_checkpoint(checkpoint_dir)
    config = AutoConfig.from_pretrained(checkpoint_dir)
    has_head = any(name.endswith("ForSequenceClassification") for name in config.architectures or [])
    if has_head and config.num_labels != task.num_labels and not reinit_head:
        raise CheckpointError(
            f"{checkpoint_dir}: the checkpoint's classification head has {config.num_labels} outputs "
            f"({config.id2label}), task {task.name!r} needs {task.num_labels}; set model.reinit_head: true in "
            "params.yaml to replace it with a new head")
    return AutoModelForSequenceClassification.from_pretrained(
        checkpoint_dir, num_labels=task.num_labels, id2label=task.id2label,
        label2id={name: i for i, name in task.id2label.items()},
        problem_type="regression" if task.is_regression else "single_label_classification",
        ignore_mismatched_sizes=reinit_head)
