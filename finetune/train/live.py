"""The train stage's DVCLive logs (``TrainLog``): optimizer steps and evaluations, files only."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from finetune.logs import open_live
from finetune.paths import EVALUATION_LOGS
from finetune.runtime import atomic_dir


class TrainLog:
    """The train stage's DVCLive logs: ``<folder>/steps`` (``train/loss`` averaged over the last ``log_every``
    optimizer steps, ``train/lr``, distillation's loss parts; every ``log_every`` steps and the last), and the
    evaluations in ``<folder>/epochs`` or, with ``unit`` 'step', ``<folder>/evaluations``.

    Args:
        folder: None writes nothing (processes other than the main one).
        unit: 'epoch' or 'step': the DVCLive step of the evaluation log.
    """

    def __init__(self, folder: Path | None, log_every: int, total_steps: int, unit: str = "epoch"):
        self.steps = open_live(folder / "steps") if folder is not None else None
        self.evaluations = open_live(folder / EVALUATION_LOGS[unit]) if folder is not None else None
        self.log_every, self.total_steps, self.unit = log_every, total_steps, unit

    @classmethod
    @contextlib.contextmanager
    def open(cls, folder: Path, enabled: bool, log_every: int, total_steps: int,
             unit: str = "epoch") -> Iterator[TrainLog]:
        """The log of ``folder``, replaced on exit (kept as it was on error); nothing is written unless ``enabled``."""
        if not enabled:
            yield cls(None, log_every, total_steps, unit)
            return
        with atomic_dir(folder) as tmp:
            log = cls(tmp, log_every, total_steps, unit)
            yield log
            log.steps.end()
            log.evaluations.end()

    def log_step(self, step: int, losses: list[float], lrs: list[float], parts: dict | None = None) -> None:
        """Log optimizer step ``step`` (1-based) when it is due.

        Args:
            losses, lrs: one value per optimizer step so far.
            parts: more losses by name (``train/hard_loss``, ...), each one value per step, logged like ``losses``.
        """
        if self.steps is None or not (step % self.log_every == 0 or step == self.total_steps):
            return
        self.steps.step = step
        for name, values in {"train/loss": losses, **(parts or {})}.items():
            recent = values[max(0, step - self.log_every):step]
            self.steps.log_metric(name, sum(recent) / len(recent))
        self.steps.log_metric("train/lr", lrs[step - 1])
        self.steps.make_summary()

    def log_evaluation(self, entry: dict) -> None:
        """Log ``entry`` (``{"epoch", "step", "train/loss", "validation/<metric>", ...}``) at step ``entry[unit]``."""
        if self.evaluations is None:
            return
        self.evaluations.step = entry[self.unit]
        for name, value in entry.items():
            if name != self.unit and name != "step":
                self.evaluations.log_metric(name, value)
        self.evaluations.make_summary()

    def replay(self, losses: list[float], lrs: list[float], evaluations: list[dict], parts: dict | None = None) -> None:
        """Log the steps and evaluations a resumed run took before its checkpoint."""
        for step in range(1, len(losses) + 1):
            self.log_step(step, losses, lrs, parts)
        for entry in evaluations:
            self.log_evaluation(entry)
