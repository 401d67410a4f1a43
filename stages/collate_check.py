"""Stage collate-check: the batches that training and evaluation will see (built by finetune.data.batches) obey the
dynamic-padding rules, and one forward pass of the pretrained model works (``finetune.data.collate_check.check_all``).
Writes metrics/collate_check.json; a broken rule exits non-zero naming the split, the batch and the rule."""

from __future__ import annotations

from finetune.data.collate_check import check_all
from finetune.params import load_params
from finetune.paths import Paths
from finetune.runtime import run_stage, write_json


def main() -> None:
    paths = Paths()
    write_json(paths.metrics / "collate_check.json", check_all(load_params(), paths))


if __name__ == "__main__":
    run_stage(main)
