"""The row rules every split obeys, whatever the task: text and label columns present, rows in the split, no null,
empty or whitespace-only text, no list or mapping values, integer idx with none twice. Each is checked on a pandas
DataFrame of the split and broken with a ``DataError`` naming ``where`` (the folder or file), the split and the row."""

from __future__ import annotations

import numpy as np
import pandas as pd
from datasets import Dataset, Value

from finetune.errors import DataError


def checked_frame(ds: Dataset, split: str, where: str, text_columns: tuple[str, ...],
                  label_column: str) -> pd.DataFrame:
    """The split as a DataFrame once its columns, rows, texts and idx obey the row rules: the text columns (``str``),
    ``label`` (None throughout when absent; only ``train`` and ``validation`` must have ``label_column``, and a test
    split must not have it spelled otherwise: ``Label``, ``label ``) and ``idx``
    (the data's own, else the 0-based row number, with ``df.attrs["numbered"]`` True).

    Raises:
        DataError: a column is missing (with a hint: ``_missing_column_hint``), the split is empty, a text is null,
            empty or whitespace-only, a text or label is a list or mapping, or an idx is not an integer or is repeated;
            naming ``where``, the split and, for a row's fault, the row.
    """
    missing = [c for c in text_columns if c not in ds.column_names]
    if label_column not in ds.column_names and (split in ("train", "validation") or _alike(ds, label_column)):
        missing.append(label_column)  # a test split may be unlabeled, but not by a label header spelled otherwise
    if missing:
        raise DataError(f"{where}: split {split!r} lacks column(s) {missing}; has {ds.column_names}"
                        f"{_missing_column_hint(ds, missing, text_columns, label_column)}")
    if len(ds) == 0:
        raise DataError(f"{where}: split {split!r} is empty")
    df = _frame(ds, text_columns, label_column)
    clean_texts(df, text_columns, where, split)
    _check_plain(df, "label", where, split)
    _check_idx(df, where, split)
    return df


def _missing_column_hint(ds: Dataset, missing: list[str], text_columns: tuple[str, ...], label_column: str) -> str:
    """What the data may mean by its ``missing`` columns: a column of the same name but for case or the spaces
    around it (a spreadsheet's header), or, for the label, classes one-hot in several columns (two or more columns
    of 0 and 1 with a single 1 in each row); '' when neither."""
    for name in missing:
        if alike := _alike(ds, name):
            return (f"; {alike[0]!r} differs from {name!r} only in case or spaces around it: rename the column, or "
                    "name it so in params.yaml")
    if label_column not in missing:
        return ""
    flags = [c for c in ds.column_names if c not in text_columns and c != "idx" and isinstance(ds.features[c], Value)
             and ds.features[c].dtype in ("int64", "int32", "int8", "bool") and set(ds.unique(c)) <= {0, 1}]
    if len(flags) < 2 or not (ds.select_columns(flags).to_pandas().sum(axis=1) == 1).all():
        return ""
    return (f"; the classes one-hot in columns {flags}? give each row's class name in one column {label_column!r}, "
            f"e.g. df[{label_column!r}] = df[{flags}].idxmax(axis=1)")


def _alike(ds: Dataset, name: str) -> list[str]:
    """The columns of ``ds`` named ``name`` but for case or the spaces around it."""
    return [c for c in ds.column_names if c != name and c.strip().lower() == name.strip().lower()]


def _frame(ds: Dataset, text_columns: tuple[str, ...], label_column: str) -> pd.DataFrame:
    """The split's text columns, ``label`` (None throughout when absent) and ``idx`` (0-based rows when absent)."""
    columns = [c for c in dict.fromkeys([*text_columns, label_column, "idx"]) if c in ds.column_names]
    df = ds.select_columns(columns).to_pandas()
    df["label"] = df[label_column] if label_column in df else None
    df.attrs["numbered"] = "idx" not in ds.column_names  # no idx of its own: rows are named by number
    if df.attrs["numbered"]:
        df["idx"] = np.arange(len(df))
    return df


def row_name(where: str, split: str, df: pd.DataFrame, row: int) -> str:
    """Where a row is, for a ``DataError``: ``<where>: split '<split>' row idx=<idx>`` (the data's own idx), or
    ``... row <n>`` (0-based, header not counted) when ``df.attrs["numbered"]``."""
    return f"{where}: split {split!r} {row_label(df, row)}"


def row_label(df: pd.DataFrame, row: int) -> str:
    """A row as ``row_name`` names it, without the file and split: ``row idx=7`` or ``row 7``."""
    return f"row {row}" if df.attrs.get("numbered") else f"row idx={df['idx'].iat[row]}"


def blank(values: pd.Series) -> np.ndarray:
    """Boolean array ``[examples]``: True where a value is null, NaN, empty or only whitespace."""
    return (values.isna() | (values.astype(str).str.strip() == "")).to_numpy()


def clean_texts(df: pd.DataFrame, text_columns: tuple[str, ...], where: str, split: str) -> pd.DataFrame:
    """Each of ``text_columns`` of ``df`` converted to ``str`` in place (``5`` -> ``"5"``) once every text is a single
    non-empty value; returns ``df``. Training, ``tools.predict`` and serving all prepare texts here.

    Raises:
        DataError: a null, empty or whitespace-only text, or a list or mapping; naming ``where``, the split, the first
            bad row (``row_name``) and the column.
    """
    for column in text_columns:
        _check_plain(df, column, where, split)
        text = df[column]
        empty = np.flatnonzero(blank(text))
        if empty.size:
            raise DataError(f"{row_name(where, split, df, empty[0])}: empty {column} (null, empty or only whitespace)")
        df[column] = text.astype(str)
    return df


def _check_plain(df: pd.DataFrame, column: str, where: str, split: str) -> None:
    """Check that every value of ``column`` is a single value (text, number, bool or null).

    Raises:
        DataError: naming the first row that holds a list or mapping; for a mapping, how to write the file instead
            (a JSON file of columns, pandas' ``to_json()`` default, reads as one row of mappings).
    """
    values = df[column]
    if values.dtype != object:
        return
    nested = np.flatnonzero(values.map(lambda v: isinstance(v, (dict, list, tuple, np.ndarray))).to_numpy())
    if nested.size:
        kind = type(values.iat[nested[0]]).__name__
        hint = ("; a JSON file of columns (pandas' to_json() default) reads as one row of mappings: write one record "
                "per line instead, df.to_json(path, orient='records', lines=True)") if kind == "dict" else ""
        raise DataError(f"{row_name(where, split, df, nested[0])}: {column} holds a {kind}, not a single value{hint}")


def _check_idx(df: pd.DataFrame, where: str, split: str) -> None:
    """Check that every idx is an integer and none appears twice in the split.

    Raises:
        DataError: naming the first bad or repeated idx and its rows.
    """
    numbers = pd.to_numeric(df["idx"], errors="coerce").to_numpy(dtype="float64")
    bad = np.flatnonzero(~np.isfinite(numbers) | (numbers != np.round(numbers)))
    if bad.size:
        value = df["idx"].iat[bad[0]]  # the row by its number: its own idx is what is wrong
        value = value.item() if isinstance(value, np.generic) else value
        raise DataError(f"{where}: split {split!r} row {bad[0]}: idx {value!r} is not an integer; "
                        "idx must be unique integers (rename the column if it is not the row's id)")
    repeated = df["idx"].duplicated(keep=False).to_numpy()
    if repeated.any():
        first = df["idx"].to_numpy()[repeated][0]
        rows = np.flatnonzero((df["idx"] == first).to_numpy()).tolist()
        others = df["idx"][repeated].nunique() - 1
        more = f" (and {others} more repeated idx values)" if others else ""
        raise DataError(f"{where}: split {split!r}: idx={first} is repeated in rows {rows}{more}; "
                        "each idx must be unique")

