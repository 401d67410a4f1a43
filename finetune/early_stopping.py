"""Early stopping: is this evaluation the best so far, and is it time to stop?"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EarlyStopping:
    """Track a validation metric across evaluations: is this one the best so far, and is it time to stop?

    ``mode`` 'max' for accuracy/F1, 'min' for loss. An evaluation improves when it beats the best by more than
    ``threshold``; training stops after ``patience`` evaluations in a row without improvement (None: never),
    like transformers' ``EarlyStoppingCallback``.
    """

    mode: str
    patience: int | None = None
    threshold: float = 0.0
    best: float | None = None
    best_epoch: int = 0
    best_step: int = 0
    bad_evaluations: int = 0

    def update(self, value: float, epoch: int, step: int = 0) -> bool:
        """Record ``value`` of the evaluation at optimizer step ``step`` of ``epoch``; True when it is a new best."""
        sign = 1 if self.mode == "max" else -1
        if self.best is None or sign * (value - self.best) > self.threshold:
            self.best, self.best_epoch, self.best_step, self.bad_evaluations = value, epoch, step, 0
            return True
        self.bad_evaluations += 1
        return False

    @property
    def should_stop(self) -> bool:
        return self.patience is not None and self.bad_evaluations >= self.patience
