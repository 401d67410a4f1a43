"""The tokenize stage's work: every split of data/raw tokenized into data/tokenized (``tokenize_splits``, with
``finetune.data.tokenization``), and the token-length statistics of metrics/token_lengths.json (``length_stats``).
Only the tokenize stage runs this module, so a change here reruns it alone.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import numpy as np
from datasets import Dataset, load_from_disk

from finetune.data.tokenization import token_lengths, tokenize, training_tokenizer
from finetune.params import Params
from finetune.paths import Paths
from finetune.runtime import atomic_dir
from finetune.tasks import Task

log = logging.getLogger(__name__)


def tokenize_splits(params: Params, paths: Paths) -> dict:
    """Tokenize every split of ``paths.raw`` into ``paths.tokenized`` (``tokenize``) with
    ``tokenize.max_length`` and ``tokenize.num_proc``; returns split -> ``length_stats``.

    Raises:
        ParamsError: ``tokenize.max_length`` is above the checkpoint's positions (``training_tokenizer``); nothing
            is written.
    """
    tokenizer = training_tokenizer(paths.pretrained, params.tokenize.max_length)
    task, max_length = Task.load(paths.raw), tokenizer.model_max_length
    log.info("Tokenizing %s (%s) with %s (truncation at %d tokens)", paths.raw, " + ".join(task.text_columns),
             type(tokenizer).__name__, max_length)
    # the scratch folder is named like atomic_dir's temp folders, so the next run's atomic_dir removes a killed run's
    with atomic_dir(paths.tokenized) as tmp, \
            tempfile.TemporaryDirectory(dir=paths.tokenized.parent, prefix=f".{paths.tokenized.name}.scratch-",
                                        suffix=".tmp") as scratch:
        tokenized = tokenize(load_from_disk(str(paths.raw)), tokenizer, max_length, task.text_columns,
                             cache_dir=Path(scratch), num_proc=params.tokenize.num_proc)
        tokenized.save_to_disk(str(tmp))
        task.save(tmp)
        stats = {split: length_stats(ds, max_length) for split, ds in tokenized.items()}
        del tokenized  # its memory maps, before the scratch folder goes
    for split, s in stats.items():
        log.info("%s: %d examples, tokens mean %.1f, max %d, truncated %d", split, s["examples"], s["mean"], s["max"],
                 s["truncated"])
    return stats


def length_stats(ds: Dataset, max_length: int) -> dict:
    """Token-length statistics of a tokenized split (tokens per example, special tokens included): ``examples``,
    ``mean``, ``median``, ``p95``, ``max``, ``min``, ``truncated`` (examples at ``max_length`` or longer) and
    ``max_length``."""
    lengths = np.array(token_lengths(ds))
    return {"examples": int(lengths.size), "mean": round(float(lengths.mean()), 2), "median": float(np.median(lengths)),
            "p95": float(np.percentile(lengths, 95)), "max": int(lengths.max()), "min": int(lengths.min()),
            "truncated": int((lengths >= max_length).sum()), "max_length": max_length}
