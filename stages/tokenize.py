"""Stage tokenize: the task's text columns to token ids with the checkpoint's tokenizer
(``finetune.data.tokenized.tokenize_splits``). Writes data/tokenized/ (``DatasetDict.save_to_disk`` plus data/raw's
task.json) and metrics/token_lengths.json (``length_stats`` per split)."""

from __future__ import annotations

from finetune.data.tokenized import tokenize_splits
from finetune.params import load_params
from finetune.paths import Paths
from finetune.runtime import run_stage, write_json


def main() -> None:
    paths = Paths()
    write_json(paths.metrics / "token_lengths.json", tokenize_splits(load_params(), paths))


if __name__ == "__main__":
    run_stage(main)
