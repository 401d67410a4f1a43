"""Stage 1, download: the raw MRPC splits and the pretrained checkpoint, with their provenance.

Writes data/raw/ (DatasetDict.save_to_disk), models/pretrained/ (tokenizer + model, save_pretrained) and
metrics/provenance.json (source used, revision, sha256 of the source files, rows and label balance per split).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from datasets import DatasetDict, load_dataset_builder
from datasets.exceptions import DatasetGenerationError, DatasetsError
from transformers import AutoModel, AutoTokenizer

from stages.common import (
    METRICS_DIR,
    PRETRAINED_DIR,
    RAW_DIR,
    DataParams,
    atomic_dir,
    load_params,
    setup_logging,
    write_json,
)
from stages.data import RAW_COLUMNS, SPLITS, DataError, check_raw, label_balance
from stages.modeling import check_checkpoint
from stages.sources import resolve_checkpoint, resolve_dataset

log = setup_logging()

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


def download_dataset(p: DataParams, out_dir: Path) -> dict:
    """Load ``p.dataset``/``p.config`` (or its local copy), check it, save it to ``out_dir``; return provenance.

    Every check runs before ``out_dir`` is touched: on an error, nothing is written.

    Raises:
        SourceError: neither the dataset nor its local copy can be found (``resolve_dataset``).
        DataError: the files can't be loaded (``load_raw``) or the data breaks a rule (``check_raw``).
    """
    source = resolve_dataset(p.dataset, p.config, p.local_copy)
    raw = load_raw(source.path, p.config)
    raw = DatasetDict({split: raw[split] for split in SPLITS if split in raw})
    check_raw(raw, source.path)
    if p.max_samples:
        log.warning("Keeping only the first %d rows of each split (params.yaml data.max_samples)", p.max_samples)
        raw = DatasetDict({s: ds.select(range(min(p.max_samples, len(ds)))) for s, ds in raw.items()})
    with atomic_dir(out_dir) as tmp:
        raw.save_to_disk(str(tmp))
    splits = {split: label_balance(ds) for split, ds in raw.items()}
    log.info("Saved %s to %s: %s", p.dataset, out_dir, {s: v["rows"] for s, v in splits.items()})
    return {**source.provenance(), "config": p.config, "splits": splits}


def download_checkpoint(checkpoint: str, out_dir: Path) -> dict:
    """Copy tokenizer and model of ``checkpoint`` (Hub id or folder) to ``out_dir`` via save_pretrained.

    Raises:
        SourceError: no source has the checkpoint (``resolve_checkpoint``).
        CheckpointError: its folder lacks config, weights or tokenizer (``check_checkpoint``); nothing is written.
    """
    source = resolve_checkpoint(checkpoint)
    check_checkpoint(source.path)
    tokenizer = AutoTokenizer.from_pretrained(source.path)
    model = AutoModel.from_pretrained(source.path)
    with atomic_dir(out_dir) as tmp:
        tokenizer.save_pretrained(tmp)
        model.save_pretrained(tmp)
    parameters = sum(p.numel() for p in model.parameters())
    log.info("Saved %s (%s, %.1f M parameters) to %s", checkpoint, model.config.model_type, parameters / 1e6, out_dir)
    return {**source.provenance(), "model_type": model.config.model_type, "parameters": parameters}


def main() -> None:
    params = load_params()
    provenance = {
        "dataset": download_dataset(params.data, RAW_DIR),
        "checkpoint": download_checkpoint(params.model.checkpoint, PRETRAINED_DIR),
    }
    write_json(METRICS_DIR / "provenance.json", provenance)


if __name__ == "__main__":
    main()
