"""Which of the asked-for splits the data has (``present_splits``) and whether one carries labels (``is_labeled``):
what collate-check and evaluate need of the data, apart from the rules of ``finetune.prepare`` so that a change
to those rules doesn't rerun them.
"""

from __future__ import annotations

import logging

from datasets import Dataset, DatasetDict

log = logging.getLogger(__name__)


def is_labeled(ds: Dataset) -> bool:
    """True when the split carries labels (a raw ``label`` or a tokenized ``labels`` column)."""
    return "labels" in ds.column_names or "label" in ds.column_names


def present_splits(splits: list[str], data: DatasetDict) -> list[str]:
    """Those of ``splits`` (``evaluate.splits``) that ``data`` has, warning about each it lacks (SST-2 and STS-B
    have no test split in the local copy: evaluation covers what exists)."""
    for split in splits:
        if split not in data:
            log.warning("No %s split in the data (it has %s): skipped", split, ", ".join(data))
    return [split for split in splits if split in data]

