"""Folds of the train rows, for cross-fitted teachers (docs/distillation.md, "Cross-fitted teachers").

A teacher's logits of the rows it was fine-tuned on say little beyond their labels. Cross-fitting gives each train row
the logits of a teacher that never saw it: the train rows are cut into ``k`` folds, the run of fold i's teacher leaves
fold i out (``train.holdout_fold``), and the teacher stage scores fold i with that teacher (``distill.fold_teachers``).
Both sides cut the folds here, so they agree. The run records what it left out in its model's config.json
(``holdout_fold``), which the teacher stage checks.
"""

from __future__ import annotations

import numpy as np

from finetune.errors import DataError
from finetune.params import HoldoutFold

HOLDOUT_KEY = "holdout_fold"  # in a fine-tuned model's config.json: {folds, fold, seed, rows} of the run that made it


def row_folds(rows: int, folds: int, seed: int) -> np.ndarray:
    """The fold of each train row: ``[rows]`` int64 in ``0 … folds - 1``, from scikit-learn's ``KFold`` with
    ``shuffle=True, random_state=seed`` (fold sizes differ by at most one row).

    Raises:
        DataError: fewer rows than folds.
    """
    from sklearn.model_selection import KFold

    if rows < folds:
        raise DataError(f"{rows} train rows cannot make {folds} folds (train.holdout_fold / distill.fold_teachers)")
    fold_of = np.empty(rows, dtype=np.int64)
    for fold, (_, held_out) in enumerate(KFold(n_splits=folds, shuffle=True, random_state=seed).split(np.zeros(rows))):
        fold_of[held_out] = fold
    return fold_of


def kept_rows(rows: int, holdout: HoldoutFold) -> np.ndarray:
    """The indices (ascending, ``[rows - fold size]``) of the train rows a run with ``train.holdout_fold`` trains on.

    Raises:
        DataError: fewer rows than folds.
    """
    return np.flatnonzero(row_folds(rows, holdout.folds, holdout.seed) != holdout.fold)


def holdout_record(rows: int, holdout: HoldoutFold) -> dict:
    """What a run saves in its model's config.json (``HOLDOUT_KEY``): the folds, the fold left out, the seed and the
    train rows the folds were cut from."""
    return {**holdout.model_dump(), "rows": rows}
