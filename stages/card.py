"""Stage card: the model folder users load. Copies models/trained to models/finetuned/ atomically, with README.md,
the model card of finetune/card.py; ``ModelCard.load("models/finetuned/README.md")`` reads the card,
``pipeline("text-classification", model="models/finetuned")`` the model.
"""

from __future__ import annotations

import logging

from finetune.card import model_card, write_model_folder
from finetune.params import load_params
from finetune.paths import Paths
from finetune.runtime import run_stage

log = logging.getLogger(__name__)


def main() -> None:
    paths = Paths()
    card = model_card(load_params(), paths)
    write_model_folder(paths.trained, paths.finetuned, card)
    log.info("Wrote %s with its model card %s", paths.finetuned, paths.finetuned / "README.md")


if __name__ == "__main__":
    run_stage(main)
