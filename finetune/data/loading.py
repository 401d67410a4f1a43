"""Loading the data as it comes, before any rule is checked: a GLUE config from a Hub-layout folder (``load_raw``) or
the user's own files, one per split (``load_files``), each into an in-memory DatasetDict or a one-line
``DataError``; and writing a table in the same formats (``check_writable``, ``write_table``).
"""

from __future__ import annotations

import codecs
import csv
import json
import logging
import os
import re
import tempfile
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from datasets import Dataset, DatasetDict, Value, load_dataset, load_dataset_builder
from datasets.exceptions import DatasetGenerationError, DatasetsError

from finetune.errors import DataError
from finetune.runtime import unwritable

log = logging.getLogger(__name__)

# What datasets and pyarrow raise on a bad folder: no data files (FileNotFoundError, DataFilesNotFoundError,
# EmptyDatasetError), an unknown config or mismatched files (ValueError), an unreadable file (ArrowInvalid, OSError).
LOAD_ERRORS = (OSError, ValueError, DatasetsError, pa.ArrowException)

# The user's own files: suffix -> (datasets' packaged builder, its options). A CSV or TSV cell is missing only when
# empty: pandas' default missing-value strings (None, NA, null, n/a, ...) are a user's text or class name. A blank
# line is a row of empty cells (the row rules name it; blank lines at the end are dropped), not skipped, so that the
# rows keep the file's numbers. The file is read in one chunk: pandas guesses a column's type per chunk (datasets'
# default: 10,000 rows), so a longer file could get a column of numbers in one chunk and of words in the next.
TEXT_CELLS = {"keep_default_na": False, "na_values": [""], "skip_blank_lines": False, "chunksize": 2**62}
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

    A CSV or TSV cell is missing only when empty (``None``, ``NA`` and ``null`` are texts). A CSV or TSV is read as
    spreadsheets save it (``_spreadsheet_options``, ``_drop_trailing_empty_rows``): UTF-8 with or without a byte-order
    mark, or UTF-16 with one; a ``.csv`` separated by semicolons; CRLF line ends; empty rows at the end dropped.

    Raises:
        DataError: a file is missing (or its name too long), a folder, empty, has an unknown suffix, text that is
            not UTF-8 (naming the line), a header with a column twice, a first row with more fields than the header,
            no rows, a JSON Lines line that is not JSON (naming the line), or can't be parsed; naming the file and the
            split.
    """
    splits = {}
    for split, file in files.items():
        where = f"{file}: split {split!r}"
        try:
            folder, found = Path(file).is_dir(), Path(file).is_file()
        except OSError as err:  # a name longer than the file system allows
            raise DataError(f"{where}: {err.strerror} ({origin.format(split=split)})") from None
        if folder:
            raise DataError(f"{where}: is a folder; name a file")
        if not found:
            raise DataError(f"{where}: file not found ({origin.format(split=split)})")
        if Path(file).suffix.lower() not in FILE_FORMATS:
            raise DataError(f"{where}: unknown format; use one of {', '.join(FILE_FORMATS)}")
        if Path(file).stat().st_size == 0:
            raise DataError(f"{where}: the file is empty")
        builder, options = FILE_FORMATS[Path(file).suffix.lower()]
        if builder == "csv":
            options = _spreadsheet_options(Path(file), options, where)
            _check_header(Path(file), options, where)
        elif builder != "parquet":
            _check_utf8(Path(file).read_bytes(), where)
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
        if builder == "csv":
            splits[split] = _drop_trailing_empty_rows(splits[split], where)
            if options["delimiter"] == "\t":
                _check_stray_quotes(splits[split], where)
    return DatasetDict(splits)


def _check_stray_quotes(ds: Dataset, where: str) -> None:
    """Check that no cell of a TSV holds both a line break and a tab: the mark of a stray ``"`` at the start of a
    text, which the reader takes for an opening quote, merging the rows up to the next ``"`` into one cell.

    Raises:
        DataError: naming the file, the split, the row (0-based) and the column.
    """
    for column in ds.column_names:
        if not (isinstance(ds.features[column], Value) and ds.features[column].dtype in ("string", "large_string")):
            continue
        for row, cell in enumerate(ds[column]):
            if cell is not None and "\n" in cell and "\t" in cell:
                raise DataError(f"{where} row {row}: {column} holds a line break and a tab, so a quote (\") opened "
                                "it and merged the rows after it into one text; remove the stray quote, or quote "
                                "the text and double its quotes (\"\")")


def _spreadsheet_options(file: Path, options: dict, where: str) -> dict:
    """The CSV reader's ``options`` for ``file`` as a spreadsheet saved it: ``encoding`` UTF-16 when the file starts
    with UTF-16's byte-order mark (Excel's "Unicode Text"), else UTF-8 (checked: ``_check_utf8``; a UTF-8 byte-order
    mark is dropped); ``delimiter`` ``;`` for a ``.csv`` whose header has semicolons and no comma, and ``decimal``
    ``,`` where its data has a digit, a comma and a digit (Excel where the decimal mark is a comma: a score ``3,5`` is
    3.5; ``pandas.to_csv(sep=";")`` writes ``3.5``), logged.

    Raises:
        DataError: the file is neither UTF-16 with a byte-order mark nor UTF-8 (``_check_utf8``).
    """
    data = file.read_bytes()
    utf16 = data[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)
    if not utf16:
        _check_utf8(data, where)
    try:
        header = data.decode("utf-16").split("\n", 1)[0] if utf16 else data.split(b"\n", 1)[0].decode("utf-8-sig")
    except UnicodeDecodeError as err:  # UTF-16's byte-order mark, then bytes that are not UTF-16 (a file cut short)
        raise DataError(f"{where}: starts as UTF-16 but is not ({err.reason} at byte {err.start}): the file is cut "
                        "short or damaged; save it again") from None
    options = {"delimiter": ",", **options, "encoding": "utf-16" if utf16 else "utf-8"}
    if options["delimiter"] == "," and ";" in header and "," not in header:
        decimal_commas = re.search(rb"\d,\d", data.decode("utf-16").encode() if utf16 else data) is not None
        log.info("%s: the header has semicolons and no comma: read as semicolon-separated%s", where,
                 ", with decimal commas" if decimal_commas else "")
        options.update(delimiter=";", **({"decimal": ","} if decimal_commas else {}))
    return options


def _drop_trailing_empty_rows(ds: Dataset, where: str) -> Dataset:
    """``ds`` without the rows at its end whose every cell is empty (a spreadsheet's formatted blank rows, saved as
    ``,,``), with a WARNING naming how many; an empty row among the others stays, for the row rules to name."""
    end = len(ds)
    while end and all(value is None for value in ds[end - 1].values()):
        end -= 1
    if end == len(ds):
        return ds
    log.warning("%s: %d empty row(s) at the end (every cell empty, as a spreadsheet saves its blank rows) dropped",
                where, len(ds) - end)
    return ds.select(range(end))


PANDAS_INDEX = "__index_level_0__"  # pandas' read_csv takes a first column without a header as the rows' index


def _check_utf8(data: bytes, where: str) -> None:
    """Check that a text file's ``data`` is UTF-8 (a byte-order mark allowed).

    Raises:
        DataError: naming the file, the split, and UTF-16 (its byte-order mark) or the first line (1-based, a header
            counted) that is not UTF-8, and how to mend it (Excel on Windows saves "CSV" as cp1252).
    """
    if data[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE):
        raise DataError(f"{where}: is UTF-16 (PowerShell's default); save it as UTF-8, or convert it, e.g. iconv -f "
                        "utf-16 -t utf-8")
    try:
        data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise DataError(f"{where}: line {line} is not UTF-8 (byte {data[err.start]:#04x}); save the file as UTF-8 "
                        "(Excel: 'CSV UTF-8'), or convert it, e.g. iconv -f cp1252 -t utf-8 (Windows' Western "
                        "encoding; latin1 for ISO-8859-1)") from None


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


def _check_header(file: Path, options: dict, where: str) -> None:
    """Check that a CSV or TSV header names each column once; ``options``: the reader's ``delimiter`` and
    ``encoding``.

    Raises:
        DataError: naming the file, the split and the repeated column.
    """
    encoding = "utf-8-sig" if options["encoding"] == "utf-8" else options["encoding"]
    with open(file, newline="", encoding=encoding, errors="replace") as f:
        header = next(csv.reader(f, delimiter=options["delimiter"]), [])
    # empty names are a spreadsheet's blank columns beside the data (pandas names them "Unnamed: N")
    repeated = [c for c in dict.fromkeys(header) if c.strip() and header.count(c) > 1]
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

