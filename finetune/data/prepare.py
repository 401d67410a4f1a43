"""Preparing the loaded splits for any task: the rules checked and the splits brought to the pipeline's shape with
their Task (``prepare_raw``), a validation split carved from train (``carve_validation``), split summaries, and which
of the asked-for splits exist and carry labels."""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd
from datasets import ClassLabel, Dataset, DatasetDict, Features, Value

from finetune.data.checks import checked_frame
from finetune.data.labels import (
    check_train_classes,
    encode_labels,
    is_regression,
    label_names,
    trim_labels,
    warn_rare_classes,
)
from finetune.errors import DataError, ParamsError
from finetune.params import DataParams, first_repeated
from finetune.tasks import GLUE_TASKS, Task, glue_task, own_task

log = logging.getLogger(__name__)

SPLITS = ("train", "validation", "test", "validation_mismatched", "test_mismatched")  # kept, in this order


def data_columns(p: DataParams) -> tuple[tuple[str, ...], str]:
    """The text columns and the label column: a GLUE task's own, else ``data.text_columns`` and
    ``data.label_column``."""
    if p.glue_task:
        return GLUE_TASKS[p.glue_task].text_columns, "label"
    return tuple(p.text_columns or ()), p.label_column


def check_own_columns(p: DataParams) -> None:
    """Check that the own-data keys name each column once.

    Raises:
        ParamsError: a text column listed twice, the label column among the text columns, or a class name listed twice;
            naming the key.
    """
    texts = list(p.text_columns or ())
    if (twice := first_repeated(texts)) is not None:
        raise ParamsError(f"params.yaml: data.text_columns: {twice!r} is listed twice")
    if p.label_column in texts:
        raise ParamsError(f"params.yaml: data.text_columns: {p.label_column!r} is also data.label_column; the model "
                          "would read its answer")
    names = list(p.label_names or ())
    if (twice := first_repeated(names)) is not None:
        raise ParamsError(f"params.yaml: data.label_names: {twice!r} is listed twice")


def prepare_raw(raw: DatasetDict, p: DataParams, where: dict[str, str]) -> tuple[DatasetDict, Task]:
    """Check ``raw`` (the splits as loaded) against the row and label rules and return it in the pipeline's shape, with
    its task. ``where``: split -> what to name in errors (the dataset folder, or the user's file).

    The shape: splits among ``SPLITS`` (MNLI's ``validation_matched`` / ``test_matched`` renamed to ``validation`` /
    ``test``), each with the task's text columns (strings), ``label`` (a ``ClassLabel`` of the class names, or float32
    for regression; absent in an unlabeled split) and ``idx`` (int64: the data's own, else the 0-based row number);
    other columns dropped.

    The task: a GLUE task by ``p.config``; own data by ``p.text_columns`` and ``p.label_column``, with class names from
    the label's ``ClassLabel``, else ``p.label_names`` (their order is the id order; labels may be names or ids), else
    train's sorted distinct labels (a WARNING names the row of a class with one train row: ``warn_rare_classes``). Text
    labels are read without the spaces around them (``trim_labels``). Float labels with a fraction among them, or
    ``p.task_type: regression``, make it a regression (``is_regression``).

    The rules, checked on every split before anything is returned: a train split; the text and label columns (a test
    split may lack the label, or hold -1 or null throughout: unlabeled); rows in every split; no null, empty or
    whitespace-only text; labels not null, all numbers or all words across splits, among the class names
    (classification) or finite numbers (regression); integer idx, none twice in a split; at least two classes in train,
    and none elsewhere that train lacks.

    Raises:
        ParamsError: a text column or class name listed twice, the label column among the text columns
            (``check_own_columns``), ``data.label_names`` / ``data.positive_label`` set for a regression, or a
            ``data.positive_label`` / ``data.symmetric`` the data does not allow (``own_task``); naming the key.
        DataError: no train split, or a broken rule (naming the folder or file, the split, the row and the rule).
    """
    if p.glue_task:  # MNLI's matched splits are its validation and test
        raw = DatasetDict({GLUE_TASKS[p.glue_task].splits.get(s, s): ds for s, ds in raw.items()})
        where = {GLUE_TASKS[p.glue_task].splits.get(s, s): w for s, w in where.items()}
    raw = DatasetDict({s: raw[s] for s in SPLITS if s in raw})
    if "train" not in raw:
        raise DataError(f"{next(iter(where.values()), 'data')}: no train split; found {list(raw)}")
    text_columns, label_column = data_columns(p)
    if not p.glue_task:
        check_own_columns(p)
    frames = {split: checked_frame(ds, split, where[split], text_columns, label_column) for split, ds in raw.items()}
    if not p.glue_task:
        trim_labels(frames, where)

    # labels: names (or regression), then ids, train first: the other splits may only hold its classes
    regression = GLUE_TASKS[p.glue_task].label_names is None if p.glue_task else \
        is_regression(raw["train"], p, where["train"])
    if regression and not p.glue_task and (p.label_names or p.positive_label):
        key = "label_names" if p.label_names else "positive_label"
        raise ParamsError(f"params.yaml: data.{key} is set, but the task is a regression ({where['train']}'s "
                          "labels are floats, or data.task_type: regression); set data.task_type: classification, "
                          f"or data.{key}: null")
    names, ids = (None, False) if regression else label_names(raw["train"], frames, p, where)
    labels = {"train": encode_labels(frames["train"], "train", where["train"], names, ids)}
    if names is not None:
        check_train_classes(labels["train"], names, where["train"])
        if not p.glue_task and p.label_names is None:
            warn_rare_classes(labels["train"], names, frames["train"], where["train"])
    for split, df in frames.items():
        if split != "train":
            labels[split] = encode_labels(df, split, where[split], names, ids, seen=labels["train"])
    try:
        task = glue_task(p.glue_task) if p.glue_task else \
            own_task(text_columns, names, p.positive_label, bool(p.symmetric), where["train"])
    except ValueError as err:
        raise ParamsError(f"params.yaml: {err}") from None

    label_feature = Value("float32") if regression else ClassLabel(names=list(names))
    return DatasetDict({split: _prepared(df, labels[split], text_columns, label_feature)
                        for split, df in frames.items()}), task


def _prepared(df: pd.DataFrame, labels: np.ndarray | None, text_columns: tuple[str, ...], label_feature) -> Dataset:
    """The split in the pipeline's shape: text columns, ``label`` (unless unlabeled) and ``idx``."""
    columns = {c: df[c].astype(str).tolist() for c in text_columns}
    features = {c: Value("string") for c in text_columns}
    if labels is not None:
        columns["label"], features["label"] = labels.tolist(), label_feature
    columns["idx"], features["idx"] = df["idx"].astype("int64").tolist(), Value("int64")
    return Dataset.from_dict(columns, features=Features(features))


def carve_validation(train: Dataset, fraction: float, seed: int, stratify: bool,
                     where: str = "train") -> tuple[Dataset, Dataset]:
    """``(train, validation)``: ``fraction`` of train's rows split off as validation, for data that has none
    (``Dataset.train_test_split`` with ``seed``; stratified by label when ``stratify``).

    Raises:
        DataError: a class has fewer than two train rows (stratified), or the split is impossible for ``fraction``;
            naming ``where`` and the params keys to change.
    """
    if stratify:
        names = train.features["label"].names
        counts = np.bincount(np.asarray(train["label"]), minlength=len(names))
        rare = [f"{names[i]!r} ({n} row)" for i, n in enumerate(counts) if 0 < n < 2]
        if rare:
            raise DataError(f"{where}: split 'train': class {', '.join(rare)} has too few rows to carve a stratified "
                            "validation split (at least 2 per class); add rows, drop the class, or give a "
                            "validation file (params.yaml data.files.validation)")
    try:
        parts = train.train_test_split(test_size=fraction, seed=seed,
                                       stratify_by_column="label" if stratify else None)
    except ValueError as err:
        raise DataError(f"{where}: split 'train' ({len(train)} rows): cannot carve a validation split of "
                        f"data.validation_fraction {fraction}: {err}") from None
    return parts["train"], parts["test"]


def check_scores_vary(data: DatasetDict, task: Task, where: dict[str, str]) -> None:
    """Check that each labeled split but train of a regression holds at least two different scores: Pearson and
    Spearman are undefined on constant scores (a split of one row among them). ``where``: split -> what to name
    (train's for a carved split).

    Raises:
        DataError: naming the file or folder, the split, its rows and score, and what to change.
    """
    if not task.is_regression:
        return
    for split, ds in data.items():
        if split != "train" and "label" in ds.column_names and len(set(ds["label"])) < 2:
            raise DataError(f"{where.get(split, where['train'])}: split {split!r}: {len(ds)} row(s), every score "
                            f"{ds['label'][0]:g}: Pearson and Spearman are undefined on constant scores; give it rows "
                            "of at least two different scores (or a larger data.max_samples or "
                            "data.validation_fraction)")


def split_summary(ds: Dataset, task: Task) -> dict:
    """Rows and labels of a prepared split: ``{"rows", "labeled": False}`` when unlabeled; for classification
    ``{"rows", "labels": {name: {"count", "fraction"}}}``; for regression ``{"rows", "label_mean", "label_std",
    "label_min", "label_max"}``."""
    summary = {"rows": len(ds)}
    if "label" not in ds.column_names:
        return {**summary, "labeled": False}
    labels = np.asarray(ds["label"])
    if task.is_regression:
        return {**summary, "label_mean": round(float(labels.mean()), 4), "label_std": round(float(labels.std()), 4),
                "label_min": float(labels.min()), "label_max": float(labels.max())}
    counts = {name: int((labels == i).sum()) for i, name in enumerate(task.label_names)}
    return {**summary, "labels": {name: {"count": n, "fraction": round(n / len(ds), 4)} for name, n in counts.items()}}


def is_labeled(ds: Dataset) -> bool:
    """True when the split carries labels (a raw ``label`` or a tokenized ``labels`` column)."""
    return "labels" in ds.column_names or "label" in ds.column_names


def present_splits(splits: list[str], data: DatasetDict) -> list[str]:
    """Those of ``splits`` (``evaluate.splits``) that ``data`` has, in order; a WARNING names each it lacks."""
    for split in splits:
        if split not in data:
            log.warning("No %s split in the data (it has %s): skipped", split, ", ".join(data))
    return [split for split in splits if split in data]

