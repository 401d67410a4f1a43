"""The classifier: a checkpoint loaded with a 2-label MRPC head."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoConfig, AutoModelForSequenceClassification, PreTrainedModel

from finetune.errors import CheckpointError
from finetune.sources import check_checkpoint

ID2LABEL = {0: "not_equivalent", 1: "equivalent"}
LABEL2ID = {name: i for i, name in ID2LABEL.items()}


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
