"""Loading the data as it comes, before any rule is checked: a GLUE config from a Hub-layout folder (``load_raw``) or
the user's own files, one per split (``load_files``), each into an in-memory DatasetDict or a one-line
``DataError``; and writing a table in the same formats (``check_writable``, ``write_table``).
"""

from __future__ import annotations

import csv
import json
import os
import tempfile
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from datasets import DatasetDict, load_dataset, load_dataset_builder
from datasets.exceptions import DatasetGenerationError, DatasetsError

from finetune.errors import DataError
from finetune.runtime import unwritable

# What datasets and pyarrow raise on a bad folder: no data files (FileNotFoundError, DataFilesNotFoundError,
# EmptyDatasetError), an unknown config or mismatched files (ValueError), an unreadable file (ArrowInvalid, OSError).
LOAD_ERRORS = (OSError, ValueError, DatasetsError, pa.ArrowException)

# The user's own files: suffix -> (datasets' packaged builder, its options). A CSV or TSV cell is missing only when
# empty: pandas' default missing-value strings (None, NA, null, n/a, ...) are a user's text or class name.
TEXT_CELLS = {"keep_default_na": False, "na_values": [""]}
FILE_FORMATS = {".csv": ("csv", TEXT_CELLS), ".tsv": ("csv", {"delimiter": "\t", **TEXT_CELLS}),
                ".json": ("json", {}), ".jsonl": ("json", {}), ".parquet": ("parquet", {})}


def load_raw(folder: str, config: str, text_columns: tuple[str, ...] = (),
             label_column: str | None = None) -> DatasetDict:
    """``load_dataset(folder, config)`` into memory, with one-line errors. Parquet files are checked before the build
    (``check_parquet_split``); the build uses a temporary cache because datasets' cache key for a folder's config
    ignores the files' content (https://github.com/huggingface/datasets/issues/2956).

    Args:
        folder: a dataset folder in the Hub's layout.
        text_columns: columns every split's parquet files must have.
        label_column: a column every non-``test*`` split's parquet files must have.

    Raises:
        DataError: the folder has no data files for ``config``, ``config`` is unknown, a data file is unreadable or
            lacks a column, a split has no rows, or the build fails; naming the folder, the config (the split and the
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
    """Check the footer of each parquet file of ``split``: readable, with ``columns``, and rows in the split. Other
    formats are left to the build; a column missing from one split's file is caught here because the build would fill it
    with nulls from the other splits' schema.

    Raises:
        DataError: a file is not readable parquet or lacks a column, or the split's files hold no rows; naming the file
            (relative to ``folder``).
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


def load_files(files: dict[str, Path], origin: str = "params.yaml data.files.{split}") -> DatasetDict:
    """The user's own files (``files``: split -> file) read into memory by datasets' packaged builder for the suffix
    (``FILE_FORMATS``), one split per file. ``origin``: where the paths came from, for a missing file's message
    (``{split}`` is filled in).

    A CSV or TSV cell is missing only when empty (``None``, ``NA`` and ``null`` are texts).

    Raises:
        DataError: a file is missing, a folder, empty, has an unknown suffix, text that is not UTF-8 (naming the
            line), a header with a column twice, a first row with more fields than the header, no rows, a JSON Lines
            line that is not JSON (naming the line), or can't be parsed; naming the file and the split.
    """
    splits = {}
    for split, file in files.items():
        where = f"{file}: split {split!r}"
        if Path(file).is_dir():
            raise DataError(f"{where}: is a folder; name a file")
        if not Path(file).is_file():
            raise DataError(f"{where}: file not found ({origin.format(split=split)})")
        if Path(file).suffix.lower() not in FILE_FORMATS:
            raise DataError(f"{where}: unknown format; use one of {', '.join(FILE_FORMATS)}")
        if Path(file).stat().st_size == 0:
            raise DataError(f"{where}: the file is empty")
        builder, options = FILE_FORMATS[Path(file).suffix.lower()]
        if builder != "parquet":
            _check_utf8(Path(file), where)
        if builder == "csv":
            _check_header(Path(file), options.get("delimiter", ","), where)
        with tempfile.TemporaryDirectory(prefix="datasets-cache-") as cache_dir:
            try:
                splits[split] = load_dataset(builder, data_files={split: str(file)}, split=split, cache_dir=cache_dir,
                                             keep_in_memory=True, **options)
            except (*LOAD_ERRORS, StopIteration) as err:
                if "corresponds to no data" in str(err):
                    raise DataError(f"{where}: has no rows") from None
                if Path(file).suffix.lower() == ".jsonl":
                    _check_json_lines(Path(file), where)
                raise DataError(f"{where}: cannot read: {_reason(err)}") from err
        if PANDAS_INDEX in splits[split].column_names:
            raise DataError(f"{where}: its first row has more fields than the header (a text with an unquoted "
                            "delimiter?); quote such texts")
    return DatasetDict(splits)


PANDAS_INDEX = "__index_level_0__"  # pandas' read_csv takes a first column without a header as the rows' index


def _check_utf8(file: Path, where: str) -> None:
    """Check that a text file is UTF-8 (a byte-order mark allowed).

    Raises:
        DataError: naming the file, the split, the first line (1-based, a header counted) that is not UTF-8 and how to
            mend it.
    """
    data = file.read_bytes()
    try:
        data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise DataError(f"{where}: line {line} is not UTF-8 (byte {data[err.start]:#04x}); save the file as UTF-8, "
                        "e.g. iconv -f latin1 -t utf-8 (or your editor's 'Save as UTF-8')") from None


def _check_json_lines(file: Path, where: str) -> None:
    """Check that every non-blank line of a JSON Lines file is one JSON value.

    Raises:
        DataError: naming the file, the split, the first bad line (1-based) and Python's ``json`` error.
    """
    with open(file, encoding="utf-8-sig") as f:
        for number, line in enumerate(f, start=1):
            if line.strip():
                try:
                    json.loads(line)
                except json.JSONDecodeError as err:
                    raise DataError(f"{where}: line {number} is not valid JSON: {err.msg} (column {err.colno}); "
                                    "JSON Lines holds one record per line") from None


def _check_header(file: Path, delimiter: str, where: str) -> None:
    """Check that a CSV or TSV header names each column once.

    Raises:
        DataError: naming the file, the split and the repeated column.
    """
    with open(file, newline="", encoding="utf-8-sig", errors="replace") as f:
        header = next(csv.reader(f, delimiter=delimiter), [])
    repeated = [c for c in dict.fromkeys(header) if header.count(c) > 1]
    if repeated:
        raise DataError(f"{where}: column {repeated[0]!r} appears twice in the header; column names must be unique")


# What ``write_table`` writes, by suffix: the formats ``load_files`` reads (JSON: a list of records).
WRITE_FORMATS = {
    ".csv": lambda df, file: df.to_csv(file, index=False),
    ".tsv": lambda df, file: df.to_csv(file, sep="\t", index=False),
    ".json": lambda df, file: df.to_json(file, orient="records", force_ascii=False),
    ".jsonl": lambda df, file: df.to_json(file, orient="records", lines=True, force_ascii=False),
    ".parquet": lambda df, file: df.to_parquet(file, index=False),
}


def check_writable(file: Path, key: str) -> None:
    """Check that ``write_table`` can write ``file``: a known suffix, not a folder, its folder made and writable.

    Raises:
        DataError: naming ``key`` (what named the file, e.g. ``--out``), the file and what is wrong.
    """
    if file.is_dir():
        raise DataError(f"{key} {file}: is a folder; name a file in it")
    if file.suffix.lower() not in WRITE_FORMATS:
        raise DataError(f"{key} {file}: unknown format {file.suffix!r}; use one of {', '.join(WRITE_FORMATS)}")
    if reason := unwritable(file):
        raise DataError(f"{key} {file}: {reason}")


def write_table(df: pd.DataFrame, file: Path) -> None:
    """Write ``df`` to ``file`` in the format of its suffix (``WRITE_FORMATS``), whole or not at all (a temp file
    beside it, renamed when complete, removed on any error).

    Raises:
        DataError: an unknown suffix, or the file can't be written; naming the file.
    """
    if file.suffix.lower() not in WRITE_FORMATS:
        raise DataError(f"{file}: unknown format {file.suffix!r}; use one of {', '.join(WRITE_FORMATS)}")
    partial = file.with_name(f".{file.name}.tmp")
    try:
        WRITE_FORMATS[file.suffix.lower()](df, partial)
        os.replace(partial, file)
    except OSError as err:
        raise DataError(f"{file}: cannot write: {_reason(err)}") from None
    finally:
        partial.unlink(missing_ok=True)


def _reason(err: BaseException) -> str:
    """``Type: message`` on one line; for datasets' ``DatasetGenerationError``, the error underneath."""
    if isinstance(err, DatasetGenerationError) and err.__cause__ is not None:
        err = err.__cause__
    return f"{type(err).__name__}: {' '.join(str(err).split())}"

