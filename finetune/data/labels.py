"""The label rules and labels to ids: the class names of the data, whether it is a regression, and each split's labels
encoded as class ids (or float scores), checked row by row; a broken rule is a ``DataError`` naming the row.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import pandas as pd
from datasets import ClassLabel, Dataset, Value

from finetune.data.checks import blank, row_label, row_name
from finetune.errors import DataError
from finetune.params import DataParams
from finetune.tasks import GLUE_TASKS

log = logging.getLogger(__name__)

UNLABELED = -1  # the Hub's GLUE test splits carry label -1


def _label_kind(value) -> str:
    """A label's kind: ``"bool"``, ``"integer"`` (a whole float too: ``1.0``, or a column of integers with a blank
    cell, which pandas reads as floats), ``"float"``, or ``"string"`` (anything else)."""
    if isinstance(value, (bool, np.bool_)):
        return "bool"
    if isinstance(value, (int, np.integer)):
        return "integer"
    if isinstance(value, (float, np.floating)):
        return "integer" if float(value).is_integer() else "float"
    return "string"


def _is_number(value) -> bool:
    """True for a number label (``_label_kind`` other than ``"string"``) and for a text that reads as a finite one
    (``"1"``, ``"0.5"``: a CSV column of numbers and words is read as text)."""
    if _label_kind(value) != "string":
        return True
    try:
        return math.isfinite(float(str(value)))
    except ValueError:
        return False


def _check_label_kinds(frames: dict[str, pd.DataFrame], where: dict[str, str], names_given: bool) -> str:
    """The one kind of the labels of every split: ``"number"`` (numbers, or texts that read as numbers) or
    ``"string"`` (words); ``"number"`` when there is none. ``frames`` and ``where`` map each split to its checked
    frame and to what to name in errors; ``names_given``: ``data.label_names`` lists the classes, so labels mixing
    numbers and words within a split are class names (``"string"``).

    Raises:
        DataError: a split mixes numbers and words (naming its file, a row of each kind and how to fix it), or the
            splits differ: the split whose kind is not the others' is named (on a tie, the one that is not train,
            whose labels name the classes), with a row of each kind and the other file.
    """
    kinds, first = {}, {}
    for split, df in frames.items():
        present = np.flatnonzero(~blank(df["label"]))
        numbers = np.array([_is_number(v) for v in df["label"].to_numpy()[present]], dtype=bool)
        rows = {"number": present[numbers], "string": present[~numbers]}
        kinds[split] = "number" if rows["number"].size else "string"
        if rows["number"].size and rows["string"].size:
            if names_given:
                return "string"
            number, word = (df["label"].iat[rows[kind][0]] for kind in ("number", "string"))
            raise DataError(f"{row_name(where[split], split, df, rows['number'][0])}: label {_plain(number)} is a "
                            f"number, but {row_label(df, rows['string'][0])}'s label {word!r} is a word: labels mix "
                            "numbers and words; write them all as class names or all as class ids (or list every "
                            "class in params.yaml data.label_names)")
        if present.size:
            first[split] = present[0]
    labeled = [split for split in frames if split in first]
    counts = {kind: sum(kinds[s] == kind for s in labeled) for kind in ("number", "string")}
    if min(counts.values()) == 0:
        return kinds[labeled[0]] if labeled else "number"
    ahead = max(counts, key=lambda kind: (counts[kind], kinds["train"] == kind))
    odd = next(s for s in labeled if kinds[s] != ahead)
    other = next(s for s in labeled if kinds[s] == ahead)
    wrong, right = (frames[s]["label"].iat[first[s]] for s in (odd, other))
    words = {"number": "numbers", "string": "words"}
    raise DataError(f"{row_name(where[odd], odd, frames[odd], first[odd])}: label {_plain(wrong)!r}: this split's "
                    f"labels are {words[kinds[odd]]}, but those of {where[other]} (split {other!r}) are "
                    f"{words[ahead]} (e.g. {_plain(right)!r}); write every file's labels the same way")


def trim_labels(frames: dict[str, pd.DataFrame], where: dict[str, str]) -> None:
    """Strip the spaces around every text label of ``frames`` (split -> checked frame) in place, so that ``" yes"``
    and ``"yes "`` are class ``yes``, as spreadsheets export them; one WARNING names the first label trimmed and its
    row (``where``: split -> what to name)."""
    first = None
    for split, df in frames.items():
        labels = df["label"]
        if not (pd.api.types.is_object_dtype(labels) or pd.api.types.is_string_dtype(labels)):
            continue
        trimmed = labels.map(lambda v: v.strip() if isinstance(v, str) else v)
        changed = np.flatnonzero((trimmed != labels).to_numpy() & labels.map(lambda v: isinstance(v, str)).to_numpy())
        if changed.size and first is None:
            first = (split, df, changed[0], labels.iat[changed[0]])
        df["label"] = trimmed
    if first is not None:
        split, df, row, label = first
        log.warning("%s: label %r read as %r: spaces around labels are dropped, in every split", row_name(
            where[split], split, df, row), label, label.strip())


def is_regression(train: Dataset, p: DataParams, where: str = "train") -> bool:
    """Whether own data is a regression: False when the label column is a ``ClassLabel``; else ``p.task_type ==
    "regression"`` when ``p.task_type`` is set; else whether train's label column is a float column holding a
    fraction. Floats that are all whole numbers (``1.0`` among 0/1 labels, or a blank cell among integers) are classes,
    with a WARNING naming ``where`` and ``data.task_type``."""
    feature = train.features.get(p.label_column)
    if isinstance(feature, ClassLabel):
        return False
    if p.task_type is not None:
        return p.task_type == "regression"
    if not (isinstance(feature, Value) and feature.dtype.startswith("float")):
        return False
    scores = pd.Series(train[p.label_column], dtype="float64").dropna()
    if scores.empty or not (scores == scores.round()).all():
        return True
    log.warning("%s: split 'train': the labels are written as numbers with a decimal point or with blanks, but all "
                "are whole numbers (%s): read as classes; set data.task_type: regression if they are scores",
                where, ", ".join(str(_plain(v)) for v in sorted(scores.unique())[:10]))
    return False


def label_names(train: Dataset, frames: dict[str, pd.DataFrame], p: DataParams,
                where: dict[str, str]) -> tuple[tuple[str, ...], bool]:
    """``(names, ids)``: the class names in id order, and whether numeric labels are ids into them (True) or the names
    themselves (False). Names come from GLUE's task, else the label's ``ClassLabel``, else ``p.label_names``, else
    train's sorted distinct labels. With ``p.label_names``, numeric labels are the names when every label, as text,
    is one of them (``1`` to ``5`` for names ``"1"`` to ``"5"``), else ids. ``frames`` and ``where`` as in
    ``_check_label_kinds``.

    Raises:
        DataError: labels mixing numbers and words, in a split or across splits (``_check_label_kinds``).
    """
    if p.glue_task:
        return GLUE_TASKS[p.glue_task].label_names, True
    feature = train.features.get(p.label_column)
    if isinstance(feature, ClassLabel):
        return tuple(feature.names), True
    kind = _check_label_kinds(frames, where, p.label_names is not None)
    if p.label_names is not None:
        # numbers that are all names (label_names "1" to "5" of star ratings) are those classes; else ids into them
        written = {str(_plain(v)) for df in frames.values() for v in df["label"][~blank(df["label"])].tolist()
                   if not (_label_kind(v) == "integer" and v == UNLABELED)}
        return tuple(p.label_names), kind != "string" and not written <= set(p.label_names)
    labels = frames["train"]["label"]
    values = sorted(set(_plain(v) for v in labels[~blank(labels)].tolist()))
    return tuple(str(v) for v in values), False


def encode_labels(df: pd.DataFrame, split: str, where: str, names: tuple[str, ...] | None, ids: bool,
                  seen: np.ndarray | None = None) -> np.ndarray | None:
    """The split's labels as int64 class ids, or float32 scores for regression (``names`` None), ``[examples]``; None
    for a ``test*`` split whose labels are all null or -1 (unlabeled).

    Args:
        ids: numeric labels are ids into ``names``; else each label is matched to a name as text.
        seen: train's class ids, for the splits after it; a class outside them is an error.

    Raises:
        DataError: a null, unknown or non-finite label, -1 among labeled test rows, or a class train lacks; naming the
            row.
    """
    labels = df["label"]
    missing = blank(labels)
    marker = np.array([_label_kind(v) in ("integer", "float") and v == UNLABELED for v in labels], dtype=bool)
    if names is not None and not ids and str(UNLABELED) in names:
        marker[:] = False  # -1 is a class of the user's own labels
    if split.startswith("test") and (missing | marker).all():
        return None  # an unlabeled test split: predictions only
    if marker.any() and split.startswith("test") and names is not None and ids:
        raise DataError(f"{row_name(where, split, df, np.flatnonzero(marker)[0])}: label -1 (unlabeled) among "
                        "labeled rows; the test split is labeled throughout or -1 throughout")
    if missing.any():
        rule = "a number (regression)" if names is None else f"a label in {list(names)}"
        unlabeled = " (or none: a test split may be unlabeled throughout)" if split.startswith("test") else ""
        raise DataError(f"{row_name(where, split, df, np.flatnonzero(missing)[0])}: label is missing (null); "
                        f"every row needs {rule}{unlabeled}")
    if names is None:
        scores = pd.to_numeric(labels, errors="coerce").to_numpy(dtype="float64")
        bad = np.flatnonzero(~np.isfinite(scores))
        if bad.size:
            raise DataError(f"{row_name(where, split, df, bad[0])}: label {_plain(labels.iat[bad[0]])!r} is not a "
                            "finite number (regression labels are numbers)")
        return scores.astype("float32")
    values = labels.to_numpy()
    if ids:
        numbers = pd.to_numeric(labels, errors="coerce").to_numpy(dtype="float64")  # "1" in a JSON file too
        bad = np.flatnonzero(~np.isin(numbers, np.arange(len(names))))
        if bad.size:
            raise DataError(f"{row_name(where, split, df, bad[0])}: label {_plain(values[bad[0]])} not in "
                            f"{list(range(len(names)))} (the ids of {list(names)})")
        encoded = numbers.astype("int64")
    else:
        position = {name: i for i, name in enumerate(names)}
        text = np.array([str(_plain(v)) for v in values])
        bad = np.flatnonzero(~np.isin(text, list(position)))
        if bad.size:
            raise DataError(f"{row_name(where, split, df, bad[0])}: label {str(text[bad[0]])!r} not in {list(names)}"
                            f"{'' if ids or seen is None else ' (the labels of train)'}")
        encoded = np.array([position[t] for t in text], dtype="int64")
    unseen = np.flatnonzero(~np.isin(encoded, seen)) if seen is not None else []
    if len(unseen):
        raise DataError(f"{row_name(where, split, df, unseen[0])}: class {names[encoded[unseen[0]]]!r} is absent "
                        "from train; the model can't learn it")
    return encoded


def _plain(value):
    """A label as the user wrote it: ``2`` rather than ``2.0`` or ``np.int64(2)``."""
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return int(value)
    return value.item() if isinstance(value, np.generic) else value


def warn_rare_classes(train: np.ndarray, names: tuple[str, ...], df: pd.DataFrame, where: str) -> None:
    """A WARNING for each class of one row in train's class ids ``train`` ``[examples]`` (``df``: train's checked
    frame), naming the row: a stray label (``2`` among 0/1, ``Yes`` among yes/no) makes a class of its own."""
    counts = np.bincount(train, minlength=len(names))
    for label in np.flatnonzero(counts == 1):
        row = int(np.flatnonzero(train == label)[0])
        like = [n for n in names if n != names[label] and n.lower() == names[label].lower()]
        log.warning("%s: class %r has this one row of %d; a stray label?%s Fix the row, or list the classes in "
                    "params.yaml data.label_names", row_name(where, "train", df, row), names[label], len(train),
                    f" It differs from class {like[0]!r} only in case." if like else "")


def check_train_classes(train: np.ndarray, names: tuple[str, ...], where: str) -> None:
    """Check that train's class ids ``train`` ``[examples]`` hold at least two classes.

    Raises:
        DataError: train has one class only; naming ``where`` and the class.
    """
    seen = np.unique(train)
    if len(seen) < 2:
        raise DataError(f"{where}: split 'train' has one class only ({names[seen[0]]!r}); a classifier needs at least "
                        "two")
