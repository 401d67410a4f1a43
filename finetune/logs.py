"""DVCLive logs as files only (no dvc.yaml, report or experiment commit: https://dvc.org/doc/dvclive/how-it-works):
the train stage's (``finetune.train.live``) and the evaluate stage's plots (``finetune.evaluate.plots``)."""

from __future__ import annotations

from pathlib import Path

from dvclive import Live


def open_live(directory: str | Path) -> Live:
    """A DVCLive logger that only writes files under ``directory``; ``.end()`` writes its summary."""
    return Live(dir=str(directory), dvcyaml=None, save_dvc_exp=False, report=None)
