"""Stage 5, train: fine-tune the pretrained checkpoint on the train split with an explicit loop on Accelerate.

The loop itself is finetune/train/loop.py. Run as ``python -m stages.train`` (dvc.yaml): one process, or when
``train.accelerate_config`` asks for more, the stage hands itself over to ``accelerate launch`` with that config
(``finetune.runtime.launch_if_distributed``). Writes models/trained/ (model + tokenizer, task.json; the card stage
copies it to models/finetuned/ with its model card), models/checkpoints/, metrics/train.json and the DVCLive logs
dvclive/train/steps and dvclive/train/epochs.
"""

from __future__ import annotations

import logging

from finetune.params import load_params
from finetune.paths import Paths
from finetune.runtime import launch_if_distributed, run_stage, write_json

log = logging.getLogger(__name__)


def main() -> None:
    params, paths = load_params(), Paths()
    launch_if_distributed("stages.train", params.train.accelerate_config)
    # Imported after the hand-over: a process that only starts `accelerate launch` never loads torch (about 5 s).
    from accelerate import PartialState

    from finetune.train.loop import train

    metrics = train(params, paths)
    if PartialState().is_main_process:
        log.info("Train metrics: %s", metrics)
        write_json(paths.metrics / "train.json", metrics)


if __name__ == "__main__":
    run_stage(main)
