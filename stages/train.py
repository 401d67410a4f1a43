"""Stage 5, train: fine-tune the pretrained checkpoint on the train split with an explicit loop on Accelerate.

The loop itself is finetune/training.py. Run as ``accelerate launch --config_file <train.accelerate_config> -m
stages.train`` (dvc.yaml does, after ``python -m finetune.params`` checked params.yaml), or plainly as ``python -m
stages.train`` for one process. Writes models/trained/ (model + tokenizer, task.json; the card stage copies it to
models/finetuned/ with its model card), models/checkpoints/, metrics/train.json and the DVCLive logs
dvclive/train/steps and dvclive/train/epochs.
"""

from __future__ import annotations

import logging

from accelerate import PartialState

from finetune.params import load_params
from finetune.paths import Paths
from finetune.runtime import run_stage, write_json
from finetune.training import train

log = logging.getLogger(__name__)


def main() -> None:
    paths = Paths()
    metrics = train(load_params(), paths)
    if PartialState().is_main_process:
        log.info("Train metrics: %s", metrics)
        write_json(paths.metrics / "train.json", metrics)


if __name__ == "__main__":
    run_stage(main)
