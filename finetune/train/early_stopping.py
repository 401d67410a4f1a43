"""Early stopping on a validation metric, like transformers' ``EarlyStoppingCallback``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EarlyStopping:
    """Early stopping on a validation metric, like transformers' ``EarlyStoppingCallback``.

    Args:
        mode: 'max' (accuracy, F1) or 'min' (loss).
        patience: evaluations in a row without improvement before stopping; None: never.
        threshold: an improvement must beat the best by more than this.
    """

    mode: str
    patience: int | None = None
    threshold: float = 0.0
    best: float | None = None
    best_epoch: int = 0
    best_step: int = 0
    bad_evaluations: int = 0

    def update(self, value: float, epoch: int, step: int = 0) -> bool:
        """Record an evaluation's ``value``; True when it is a new best."""
        sign = 1 if self.mode == "max" else -1
        if self.best is None or sign * (value - self.best) > self.threshold:
            self.best, self.best_epoch, self.best_step, self.bad_evaluations = value, epoch, step, 0
            return True
        self.bad_evaluations += 1
        return False

    @property
    def should_stop(self) -> bool:
        return self.patience is not None and self.bad_evaluations >= self.patience
