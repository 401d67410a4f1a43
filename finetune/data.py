"""The data: loading a Hub-layout folder or the user's own files, the rules rows must obey, preparing the splits for
any task (labels to ids, a validation split carved from train when there is none), tokenization.

Tokenization follows the Hugging Face course, chapter 3 "A full training":
https://huggingface.co/learn/llm-course/chapter3/4
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from datasets import ClassLabel, Dataset, DatasetDict, Features, Value, load_dataset, load_dataset_builder
from datasets.exceptions import DatasetGenerationError, DatasetsError
from transformers import PreTrainedTokenizerBase

from finetune.errors import DataError
from finetune.params import DataParams
from finetune.tasks import GLUE_TASKS, Task, glue_task, own_task

log = logging.getLogger(__name__)

SPLITS = ("train", "validation", "test", "validation_mismatched", "test_mismatched")  # kept, in this order
UNLABELED = -1  # the Hub's GLUE test splits carry label -1
SWAPPED = "swapped_"  # prefix of the columns that hold a pair in the other order (tokenize with swapped)

# What datasets and pyarrow raise on a bad folder: no data files (FileNotFoundError, DataFilesNotFoundError,
# EmptyDatasetError), an unknown config or mismatched files (ValueError), an unreadable file (ArrowInvalid, OSError).
LOAD_ERRORS = (OSError, ValueError, DatasetsError, pa.ArrowException)

# The user's own files: suffix -> (datasets' packaged builder, its options).
FILE_FORMATS = {".csv": ("csv", {}), ".tsv": ("csv", {"delimiter": "\t"}), ".json": ("json", {}),
                ".jsonl": ("json", {}), ".parquet": ("parquet", {})}


def load_raw(folder: str, config: str, text_columns: tuple[str, ...] = (), label_column: str | None = None) -> DatasetDict:
    """``load_dataset(folder, config)`` with one-line errors instead of tracebacks from inside the libraries.

    Done in load_dataset's own two steps (find the data files, then build), with the parquet files checked in
    between (``check_parquet_split``: each split's files must have ``text_columns``, and ``label_column`` unless
    the split is a test split), so a corrupt file, a missing column or a split without rows is named before the
    build. The build goes to a temporary cache and is read into memory:
    datasets' cache key for a config of a folder's README ignores the files' content, so a shared cache could
    return the old rows of an edited folder (https://github.com/huggingface/datasets/issues/2956).

    Raises:
        DataError: the folder has no data files for ``config``, ``config`` is unknown, a data file is unreadable,
            a split has no rows, or the build fails; the message names the folder, the config (the split and the
            file when known) and the underlying reason.
    """
    with tempfile.TemporaryDirectory(prefix="datasets-cache-") as cache_dir:
        try:
            builder = load_dataset_builder(folder, config, cache_dir=cache_dir)
        except LOAD_ERRORS as err:
            raise DataError(f"{folder} (config {config!r}): cannot load: {_reason(err)}") from err
        for split, files in (builder.config.data_files or {}).items():
            labeled = label_column is not None and not split.startswith("test")
            check_parquet_split(folder, config, split, [str(f) for f in files],
                                [*text_columns, *([label_column] if labeled else [])])
        try:
            builder.download_and_prepare()
            return builder.as_dataset(in_memory=True)
        except LOAD_ERRORS as err:
            raise DataError(f"{folder} (config {config!r}): cannot load: {_reason(err)}") from err


def check_parquet_split(folder: str, config: str, split: str, files: list[str], columns: list[str]) -> None:
    """Read the footer of each parquet file of ``split``: readable, with ``columns``, and rows in the split.

    Files of other formats are left to the build. A column missing from one split's file must be caught here:
    the build would fill it with nulls from the other splits' schema.

    Raises:
        DataError: a file is not readable parquet or lacks a column, or the split's files hold no rows;
            naming the file (relative to ``folder``).
    """
    where = f"{folder} (config {config!r}): split {split!r}"
    parquet = [f for f in files if f.endswith(".parquet")]
    rows = 0
    for file in parquet:
        name = os.path.relpath(file, folder)
        try:
            metadata = pq.read_metadata(file)
        except LOAD_ERRORS as err:
            raise DataError(f"{where}: {name} is not a readable parquet file: {_reason(err)}") from err
        missing = [c for c in columns if c not in metadata.schema.names]
        if missing:
            raise DataError(f"{where}: {name} lacks column(s) {missing}; has {metadata.schema.names}")
        rows += metadata.num_rows
    if parquet and len(parquet) == len(files) and rows == 0:
        names = ", ".join(os.path.relpath(f, folder) for f in parquet)
        raise DataError(f"{where} is empty (no rows in {names})")


def load_files(files: dict[str, Path]) -> DatasetDict:
    """The user's own files, one per split, each read by datasets' packaged builder for its suffix
    (``FILE_FORMATS``: CSV, TSV, JSON / JSON Lines, Parquet) into memory.

    Raises:
        DataError: a file is missing, has an unknown suffix or can't be parsed; naming the file and the split.
    """
    splits = {}
    for split, file in files.items():
        if not Path(file).is_file():
            raise DataError(f"{file}: split {split!r}: file not found (params.yaml data.files.{split})")
        if Path(file).suffix.lower() not in FILE_FORMATS:
            raise DataError(f"{file}: split {split!r}: unknown format; use one of {', '.join(FILE_FORMATS)}")
        builder, options = FILE_FORMATS[Path(file).suffix.lower()]
        with tempfile.TemporaryDirectory(prefix="datasets-cache-") as cache_dir:
            try:
                splits[split] = load_dataset(builder, data_files={split: str(file)}, split=split, cache_dir=cache_dir,
                                             keep_in_memory=True, **options)
            except LOAD_ERRORS as err:
                raise DataError(f"{file}: split {split!r}: cannot read: {_reason(err)}") from err
    return DatasetDict(splits)


def _reason(err: BaseException) -> str:
    """``Type: message`` on one line; for datasets' generic 'error while generating', the error underneath."""
    if isinstance(err, DatasetGenerationError) and err.__cause__ is not None:
        err = err.__cause__
    return f"{type(err).__name__}: {' '.join(str(err).split())}"


def data_columns(p: DataParams) -> tuple[tuple[str, ...], str]:
    """The text columns and the label column of the data ``p`` names: a GLUE task's own, else params.yaml's
    ``data.text_columns`` and ``data.label_column``."""
    if p.glue_task:
        return GLUE_TASKS[p.glue_task].text_columns, "label"
    return tuple(p.text_columns or ()), p.label_column


def prepare_raw(raw: DatasetDict, p: DataParams, where: dict[str, str]) -> tuple[DatasetDict, Task]:
    """Check ``raw`` against the rules and bring it to the pipeline's shape; return it and its Task.

    The shape: splits among ``SPLITS`` (MNLI's ``validation_matched`` / ``test_matched`` renamed), each with the
    task's text columns (strings), ``label`` (a ``ClassLabel`` of the class names, or float32 for regression;
    absent in an unlabeled split) and ``idx`` (the data's own, else the 0-based row number); other columns dropped.

    The task: a GLUE task by ``p.config``; own data by ``p.text_columns`` and ``p.label_column``, with class
    names from the label's ``ClassLabel`` feature, else ``p.label_names`` (their order is the id order; labels may
    be names or ids), else the sorted distinct labels of train. Float labels, or ``p.task_type: regression``,
    make it regression.

    The rules, each checked on every split before anything is saved: a train split; the text and label columns
    (test may lack the label, or hold -1 / nulls throughout: unlabeled); rows in every split; no null, empty or
    whitespace-only text (an error, not a row dropped quietly: dropping rows would change the split that metrics
    are compared on); labels not null, of one type across splits, among the class names (classification) or
    finite numbers (regression); no idx twice in a split; at least two classes in train, and none in another split
    that train lacks. Vectorised (pandas): the full SST-2 train split takes well under a second.

    Args:
        where: split -> what to name in errors (the dataset folder, or the user's file).

    Raises:
        DataError: naming the folder or file, the split, the row (``idx=``, or its 0-based number) and the rule.
    """
    if p.glue_task:  # MNLI's matched splits are its validation and test
        raw = DatasetDict({GLUE_TASKS[p.glue_task].splits.get(s, s): ds for s, ds in raw.items()})
        where = {GLUE_TASKS[p.glue_task].splits.get(s, s): w for s, w in where.items()}
    raw = DatasetDict({s: raw[s] for s in SPLITS if s in raw})
    if "train" not in raw:
        raise DataError(f"{next(iter(where.values()), 'data')}: no train split; found {list(raw)}")
    text_columns, label_column = data_columns(p)
    frames = {split: _checked_frame(ds, split, where[split], text_columns, label_column) for split, ds in raw.items()}

    # labels: names (or regression), then ids, train first: the other splits may only hold its classes
    regression = GLUE_TASKS[p.glue_task].label_names is None if p.glue_task else _is_regression(raw["train"], p)
    names, ids = (None, False) if regression else _label_names(raw["train"], frames, p, where)
    labels = {"train": _encode_labels(frames["train"], "train", where["train"], names, ids)}
    if names is not None:
        _check_train_classes(labels["train"], names, where["train"])
    for split, df in frames.items():
        if split != "train":
            labels[split] = _encode_labels(df, split, where[split], names, ids, seen=labels["train"])
    try:
        task = glue_task(p.glue_task) if p.glue_task else \
            own_task(text_columns, names, p.positive_label, bool(p.symmetric))
    except ValueError as err:
        raise DataError(f"{where['train']}: {err}") from None

    label_feature = Value("float32") if regression else ClassLabel(names=list(names))
    return DatasetDict({split: _prepared(df, labels[split], text_columns, label_feature)
                        for split, df in frames.items()}), task


def _checked_frame(ds: Dataset, split: str, where: str, text_columns: tuple[str, ...],
                   label_column: str) -> pd.DataFrame:
    """The split as a DataFrame (``_frame``) once its columns, rows, texts and idx obey the rules."""
    missing = [c for c in text_columns if c not in ds.column_names]
    if split in ("train", "validation") and label_column not in ds.column_names:
        missing.append(label_column)
    if missing:
        raise DataError(f"{where}: split {split!r} lacks column(s) {missing}; has {ds.column_names}")
    if len(ds) == 0:
        raise DataError(f"{where}: split {split!r} is empty")
    df = _frame(ds, text_columns, label_column)
    check_text(df, text_columns, where, split)
    _check_idx(df, where, split)
    return df


def _prepared(df: pd.DataFrame, labels: np.ndarray | None, text_columns: tuple[str, ...], label_feature) -> Dataset:
    """The split in the pipeline's shape: text columns, ``label`` (unless unlabeled) and ``idx``."""
    columns = {c: df[c].astype(str).tolist() for c in text_columns}
    features = {c: Value("string") for c in text_columns}
    if labels is not None:
        columns["label"], features["label"] = labels.tolist(), label_feature
    columns["idx"], features["idx"] = df["idx"].astype("int64").tolist(), Value("int64")
    return Dataset.from_dict(columns, features=Features(features))


def _frame(ds: Dataset, text_columns: tuple[str, ...], label_column: str) -> pd.DataFrame:
    """The split's text columns, ``label`` (None throughout when absent) and ``idx`` (0-based rows when absent)."""
    columns = [c for c in dict.fromkeys([*text_columns, label_column, "idx"]) if c in ds.column_names]
    df = ds.select_columns(columns).to_pandas()
    df["label"] = df[label_column] if label_column in df else None
    df.attrs["numbered"] = "idx" not in ds.column_names  # no idx of its own: rows are named by number
    if df.attrs["numbered"]:
        df["idx"] = np.arange(len(df))
    return df


def _row(where: str, split: str, df: pd.DataFrame, row: int) -> str:
    """Where a row is, for a DataError: ``<where>: split '<split>' row idx=<idx>`` (the data's own idx), or
    ``row <n>`` (0-based, the header not counted) for data without one."""
    if df.attrs.get("numbered"):
        return f"{where}: split {split!r} row {row}"
    return f"{where}: split {split!r} row idx={df['idx'].iat[row]}"


def check_text(df: pd.DataFrame, text_columns: tuple[str, ...], where: str, split: str) -> None:
    """Every text of ``df``'s ``text_columns`` must be non-empty (not null, not only whitespace).

    Raises:
        DataError: naming ``where``, the split, the first empty row (its idx, or its 0-based number when
            ``df.attrs["numbered"]``) and the column.
    """
    for column in text_columns:
        text = df[column]
        empty = np.flatnonzero((text.isna() | (text.astype(str).str.strip() == "")).to_numpy())
        if empty.size:
            raise DataError(f"{_row(where, split, df, empty[0])}: empty {column} (null, empty or only whitespace)")


def _check_idx(df: pd.DataFrame, where: str, split: str) -> None:
    repeated = df["idx"].duplicated(keep=False).to_numpy()
    if repeated.any():
        first = df["idx"].to_numpy()[repeated][0]
        rows = np.flatnonzero((df["idx"] == first).to_numpy()).tolist()
        others = df["idx"][repeated].nunique() - 1
        more = f" (and {others} more repeated idx values)" if others else ""
        raise DataError(f"{where}: split {split!r}: idx={first} is repeated in rows {rows}{more}; "
                        "each idx must be unique")


def _missing(labels: pd.Series) -> np.ndarray:
    """Null, NaN or empty-string labels, as a boolean array."""
    return (labels.isna() | (labels.astype(str).str.strip() == "")).to_numpy()


def _label_kind(value) -> str:
    if isinstance(value, (bool, np.bool_)):
        return "bool"
    if isinstance(value, (int, np.integer)):
        return "integer"
    if isinstance(value, (float, np.floating)):
        return "float"
    return "string"


def _check_label_kinds(frames: dict[str, pd.DataFrame], where: dict[str, str]) -> str:
    """The one kind (string, integer, float, bool) of every label of every split (``integer`` when there are none).

    Raises:
        DataError: two kinds of label, within a split or across splits; naming the first row of the second kind.
    """
    first = None
    for split, df in frames.items():
        present = np.flatnonzero(~_missing(df["label"]))
        kinds = np.array([_label_kind(v) for v in df["label"].to_numpy()[present]])
        for i, kind in zip(present, kinds):
            if first is None:
                first = (kind, split)
            elif kind != first[0]:
                raise DataError(f"{_row(where[split], split, df, i)}: label {df['label'].iat[i]!r} is a {kind}, but "
                                f"split {first[1]!r} has {first[0]} labels; labels must be of one type")
    return first[0] if first else "integer"


def _is_regression(train: Dataset, p: DataParams) -> bool:
    if isinstance(train.features.get(p.label_column), ClassLabel):
        return False
    if p.task_type is not None:
        return p.task_type == "regression"
    return train.features[p.label_column].dtype.startswith("float")


def _label_names(train: Dataset, frames: dict[str, pd.DataFrame], p: DataParams,
                 where: dict[str, str]) -> tuple[tuple[str, ...], bool]:
    """``(names, ids)``: the class names in id order, and whether numeric labels are ids into them (True) or the
    names themselves (labels 1, 2, 5 read off the data). Names come from GLUE's task, the label's ClassLabel,
    ``p.label_names``, else train's sorted distinct labels.

    Raises:
        DataError: labels of two types (``_check_label_kinds``).
    """
    if p.glue_task:
        return GLUE_TASKS[p.glue_task].label_names, True
    feature = train.features.get(p.label_column)
    if isinstance(feature, ClassLabel):
        return tuple(feature.names), True
    kind = _check_label_kinds(frames, where)
    if p.label_names is not None:
        return tuple(p.label_names), kind != "string"
    labels = frames["train"]["label"]
    values = sorted(set(_plain(v) for v in labels[~_missing(labels)].tolist()))
    return tuple(str(v) for v in values), False


def _encode_labels(df: pd.DataFrame, split: str, where: str, names: tuple[str, ...] | None, ids: bool,
                   seen: np.ndarray | None = None) -> np.ndarray | None:
    """The split's labels as class ids (or float scores for regression, ``names`` None); None when unlabeled.

    ``ids``: numeric labels are ids into ``names`` (else every label is matched to a name as text). ``seen``: train's
    class ids, for the splits after it: a class train lacks is an error.

    Raises:
        DataError: a null, unknown or non-numeric label, -1 among labeled rows, or a class train lacks; naming the
            row.
    """
    labels = df["label"]
    missing = _missing(labels)
    marker = np.array([_label_kind(v) in ("integer", "float") and v == UNLABELED for v in labels], dtype=bool)
    if split.startswith("test") and (missing | marker).all():
        return None  # an unlabeled test split: predictions only
    if marker.any() and split.startswith("test") and names is not None and ids:
        raise DataError(f"{_row(where, split, df, np.flatnonzero(marker)[0])}: label -1 (unlabeled) among labeled "
                        "rows; the test split is labeled throughout or -1 throughout")
    if missing.any():
        rule = "a number (regression)" if names is None else f"a label in {list(names)}"
        raise DataError(f"{_row(where, split, df, np.flatnonzero(missing)[0])}: label is missing (null); "
                        f"every row needs {rule}")
    if names is None:
        scores = pd.to_numeric(labels, errors="coerce").to_numpy(dtype="float64")
        bad = np.flatnonzero(~np.isfinite(scores))
        if bad.size:
            raise DataError(f"{_row(where, split, df, bad[0])}: label {_plain(labels.iat[bad[0]])!r} is not a finite "
                            "number (regression labels are numbers)")
        return scores.astype("float32")
    values = labels.to_numpy()
    if ids and _label_kind(values[0]) != "string":
        numbers = values.astype("float64")
        bad = np.flatnonzero(~np.isin(numbers, np.arange(len(names))))
        if bad.size:
            raise DataError(f"{_row(where, split, df, bad[0])}: label {_plain(values[bad[0]])} not in "
                            f"{list(range(len(names)))} (the ids of {list(names)})")
        encoded = numbers.astype("int64")
    else:
        position = {name: i for i, name in enumerate(names)}
        text = np.array([str(_plain(v)) for v in values])
        bad = np.flatnonzero(~np.isin(text, list(position)))
        if bad.size:
            raise DataError(f"{_row(where, split, df, bad[0])}: label {str(text[bad[0]])!r} not in {list(names)}"
                            f"{'' if ids or seen is None else ' (the labels of train)'}")
        encoded = np.array([position[t] for t in text], dtype="int64")
    unseen = np.flatnonzero(~np.isin(encoded, seen)) if seen is not None else []
    if len(unseen):
        raise DataError(f"{_row(where, split, df, unseen[0])}: class {names[encoded[unseen[0]]]!r} is absent from "
                        "train; the model can't learn it")
    return encoded


def _plain(value):
    """A label as the user wrote it: 2 rather than 2.0 or np.int64(2)."""
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return int(value)
    return value.item() if isinstance(value, np.generic) else value


def _check_train_classes(train: np.ndarray, names: tuple[str, ...], where: str) -> None:
    """Train holds at least two classes."""
    seen = np.unique(train)
    if len(seen) < 2:
        raise DataError(f"{where}: split 'train' has one class only ({names[seen[0]]!r}); a classifier needs at least "
                        "two")


def carve_validation(train: Dataset, fraction: float, seed: int, stratify: bool) -> tuple[Dataset, Dataset]:
    """``(train, validation)``: a seeded split of ``fraction`` of train rows, stratified by label for
    classification (``Dataset.train_test_split``), for data that has no validation split."""
    parts = train.train_test_split(test_size=fraction, seed=seed, stratify_by_column="label" if stratify else None)
    return parts["train"], parts["test"]


def split_summary(ds: Dataset, task: Task) -> dict:
    """Rows and labels of a prepared split: per class name (count and fraction), or score mean, std, min and max."""
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
    """Those of ``splits`` (``evaluate.splits``) that ``data`` has, warning about each it lacks (SST-2 and STS-B
    have no test split in the local copy: evaluation covers what exists)."""
    for split in splits:
        if split not in data:
            log.warning("No %s split in the data (it has %s): skipped", split, ", ".join(data))
    return [split for split in splits if split in data]


def tokenize(raw: DatasetDict, tokenizer: PreTrainedTokenizerBase, max_length: int | None,
             text_columns: tuple[str, ...], swapped: bool = False) -> DatasetDict:
    """Tokenize as the course does: ``tokenizer(s1, s2, truncation=True)`` (or ``tokenizer(s, ...)`` for a
    single-sentence task) via ``map(batched=True)``.

    No padding here: DataCollatorWithPadding pads each batch to its own longest sequence. With ``swapped`` (a
    symmetric pair task), each row also holds the pair in the other order, ``tokenizer(s2, s1, ...)``, under
    ``SWAPPED`` + the column name; ``finetune.batches.PairCollator`` picks one order per row.

    Returns:
        A DatasetDict with columns ``input_ids``, ``token_type_ids`` (where the tokenizer gives them: BERT,
        ELECTRA, DeBERTa-v2; not RoBERTa, DistilBERT, MPNet), ``attention_mask`` (each swapped too with
        ``swapped``) and, in labeled splits, ``labels``; the text columns and idx are dropped (row order is kept, so
        row i is raw row i).
    """

    def encode(batch):
        texts = [batch[c] for c in text_columns]
        encoded = tokenizer(*texts, truncation=True, max_length=max_length)
        if swapped:
            other = tokenizer(*texts[::-1], truncation=True, max_length=max_length)
            encoded.update({SWAPPED + name: values for name, values in other.items()})
        return encoded

    # keep_in_memory: no cache file is written into the input folder (a DVC output of the download stage).
    tokenized = DatasetDict({
        split: ds.map(encode, batched=True, remove_columns=[*text_columns, "idx"], keep_in_memory=True,
                      desc=f"Tokenizing {split}")
        for split, ds in raw.items()})
    return DatasetDict({split: ds.rename_column("label", "labels") if "label" in ds.column_names else ds
                        for split, ds in tokenized.items()})


def length_stats(ds: Dataset, max_length: int) -> dict:
    """Token-length statistics of a tokenized split (tokens per example, special tokens included)."""
    lengths = np.array(token_lengths(ds))
    return {"examples": int(lengths.size), "mean": round(float(lengths.mean()), 2), "median": float(np.median(lengths)),
            "p95": float(np.percentile(lengths, 95)), "max": int(lengths.max()), "min": int(lengths.min()),
            "truncated": int((lengths >= max_length).sum()), "max_length": max_length}


def token_lengths(ds: Dataset) -> list[int]:
    """Tokens per example (special tokens included) of a tokenized split, in row order."""
    return [len(ids) for ids in ds["input_ids"]]
