"""Stage tokenize: the task's text columns to token ids with the checkpoint's tokenizer. Writes data/tokenized/
(``DatasetDict.save_to_disk`` plus data/raw's task.json) and metrics/token_lengths.json (``length_stats`` per
split)."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from datasets import load_from_disk
from transformers import AutoConfig, AutoTokenizer

from finetune.data.tokenization import length_stats, position_limit, tokenize, truncation_length
from finetune.params import Params, load_params
from finetune.paths import Paths
from finetune.runtime import atomic_dir, run_stage, write_json
from finetune.tasks import Task

log = logging.getLogger(__name__)


def tokenize_splits(params: Params, paths: Paths) -> dict:
    """Tokenize every split of ``paths.raw`` into ``paths.tokenized`` (``finetune.data.tokenization.tokenize``) with
    ``tokenize.max_length`` and ``tokenize.num_proc``; returns split -> ``length_stats``.

    Raises:
        ParamsError: ``tokenize.max_length`` is above the checkpoint's positions (``position_limit``); nothing is
            written.
    """
    tokenizer = AutoTokenizer.from_pretrained(paths.pretrained)
    task = Task.load(paths.raw)
    limit = position_limit(AutoConfig.from_pretrained(paths.pretrained))
    max_length = truncation_length(tokenizer, params.tokenize.max_length, limit)
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


def main() -> None:
    paths = Paths()
    write_json(paths.metrics / "token_lengths.json", tokenize_splits(load_params(), paths))


if __name__ == "__main__":
    run_stage(main)
