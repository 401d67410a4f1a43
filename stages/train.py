"""Stage train: fine-tune the pretrained checkpoint (``finetune.train.recipe.train``) in this process, or handed over
to ``accelerate launch`` when ``train.accelerate_config`` asks for more; writes models/trained, models/checkpoints,
metrics/train.json and dvclive/train.
"""

from __future__ import annotations

import logging

from finetune.launch import launch_if_distributed
from finetune.params import load_params
from finetune.paths import Paths
from finetune.runtime import run_stage, write_json

log = logging.getLogger(__name__)


def main() -> None:
    params, paths = load_params(), Paths()
    launch_if_distributed("stages.train", params.train.accelerate_config)
    # Imported after the hand-over: a process that only starts `accelerate launch` never loads torch.
    from accelerate import PartialState

    from finetune.train.recipe import train

    metrics = train(params, paths)
    if PartialState().is_main_process:
        log.info("Train metrics: %s", metrics)
        write_json(paths.metrics / "train.json", metrics)


if __name__ == "__main__":
    run_stage(main)
