"""The MRPC dataset: loading a folder laid out like the Hub repo, the rules its rows must obey, tokenization.

Follows the Hugging Face course, chapter 3 "A full training":
https://huggingface.co/learn/llm-course/chapter3/4
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from datasets import Dataset, DatasetDict, load_dataset_builder
from datasets.exceptions import DatasetGenerationError, DatasetsError
from transformers import PreTrainedTokenizerBase

from finetune.errors import DataError

TEXT_COLUMNS = ("sentence1", "sentence2")
RAW_COLUMNS = ("sentence1", "sentence2", "label", "idx")
SPLITS = ("train", "validation", "test")
UNLABELED = -1  # the Hub's GLUE test splits carry label -1


# What datasets and pyarrow raise on a bad folder: no data files (FileNotFoundError, DataFilesNotFoundError,
# EmptyDatasetError), an unknown config or mismatched files (ValueError), an unreadable file (ArrowInvalid, OSError).
LOAD_ERRORS = (OSError, ValueError, DatasetsError, pa.ArrowException)


def load_raw(folder: str, config: str) -> DatasetDict:
    """``load_dataset(folder, config)`` with one-line errors instead of tracebacks from inside the libraries.

    Done in load_dataset's own two steps (find the data files, then build), with the parquet files checked in
    between (``check_parquet_split``), so a corrupt file or a split without rows is named before the build.
    The build goes to a temporary cache and is read into memory (MRPC is about 1 MB): datasets' cache key for a
    config of a folder's README ignores the files' content, so a shared cache could return the old rows of an
    edited folder (https://github.com/huggingface/datasets/issues/2956).

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
            check_parquet_split(folder, config, split, [str(f) for f in files])
        try:
            builder.download_and_prepare()
            return builder.as_dataset(in_memory=True)
        except LOAD_ERRORS as err:
            raise DataError(f"{folder} (config {config!r}): cannot load: {_reason(err)}") from err


def check_parquet_split(folder: str, config: str, split: str, files: list[str]) -> None:
    """Read the footer of each parquet file of ``split``: readable, with the MRPC columns, and rows in the split.

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
        missing = [c for c in RAW_COLUMNS if c not in metadata.schema.names]
        if missing:
            raise DataError(f"{where}: {name} lacks column(s) {missing}; has {metadata.schema.names}")
        rows += metadata.num_rows
    if parquet and len(parquet) == len(files) and rows == 0:
        names = ", ".join(os.path.relpath(f, folder) for f in parquet)
        raise DataError(f"{where} is empty (no rows in {names})")


def _reason(err: BaseException) -> str:
    """``Type: message`` on one line; for datasets' generic 'error while generating', the error underneath."""
    if isinstance(err, DatasetGenerationError) and err.__cause__ is not None:
        err = err.__cause__
    return f"{type(err).__name__}: {' '.join(str(err).split())}"


def check_raw(raw: DatasetDict, source: str) -> None:
    """Check that ``raw`` looks like MRPC, before anything is saved. The rules, in the order they are checked:

    - the splits train, validation and test exist, each with the columns sentence1, sentence2, label and idx,
      and at least one row;
    - no label is missing (null); train and validation labels are in {0, 1}; test labels are in {0, 1} or all -1
      (unlabeled, as on the Hub);
    - no sentence is null, empty or only whitespace. This is an error, not a row quietly dropped: MRPC has none,
      so one means a damaged file, and dropping rows would change the split that metrics are compared on;
    - no idx appears twice in a split (predictions are matched to rows by idx).

    Every check is vectorised (pandas), so the full MRPC splits take milliseconds.

    Raises:
        DataError: naming ``source``, the split, the offending row (its idx; for a repeated idx, the 0-based
            row numbers) and the rule.
    """
    missing_splits = [s for s in SPLITS if s not in raw]
    if missing_splits:
        raise DataError(f"{source}: missing split(s) {missing_splits}; found {list(raw)}")
    for split in SPLITS:
        ds = raw[split]
        missing = [c for c in RAW_COLUMNS if c not in ds.column_names]
        if missing:
            raise DataError(f"{source}: split {split!r} lacks column(s) {missing}; has {ds.column_names}")
        if len(ds) == 0:
            raise DataError(f"{source}: split {split!r} is empty")
        df = ds.select_columns(list(RAW_COLUMNS)).to_pandas()

        labels = df["label"]
        allowed = {0, 1, UNLABELED} if split == "test" else {0, 1}
        null = np.flatnonzero(labels.isna().to_numpy())
        if null.size:
            raise DataError(f"{_row(source, split, df, null[0])}: label is missing (null); "
                            f"every row needs a label in {sorted(allowed)}")
        bad = np.flatnonzero(~labels.isin(allowed).to_numpy())
        if bad.size:
            raise DataError(f"{_row(source, split, df, bad[0])}: label {labels.iat[bad[0]]} not in {sorted(allowed)}")
        unlabeled = np.flatnonzero((labels == UNLABELED).to_numpy())
        if 0 < unlabeled.size < len(labels):
            raise DataError(f"{_row(source, split, df, unlabeled[0])}: label -1 (unlabeled) among labeled rows; "
                            "the test split is labeled throughout or -1 throughout")

        for column in TEXT_COLUMNS:
            text = df[column]
            empty = np.flatnonzero((text.isna() | (text.astype(str).str.strip() == "")).to_numpy())
            if empty.size:
                raise DataError(f"{_row(source, split, df, empty[0])}: empty {column} "
                                "(null, empty or only whitespace)")

        repeated = df["idx"].duplicated(keep=False).to_numpy()
        if repeated.any():
            first = df["idx"].to_numpy()[repeated][0]
            rows = np.flatnonzero((df["idx"] == first).to_numpy()).tolist()
            others = df["idx"][repeated].nunique() - 1
            more = f" (and {others} more repeated idx values)" if others else ""
            raise DataError(f"{source}: split {split!r}: idx={first} is repeated in rows {rows}{more}; "
                            "each idx must be unique")


def _row(source: str, split: str, df, row: int) -> str:
    """Where a row is, for a DataError: ``<source>: split '<split>' row idx=<idx>``."""
    return f"{source}: split {split!r} row idx={df['idx'].iat[row]}"


def is_labeled(ds: Dataset, label_column: str = "labels") -> bool:
    """True when the split carries real labels (the Hub's GLUE test split has -1 everywhere)."""
    return bool(len(ds)) and int(np.asarray(ds[label_column]).min()) != UNLABELED


def label_balance(ds: Dataset) -> dict:
    """Rows and label counts of a raw split: ``{"rows": n, "label_0": n0, "label_1": n1, "label_1_fraction": f}``."""
    labels = np.asarray(ds["label"])
    n1 = int((labels == 1).sum())
    return {"rows": len(ds), "label_0": int((labels == 0).sum()), "label_1": n1,
            "label_1_fraction": round(n1 / len(ds), 4) if len(ds) else None}


def tokenize(raw: DatasetDict, tokenizer: PreTrainedTokenizerBase, max_length: int | None) -> DatasetDict:
    """Tokenize sentence pairs as the course does: ``tokenizer(s1, s2, truncation=True)`` via ``map(batched=True)``.

    No padding here: DataCollatorWithPadding pads each batch to its own longest sequence.

    Returns:
        A DatasetDict with columns ``input_ids``, ``token_type_ids`` (BERT), ``attention_mask``, ``labels``;
        sentence1, sentence2 and idx are dropped (row order is kept, so row i is raw row i).
    """

    def encode(batch):
        return tokenizer(batch["sentence1"], batch["sentence2"], truncation=True, max_length=max_length)

    # keep_in_memory: no cache file is written into the input folder (a DVC output of the download stage).
    tokenized = raw.map(encode, batched=True, remove_columns=["sentence1", "sentence2", "idx"], keep_in_memory=True,
                        desc="Tokenizing")
    return tokenized.rename_column("label", "labels")


def length_stats(ds: Dataset, max_length: int) -> dict:
    """Token-length statistics of a tokenized split (tokens per example, special tokens included)."""
    lengths = np.array(token_lengths(ds))
    return {"examples": int(lengths.size), "mean": round(float(lengths.mean()), 2), "median": float(np.median(lengths)),
            "p95": float(np.percentile(lengths, 95)), "max": int(lengths.max()), "min": int(lengths.min()),
            "truncated": int((lengths >= max_length).sum()), "max_length": max_length}


def token_lengths(ds: Dataset) -> list[int]:
    """Tokens per example (special tokens included) of a tokenized split, in row order."""
    return [len(ids) for ids in ds["input_ids"]]
