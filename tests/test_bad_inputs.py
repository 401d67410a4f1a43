"""Bad input stops a stage with one clear line naming the folder, split, row and rule, and writes nothing.

Each bad dataset is the good tiny one with one change, written as a folder laid out like the Hub's nyu-mll/glue
and loaded the way the download stage loads it (``download_dataset``).
"""

import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
from transformers import BertConfig, BertForSequenceClassification

from finetune.data.download import download_checkpoint, download_dataset
from finetune.errors import CheckpointError, DataError, ParamsError, SourceError
from finetune.modeling import load_classifier
from finetune.tasks import glue_task
from tests.helpers import make_split, own_frame, tiny_params, write_hub_folder


def with_cell(splits: dict, split: str, row: int, column: str, value) -> dict:
    """``splits`` with one cell changed (the column becomes nullable, so ``value`` may be None)."""
    df = splits[split].copy()
    df[column] = df[column].astype(object)
    df.at[row, column] = value
    return {**splits, split: df}


def without(splits: dict, split: str) -> dict:
    return {s: df for s, df in splits.items() if s != split}


MRPC = glue_task("mrpc")


@pytest.fixture
def good(tiny_raw) -> dict[str, pd.DataFrame]:
    """The tiny dataset as one DataFrame per split (label as plain int64, as pandas writes it)."""
    return {split: tiny_raw[split].to_pandas() for split in tiny_raw}


# (id, the change to the good splits, error, message with the dataset folder written <folder>)
BAD_DATASETS = [
    ("missing-folder", lambda d: None, SourceError,
     ("dataset '<folder>' (params.yaml data.dataset) is neither a local folder nor reachable on the Hub, "
      "and no local copy is set (params.yaml data.local_copy: null)")),
    ("empty-folder", lambda d: {}, DataError,
     ("<folder> (config 'mrpc'): cannot load: EmptyDatasetError: The directory at <folder> doesn't contain any "
      "data files")),
    ("corrupt-parquet", lambda d: {**d, "train": b"this is not parquet" * 10}, DataError,
     ("<folder> (config 'mrpc'): split 'train': mrpc/train-00000-of-00001.parquet is not a readable parquet file: "
      "ArrowInvalid: ")),
    ("readme-split-without-files", lambda d: {**d, "validation": None}, DataError,
      "<folder> (config 'mrpc'): cannot load: ValueError: Couldn't infer the same data file format for all splits"),
    ("missing-train", lambda d: without(d, "train"), DataError,
      "<folder>: no train split; found ['validation', 'test']"),
    ("empty-split", lambda d: {**d, "validation": d["validation"].iloc[:0]}, DataError,
      "<folder> (config 'mrpc'): split 'validation' is empty (no rows in mrpc/validation-00000-of-00001.parquet)"),
    ("missing-column", lambda d: {**d, "validation": d["validation"].drop(columns="label")}, DataError,
     ("<folder> (config 'mrpc'): split 'validation': mrpc/validation-00000-of-00001.parquet lacks column(s) ['label']; "
      "has ['sentence1', 'sentence2', 'idx']")),
    ("label-2-train", lambda d: with_cell(d, "train", 5, "label", 2), DataError,
      "<folder>: split 'train' row idx=5: label 2 not in [0, 1]"),
    ("label-minus-1-validation", lambda d: with_cell(d, "validation", 4, "label", -1), DataError,
      "<folder>: split 'validation' row idx=4: label -1 not in [0, 1]"),
    ("label-2-test", lambda d: with_cell(d, "test", 0, "label", 2), DataError,
      "<folder>: split 'test' row idx=0: label 2 not in [0, 1] (the ids of ['not_equivalent', 'equivalent'])"),
    ("test-partly-unlabeled", lambda d: with_cell(d, "test", 2, "label", -1), DataError,
     ("<folder>: split 'test' row idx=2: label -1 (unlabeled) among labeled rows; the test split is labeled "
      "throughout or -1 throughout")),
    ("null-label", lambda d: with_cell(d, "train", 6, "label", None), DataError,
     ("<folder>: split 'train' row idx=6: label is missing (null); every row needs a label in "
      "['not_equivalent', 'equivalent']")),
    ("null-sentence", lambda d: with_cell(d, "train", 3, "sentence2", None), DataError,
      "<folder>: split 'train' row idx=3: empty sentence2 (null, empty or only whitespace)"),
    ("blank-sentence", lambda d: with_cell(d, "validation", 8, "sentence1", " \t"), DataError,
      "<folder>: split 'validation' row idx=8: empty sentence1 (null, empty or only whitespace)"),
    ("duplicate-idx", lambda d: with_cell(d, "train", 7, "idx", 3), DataError,
      "<folder>: split 'train': idx=3 is repeated in rows [3, 7]; each idx must be unique"),
    ("duplicate-idx-twice", lambda d: with_cell(with_cell(d, "test", 9, "idx", 1), "test", 12, "idx", 4), DataError,
     ("<folder>: split 'test': idx=1 is repeated in rows [1, 9] (and 1 more repeated idx values); "
      "each idx must be unique")),
]


def _load(folder: Path, out_dir: Path, config: str = "mrpc") -> dict:
    return download_dataset(tiny_params(data={"dataset": str(folder), "config": config, "local_copy": None}).data,
                            out_dir)


def _assert_nothing_written(out_dir: Path) -> None:
    assert not out_dir.exists()
    assert not list(out_dir.parent.glob(f".{out_dir.name}.*.tmp"))


def test_the_good_folder_loads(good, tmp_path):
    record = _load(write_hub_folder(tmp_path / "glue", good), tmp_path / "raw")
    assert {split: v["rows"] for split, v in record["splits"].items()} == {"train": 40, "validation": 21, "test": 19}


def test_an_unlabeled_test_split_loads(good, tmp_path):
    # The Hub's GLUE test split: label -1 in every row.
    folder = write_hub_folder(tmp_path / "glue", {**good, "test": make_split(19, 2, labeled=False)})
    assert _load(folder, tmp_path / "raw")["splits"]["test"]["rows"] == 19


@pytest.mark.parametrize("change,error,message", [case[1:] for case in BAD_DATASETS],
                         ids=[case[0] for case in BAD_DATASETS])
def test_bad_dataset_is_named_in_one_line(good, tmp_path, change, error, message):
    folder = write_hub_folder(tmp_path / "glue", change(good))
    out_dir = tmp_path / "data" / "raw"
    with pytest.raises(error) as err:
        _load(folder, out_dir)
    text = str(err.value)
    assert "\n" not in text
    assert message in text.replace(str(folder.resolve()), "<folder>").replace(str(folder), "<folder>")
    _assert_nothing_written(out_dir)


def test_unknown_config_lists_the_available_ones(good, tmp_path):
    folder = write_hub_folder(tmp_path / "glue", good)
    with pytest.raises(DataError) as err:
        _load(folder, tmp_path / "raw", config="sst2")
    message = str(err.value)
    assert message.startswith(f"{folder.resolve()} (config 'sst2'): cannot load: ValueError: BuilderConfig 'sst2'")
    assert "'mrpc'" in message
    _assert_nothing_written(tmp_path / "raw")


def test_library_error_is_chained(good, tmp_path):
    # The underlying error stays reachable (``raise ... from err``) for whoever needs the full traceback.
    folder = write_hub_folder(tmp_path / "glue", {})
    with pytest.raises(DataError) as err:
        _load(folder, tmp_path / "raw")
    assert isinstance(err.value.__cause__, FileNotFoundError)


# The user's own files (data.files): each bad file is a good tiny CSV with one change, loaded as download does.

def _own(tmp_path, monkeypatch, frames: dict, **data) -> dict:
    """Write ``frames`` (split -> DataFrame, or a file name -> text) under tmp_path/data/own and download them."""
    monkeypatch.chdir(tmp_path)  # a stage runs in the project root
    files = {}
    for split, frame in frames.items():
        name = frame[0] if isinstance(frame, tuple) else f"{split}.csv"
        path = tmp_path / "data" / "own" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(frame, tuple):
            path.write_bytes(frame[1]) if isinstance(frame[1], bytes) else path.write_text(frame[1])
        else:
            frame.to_csv(path, index=False)
        files[split] = f"data/own/{name}"
    params = tiny_params(data={"dataset": None, "config": None, "local_copy": None, "files": files,
                               "text_columns": ["question", "answer"], "label_column": "verdict", **data})
    return download_dataset(params.data, tmp_path / "data" / "raw")


def _cell(df, row, column, value):
    df = df.copy()
    df[column] = df[column].astype(object)
    df.at[row, column] = value
    return df


def _own_good():
    return {"train": own_frame("pair-2", 30, 0), "validation": own_frame("pair-2", 12, 1)}


def _own_numbers():
    """The good files with 0/1 labels."""
    return {split: df.assign(verdict=(df["verdict"] == "yes").astype(int)) for split, df in _own_good().items()}


def _regression():
    return {"train": own_frame("pair-regression", 20, 0).rename(columns={"sentence1": "question", "sentence2": "answer",
                                                                         "score": "verdict"})}


# (id, the files, extra data params, the message)
BAD_OWN_FILES = [
    ("misspelled-text-column", lambda: {**_own_good(), "validation": _own_good()["validation"].rename(
        columns={"answer": "answr"})}, {},
     "data/own/validation.csv: split 'validation' lacks column(s) ['answer']; has ['question', 'answr', 'verdict']"),
    ("missing-label-column", lambda: {**_own_good(), "train": _own_good()["train"].drop(columns="verdict")}, {},
     "data/own/train.csv: split 'train' lacks column(s) ['verdict']; has ['question', 'answer']"),
    ("label-outside-declared-names", lambda: {**_own_good(), "validation": _cell(_own_good()["validation"], 3,
                                                                                  "verdict", "maybe")},
     {"label_names": ["no", "yes"]},
     "data/own/validation.csv: split 'validation' row 3: label 'maybe' not in ['no', 'yes']"),
    ("label-outside-train-labels", lambda: {**_own_good(), "validation": _cell(_own_good()["validation"], 5,
                                                                                "verdict", "maybe")}, {},
     "data/own/validation.csv: split 'validation' row 5: label 'maybe' not in ['no', 'yes'] (the labels of train)"),
    ("class-absent-from-train", lambda: {**_own_good(), "validation": _cell(_own_good()["validation"], 2,
                                                                             "verdict", "maybe")},
     {"label_names": ["no", "yes", "maybe"]},
     "data/own/validation.csv: split 'validation' row 2: class 'maybe' is absent from train; the model can't learn it"),
    ("train-with-one-class", lambda: {**_own_good(), "train": _own_good()["train"].assign(verdict="yes")}, {},
     "data/own/train.csv: split 'train' has one class only ('yes'); a classifier needs at least two"),
    ("empty-text", lambda: {**_own_good(), "train": _cell(_own_good()["train"], 4, "answer", "   ")}, {},
     "data/own/train.csv: split 'train' row 4: empty answer (null, empty or only whitespace)"),
    ("non-numeric-regression-label", lambda: {"train": _cell(_regression()["train"], 6, "verdict", "high")},
     {"task_type": "regression"},
     "data/own/train.csv: split 'train' row 6: label 'high' is not a finite number (regression labels are numbers)"),
    ("nan-regression-label", lambda: {"train": _cell(_regression()["train"], 2, "verdict", float("nan"))}, {},
     "data/own/train.csv: split 'train' row 2: label is missing (null); every row needs a number (regression)"),
    ("mixed-label-types", lambda: {"train": ("train.jsonl", '{"question": "a?", "answer": "b", "verdict": 1}\n'
                                             '{"question": "c?", "answer": "d", "verdict": 0}\n'),
                                   "validation": ("dev.jsonl",
                                                  '{"question": "e?", "answer": "f", "verdict": "yes"}\n')},
     {}, "data/own/dev.jsonl: split 'validation' row 0: label 'yes': this split's labels are words, but those of "
         "data/own/train.jsonl (split 'train') are numbers (e.g. 1); write every file's labels the same way"),
    # the train file mixes 0/1 and yes/no (a CSV column of both is read as text) beside a clean 0/1 validation file
    ("labels-mixing-numbers-and-words-in-a-csv", lambda: {**_own_numbers(), "train": _cell(_cell(
        _own_numbers()["train"], 4, "verdict", "yes"), 7, "verdict", "no")}, {},
     "data/own/train.csv: split 'train' row 0: label 0 is a number, but row 4's label 'yes' is a word: labels mix "
     "numbers and words; write them all as class names or all as class ids (or list every class in params.yaml "
     "data.label_names)"),
    # the split whose labels differ from the other splits' is named: here train's words against 0/1 elsewhere
    ("a-file-whose-labels-differ-from-the-others", lambda: {**_own_numbers(), "train": _own_good()["train"],
                                                            "test": _own_numbers()["validation"]}, {},
     "data/own/train.csv: split 'train' row 0: label 'no': this split's labels are words, but those of "
     "data/own/validation.csv (split 'validation') are numbers (e.g. 1); write every file's labels the same way"),
    ("unknown-format", lambda: {"train": ("train.xlsx", "not a spreadsheet")}, {},
     "data/own/train.xlsx: split 'train': unknown format; use one of .csv, .tsv, .json, .jsonl, .parquet"),
    ("unparsable-json", lambda: {"train": ("train.json", "{not json")}, {},
     "data/own/train.json: split 'train': cannot read: "),
    ("labels-mixing-strings-and-numbers-in-jsonl", lambda: {"train": ("train.jsonl", "".join(
        f'{{"question": "q{i}?", "answer": "a{i}", "verdict": {v}}}\n' for i, v in enumerate(['"1"', "1", '"yes"'])))},
     {}, "data/own/train.jsonl: split 'train' row 0: label 1 is a number, but row 2's label 'yes' is a word: labels "
         "mix numbers and words"),
    ("json-of-columns", lambda: {"train": ("train.json", _own_good()["train"].to_json())}, {},
     "data/own/train.json: split 'train' row 0: question holds a dict, not a single value; a JSON file of columns "
     "(pandas' to_json() default) reads as one row of mappings: write one record per line instead"),
    ("a-list-as-text", lambda: {"train": ("train.jsonl", '{"question": ["a", "b"], "answer": "c", "verdict": "yes"}\n'
                                                         '{"question": "d", "answer": "e", "verdict": "no"}\n')},
     {}, "data/own/train.jsonl: split 'train' row 0: question holds a list, not a single value"),
    ("a-class-of-one-row-and-no-validation-file", lambda: {"train": _cell(_own_good()["train"], 3, "verdict", "maybe")},
     {}, "data/own/train.csv: split 'train': class 'maybe' (1 row) has too few rows to carve a stratified validation "
         "split (at least 2 per class); add rows, drop the class, or give a validation file"),
    ("first-row-with-more-fields-than-the-header", lambda: {"train": ("train.csv", "question,answer,verdict\n"
                                                                     "good, day,fine,yes\nbad, day,poor,no\n")},
     {}, "data/own/train.csv: split 'train': its first row has more fields than the header (a text with an unquoted "
         "delimiter?); quote such texts"),
    ("a-column-twice-in-the-header", lambda: {"train": ("train.csv", "question,answer,answer,verdict\na,b,c,yes\n")},
     {}, "data/own/train.csv: split 'train': column 'answer' appears twice in the header; column names must be unique"),
    ("an-empty-jsonl-file", lambda: {"train": ("train.jsonl", "")}, {}, "data/own/train.jsonl: split 'train': the file "
                                                                         "is empty"),
    ("a-header-only-csv", lambda: {"train": ("train.csv", "question,answer,verdict\n")}, {},
     "data/own/train.csv: split 'train': has no rows"),
    ("an-idx-that-is-not-an-integer", lambda: {"train": ("train.csv", "idx,question,answer,verdict\n"
                                                                      "a,q,x,yes\nb,r,y,no\n")},
     {}, "data/own/train.csv: split 'train' row 0: idx 'a' is not an integer; idx must be unique integers"),
    ("a-blank-idx", lambda: {"train": ("train.csv", "idx,question,answer,verdict\n0,q,x,yes\n,r,y,no\n")},
     {}, "data/own/train.csv: split 'train' row 1: idx nan is not an integer; idx must be unique integers"),
    ("a-blank-line-among-the-rows", lambda: {"train": ("train.csv", "question,answer,verdict\nq,x,yes\n\nr,y,no\n")},
     {}, "data/own/train.csv: split 'train' row 1: "),
    ("labels-mixing-numbers-and-words-after-10000-rows", lambda: {"train": ("train.csv", "question,answer,verdict\n"
                                                                            + "q,a,1\nr,b,0\n" * 5000 + "s,c,yes\n")},
     {}, "data/own/train.csv: split 'train' row 0: label 1 is a number, but row 10000's label 'yes' is a word: labels "
         "mix numbers and words"),
    ("a-cp1252-csv", lambda: {"train": ("train.csv", "question,answer,verdict\nq,a,yes\ncaf\xe9?,b,no\n".encode(
        "cp1252"))}, {}, "data/own/train.csv: split 'train': line 3 is not UTF-8 (byte 0xe9); save the file as UTF-8 "
                         "(Excel: 'CSV UTF-8'), or convert it, e.g. iconv -f cp1252 -t utf-8"),
    ("a-utf-16-json-lines-file", lambda: {"train": ("train.jsonl", '{"question": "a", "answer": "b", "verdict": 1}\n'
                                                                  .encode("utf-16"))},
     {}, "data/own/train.jsonl: split 'train': is UTF-16 (PowerShell's default); save it as UTF-8, or convert it"),
    ("a-utf-16-csv-cut-short", lambda: {"train": ("train.tsv", "question\tanswer\tverdict\na\tb\tyes\n"
                                                                .encode("utf-16")[:-1])},
     {}, "data/own/train.tsv: split 'train': starts as UTF-16 but is not (truncated data at byte "),
    ("a-malformed-json-lines-file",
     lambda: {"train": ("train.jsonl", '{"question": "a", "answer": "b", "verdict": 1}\n'
                                       '{"question": "c", "answer": "d" "verdict": 0}\n')},
     {}, "data/own/train.jsonl: split 'train': line 2 is not valid JSON: Expecting ',' delimiter (column 33); JSON "
         "Lines holds one record per line"),
    ("a-blank-train-label-among-0-and-1", lambda: {**_own_numbers(), "train": _cell(_own_numbers()["train"], 4,
                                                                                    "verdict", None)},
     {}, "data/own/train.csv: split 'train' row 4: label is missing (null); every row needs a label in ['0', '1']"),
    ("blank-labels-in-a-labeled-test-file", lambda: {**_own_numbers(), "test": _cell(_cell(_own_numbers()[
        "validation"], 2, "verdict", None), 5, "verdict", None)},
     {}, "data/own/test.csv: split 'test' row 2: label is missing (null); every row needs a label in ['0', '1'] (or "
         "none: a test split may be unlabeled throughout)"),
    ("a-regression-validation-split-of-one-row",
     lambda: {**_regression(), "validation": _regression()["train"].head(1)}, {},
     "data/own/validation.csv: split 'validation': 1 row(s), every score "),
    ("data.max_samples-leaving-train-one-class",
     lambda: {**_own_good(), "train": _own_good()["train"].sort_values("verdict")}, {"max_samples": 5},
     "data/own/train.csv (its first 5 rows: data.max_samples): split 'train' has one class only ('no'); a classifier "
     "needs at least two"),
    ("too-few-rows-for-the-validation-fraction", lambda: {"train": _own_good()["train"].head(4)},
     {"validation_fraction": 0.1}, "data/own/train.csv: split 'train' (4 rows): cannot carve a validation split of "
                                   "data.validation_fraction 0.1: "),
]


@pytest.mark.parametrize("frames,data,message", [case[1:] for case in BAD_OWN_FILES],
                         ids=[case[0] for case in BAD_OWN_FILES])
def test_bad_own_file_is_named_in_one_line(tmp_path, monkeypatch, frames, data, message):
    with pytest.raises(DataError) as err:
        _own(tmp_path, monkeypatch, frames(), **data)
    assert "\n" not in str(err.value)
    assert message in str(err.value)
    _assert_nothing_written(tmp_path / "data" / "raw")


BAD_OWN_PARAMS = [
    ("a-text-column-twice", {"text_columns": ["answer", "answer"]},
     "params.yaml: data.text_columns: 'answer' is listed twice"),
    ("the-label-column-as-a-text-column", {"text_columns": ["question", "verdict"]},
     "params.yaml: data.text_columns: 'verdict' is also data.label_column; the model would read its answer"),
    ("a-class-name-twice", {"label_names": ["no", "no"]}, "params.yaml: data.label_names: 'no' is listed twice"),
]


@pytest.mark.parametrize("data,message", [case[1:] for case in BAD_OWN_PARAMS], ids=[c[0] for c in BAD_OWN_PARAMS])
def test_own_data_keys_naming_a_column_twice_are_refused(tmp_path, monkeypatch, data, message):
    with pytest.raises(ParamsError, match=f"^{re.escape(message)}$"):
        _own(tmp_path, monkeypatch, _own_good(), **data)
    _assert_nothing_written(tmp_path / "data" / "raw")


def test_class_names_for_a_regression_are_refused(tmp_path, monkeypatch):
    with pytest.raises(ParamsError, match=r"^params.yaml: data.label_names is set, but the task is a regression "
                                          r"\(data/own/train.csv's labels are floats"):
        _own(tmp_path, monkeypatch, _regression(), label_names=["low", "high"])


def test_the_good_own_files_load(tmp_path, monkeypatch):
    assert _own(tmp_path, monkeypatch, _own_good())["splits"]["train"]["rows"] == 30


def test_missing_value_words_are_texts_and_class_names(tmp_path, monkeypatch):
    # pandas reads None, NA, null as missing by default; here only an empty cell is
    from datasets import load_from_disk

    train = _own_good()["train"].assign(verdict=lambda d: d["verdict"].replace({"no": "None"}))
    train.loc[3, "answer"], train.loc[5, "question"] = "NA", "null"
    record = _own(tmp_path, monkeypatch, {**_own_good(), "train": train,
                                          "validation": _own_good()["validation"].replace({"no": "None"})})
    assert record["task"]["label_names"] == ("None", "yes")
    raw = load_from_disk(str(tmp_path / "data" / "raw"))
    assert {"NA", "null"} <= set(raw["train"]["answer"]) | set(raw["train"]["question"])


def test_a_decimal_point_among_integer_labels_keeps_a_classification(tmp_path, monkeypatch, caplog):
    frames = {**_own_numbers(), "train": _cell(_own_numbers()["train"], 3, "verdict", "1.0")}
    record = _own(tmp_path, monkeypatch, frames)
    assert record["task"]["label_names"] == ("0", "1")  # not a regression
    assert "data/own/train.csv: split 'train': the labels are written as numbers with a decimal point or with " \
           "blanks, but all are whole numbers (0, 1): read as classes; set data.task_type: regression" in caplog.text


@pytest.mark.parametrize("stray,message", [
    (2, "data/own/train.csv: split 'train' row 6: class '2' has this one row of 30; a stray label? Fix the row, or "
        "list the classes in params.yaml data.label_names"),
    ("Yes", "data/own/train.csv: split 'train' row 6: class 'Yes' has this one row of 30; a stray label? It differs "
            "from class 'yes' only in case. Fix the row"),
], ids=["2-among-0-and-1", "Yes-among-yes-and-no"])
def test_a_class_of_one_train_row_is_named_in_a_warning(tmp_path, monkeypatch, caplog, stray, message):
    good = _own_numbers() if stray == 2 else _own_good()
    _own(tmp_path, monkeypatch, {**good, "train": _cell(good["train"], 6, "verdict", stray)})
    assert message in caplog.text


@pytest.mark.parametrize("label_names,labels,classes", [
    (["1", "2", "3", "4", "5"], [1, 2, 3, 4] * 8, [0, 1, 2, 3] * 8),  # star ratings: numbers that are the names
    (["no", "yes"], ['"0"', '"1"'] * 16, [0, 1] * 16),  # ids written as JSON strings
    (["no", "yes"], [0, 1] * 16, [0, 1] * 16),  # ids
])
def test_label_names_are_matched_as_written_else_indexed(tmp_path, monkeypatch, label_names, labels, classes):
    from datasets import load_from_disk

    lines = "".join(f'{{"question": "q{i}?", "answer": "a{i}", "verdict": {v}}}\n' for i, v in enumerate(labels))
    files = {"train": ("train.jsonl", lines), "validation": ("dev.jsonl", lines)}
    record = _own(tmp_path, monkeypatch, files, label_names=label_names)
    assert record["task"]["label_names"] == tuple(label_names)
    assert load_from_disk(str(tmp_path / "data" / "raw"))["train"]["label"] == classes


def test_numbers_as_texts_are_read_as_text(tmp_path, monkeypatch):
    from datasets import load_from_disk

    rows = [{"question": f"q{i}?", "answer": i if i % 3 else f"a{i}", "verdict": "yes" if i % 2 else "no"}
            for i in range(12)]
    frames = {"train": ("train.jsonl", "".join(json.dumps(row) + "\n" for row in rows))}
    _own(tmp_path, monkeypatch, frames)
    raw = load_from_disk(str(tmp_path / "data" / "raw"))
    answers = list(raw["train"]["answer"]) + list(raw["validation"]["answer"])
    assert all(isinstance(a, str) for a in answers) and "4" in answers and "a3" in answers


def test_labels_differing_only_by_spaces_around_them_are_one_class(tmp_path, monkeypatch, caplog):
    # as spreadsheets export them: " yes" and "no " are yes and no, and the positive class stays yes
    from datasets import load_from_disk

    spaced = {split: df.assign(verdict=[f" {v}" if i % 2 else f"{v} " for i, v in enumerate(df["verdict"])])
              for split, df in _own_good().items()}
    record = _own(tmp_path, monkeypatch, spaced, positive_label="yes")
    assert record["task"]["label_names"] == ("no", "yes") and record["task"]["positive_label"] == 1
    raw = load_from_disk(str(tmp_path / "data" / "raw"))
    assert raw["train"]["label"] == (_own_good()["train"]["verdict"] == "yes").astype(int).tolist()
    trimmed = [r.getMessage() for r in caplog.records if "spaces around labels are dropped" in r.getMessage()]
    assert trimmed == ["data/own/train.csv: split 'train' row 0: label 'no ' read as 'no': spaces around labels are "
                       "dropped, in every split"]


@pytest.mark.parametrize("positive,labels,message", [
    ("yes", ["no", "yes", "maybe"], "params.yaml: data.positive_label: 'yes' is set, but data/own/train.csv has 3 "
                                    "classes ['maybe', 'no', 'yes']; it names the class whose F1 is reported for two "
                                    "classes (more are scored by macro-F1): set data.positive_label: null"),
    ("maybe", ["no", "yes"], "params.yaml: data.positive_label: 'maybe' is not a class of data/own/train.csv "
                             "['no', 'yes']"),
], ids=["a-three-class-task", "not-a-class"])
def test_positive_label_is_a_class_of_a_two_class_task(tmp_path, monkeypatch, positive, labels, message):
    frames = {split: df.assign(verdict=[labels[i % len(labels)] for i in range(len(df))])
              for split, df in _own_good().items()}
    with pytest.raises(ParamsError, match=f"^{re.escape(message)}$"):
        _own(tmp_path, monkeypatch, frames, positive_label=positive)
    _assert_nothing_written(tmp_path / "data" / "raw")


def _spreadsheet(sep: str = ",", decimal: str = ".") -> str:
    """The good train file as text, as a spreadsheet writes it (separator, decimal mark, CRLF line ends)."""
    return _own_good()["train"].assign(score=1.5).to_csv(index=False, sep=sep, decimal=decimal, lineterminator="\r\n")


SPREADSHEET_EXPORTS = {
    "bom-and-crlf.csv": lambda: ("\ufeff" + _spreadsheet()).encode(),
    "semicolons-and-decimal-commas.csv": lambda: _spreadsheet(";", ",").encode(),  # Excel where 1,5 is a number
    "unicode-text.tsv": lambda: _spreadsheet("\t").encode("utf-16"),  # Excel's "Unicode Text": UTF-16 with a BOM
    "blank-rows-at-the-end.csv": lambda: (_spreadsheet() + ",,,\r\n,,,\r\n").encode(),
    "blank-columns-beside-the-data.csv": lambda: "\r\n".join(line + ",," for line in _spreadsheet().split("\r\n")
                                                               if line).encode(),
}


@pytest.mark.parametrize("name", SPREADSHEET_EXPORTS)
def test_spreadsheet_exports_load(tmp_path, monkeypatch, caplog, name):
    from datasets import load_from_disk

    record = _own(tmp_path, monkeypatch, {"train": (name, SPREADSHEET_EXPORTS[name]())})
    raw = load_from_disk(str(tmp_path / "data" / "raw"))
    assert record["task"]["label_names"] == ("no", "yes")
    assert len(raw["train"]) + len(raw["validation"]) == 30
    assert set(raw["train"]["question"]) <= set(_own_good()["train"]["question"])  # the header's first column too
    if name.startswith("blank-rows"):
        assert "data/own/blank-rows-at-the-end.csv: split 'train': 2 empty row(s) at the end" in caplog.text


def test_semicolon_separated_scores_are_numbers(tmp_path, monkeypatch):
    frame = _regression()["train"]
    content = frame.to_csv(index=False, sep=";", decimal=",")
    record = _own(tmp_path, monkeypatch, {"train": ("scores.csv", content)})
    assert record["task"]["label_names"] is None and record["splits"]["train"]["label_mean"] > 0


def test_a_test_file_with_the_label_header_spelled_otherwise_is_refused_not_unlabeled(tmp_path, monkeypatch):
    frames = {**_own_good(), "test": _own_good()["validation"].rename(columns={"verdict": "Verdict"})}
    with pytest.raises(DataError, match=r"^data/own/test.csv: split 'test' lacks column\(s\) \['verdict'\]; "
                                        ".*'Verdict' differs from 'verdict' only in case"):
        _own(tmp_path, monkeypatch, frames)


def test_minus_one_as_a_class_of_own_labels_is_a_label_not_the_unlabeled_marker(tmp_path, monkeypatch):
    from datasets import load_from_disk

    signs = {split: df.assign(verdict=df["verdict"].map({"no": -1, "yes": 1})) for split, df in _own_good().items()}
    test = signs["validation"].assign(verdict=-1)  # a test file of one class: -1 throughout
    record = _own(tmp_path, monkeypatch, {**signs, "test": test})
    assert record["task"]["label_names"] == ("-1", "1")
    assert load_from_disk(str(tmp_path / "data" / "raw"))["test"]["label"] == [0] * len(test)


def test_semicolon_separated_scores_with_decimal_points_are_numbers(tmp_path, monkeypatch):
    content = _regression()["train"].to_csv(index=False, sep=";")  # pandas' own: 3.5, not 3,5
    record = _own(tmp_path, monkeypatch, {"train": ("scores.csv", content)})
    assert record["task"]["label_names"] is None and record["splits"]["train"]["label_mean"] > 0


def test_a_stray_quote_in_a_tsv_is_named_not_merged(tmp_path, monkeypatch):
    rows = "".join(f"q{i}\ta{i}\t{'yes' if i % 2 else 'no'}\n" for i in range(10))
    content = "question\tanswer\tverdict\n" + rows.replace("q3\t", '"q3 is\t', 1).replace("q6\t", '"q6" is\t', 1)
    with pytest.raises(DataError, match="^data/own/train.tsv: split 'train' row 3: question holds a line break and a "
                                        r"tab, so a quote \(\"\) opened it"):
        _own(tmp_path, monkeypatch, {"train": ("train.tsv", content)})


def test_a_file_name_too_long_for_the_file_system_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "own").mkdir(parents=True)
    data = {"dataset": None, "config": None, "local_copy": None, "files": {"train": "data/own/" + "x" * 300 + ".csv"},
            "text_columns": ["question", "answer"], "label_column": "verdict"}
    with pytest.raises(DataError, match=r"x\.csv: split 'train': File name too long \(params.yaml data.files.train\)$"):
        download_dataset(tiny_params(data=data).data, tmp_path / "data" / "raw")


@pytest.mark.parametrize("frame,message", [
    (lambda: _own_good()["train"].rename(columns={"verdict": "Verdict "}),
     "data/own/train.csv: split 'train' lacks column(s) ['verdict']; has ['question', 'answer', 'Verdict ']; "
     "'Verdict ' differs from 'verdict' only in case or spaces around it: rename the column, or name it so in "
     "params.yaml"),
    (lambda: _own_good()["train"].assign(no=lambda d: (d["verdict"] == "no").astype(int),
                                         yes=lambda d: (d["verdict"] == "yes").astype(int)).drop(columns="verdict"),
     "data/own/train.csv: split 'train' lacks column(s) ['verdict']; has ['question', 'answer', 'no', 'yes']; the "
     "classes one-hot in columns ['no', 'yes']? give each row's class name in one column 'verdict', e.g. "
     "df['verdict'] = df[['no', 'yes']].idxmax(axis=1)"),
    (lambda: ("train.jsonl", "".join(f'{{"question": "q{i}", "answer": "a", "tags": ["x"], "meta": {{"n": {i}}}, '
                                     f'"Verdict": "yes"}}\n' for i in range(3))),
     "data/own/train.jsonl: split 'train' lacks column(s) ['verdict']; has ['question', 'answer', 'tags', 'meta', "
     "'Verdict']; 'Verdict' differs from 'verdict' only in case or spaces around it: rename the column, or name it "
     "so in params.yaml"),
    (lambda: ("train.jsonl", "".join(f'{{"question": "q{i}", "answer": "a", "tags": ["x"], "meta": {{"n": {i}}}}}\n'
                                     for i in range(3))),
     "data/own/train.jsonl: split 'train' lacks column(s) ['verdict']; has ['question', 'answer', 'tags', 'meta']"),
], ids=["a-header-in-other-case-with-a-space", "one-hot-labels", "nested-columns-beside-a-header-in-other-case",
        "nested-columns-and-no-label"])
def test_a_missing_column_says_what_the_file_may_mean(tmp_path, monkeypatch, frame, message):
    with pytest.raises(DataError, match=f"^{re.escape(message)}$"):
        _own(tmp_path, monkeypatch, {"train": frame()})
    _assert_nothing_written(tmp_path / "data" / "raw")


# Checkpoints. tiny_checkpoint: a 2-layer BertModel (no head) saved with the real tokenizer.

@pytest.fixture
def checkpoint_copy(tiny_checkpoint, tmp_path) -> Path:
    return Path(shutil.copytree(tiny_checkpoint, tmp_path / "checkpoint"))


def _load_classifier(folder: Path, tmp_path: Path) -> None:
    load_classifier(folder, MRPC)


def _load_mean_classifier(folder: Path, tmp_path: Path) -> None:
    load_classifier(folder, MRPC, pooling="mean")


def _download_checkpoint(folder: Path, tmp_path: Path) -> None:
    download_checkpoint(str(folder), tmp_path / "pretrained")


BAD_CHECKPOINTS = [
    ("no-weights", ["model.safetensors"],
     ("no model weights (one of model.safetensors, model.safetensors.index.json, pytorch_model.bin, "
      "pytorch_model.bin.index.json)")),
    ("no-tokenizer", ["tokenizer.json", "vocab.txt", "tokenizer.model", "vocab.json"],
     ("no tokenizer files (one of tokenizer.json, vocab.txt, tokenizer.model, vocab.json); save the tokenizer with the "
      "model (tokenizer.save_pretrained)")),
    ("no-config", ["config.json"], "no config.json; not a transformers checkpoint folder"),
]


@pytest.mark.parametrize("load", [_load_classifier, _download_checkpoint],
                         ids=["load_classifier", "download_checkpoint"])
@pytest.mark.parametrize("remove,message", [case[1:] for case in BAD_CHECKPOINTS],
                         ids=[case[0] for case in BAD_CHECKPOINTS])
def test_bad_checkpoint_folder_is_named(checkpoint_copy, tmp_path, load, remove, message):
    for name in remove:
        (checkpoint_copy / name).unlink(missing_ok=True)
    with pytest.raises(CheckpointError) as err:
        load(checkpoint_copy, tmp_path)
    assert str(err.value) in (f"{checkpoint_copy}: {message}", f"{checkpoint_copy.resolve()}: {message}")
    _assert_nothing_written(tmp_path / "pretrained")


@pytest.mark.parametrize("load", [_load_classifier, _load_mean_classifier, _download_checkpoint],
                         ids=["load_classifier", "load_classifier-mean", "download_checkpoint"])
def test_a_checkpoint_lacking_an_encoder_weight_is_refused(checkpoint_copy, tmp_path, load):
    # transformers would start the missing weight from random values and only warn
    from safetensors.torch import load_file, save_file

    weights = load_file(checkpoint_copy / "model.safetensors")
    del weights["encoder.layer.1.output.dense.weight"]
    save_file(weights, checkpoint_copy / "model.safetensors", metadata={"format": "pt"})
    message = r"1 weight\(s\) of the 'bert' encoder are not in the checkpoint or have another shape, e.g. \['"
    with pytest.raises(CheckpointError, match=message + r"(bert\.)?encoder.layer.1.output.dense.weight'\]"):
        load(checkpoint_copy, tmp_path)
    _assert_nothing_written(tmp_path / "pretrained")


def _truncate(file: Path) -> None:
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


@pytest.mark.parametrize("load", [_load_classifier, _download_checkpoint],
                         ids=["load_classifier", "download_checkpoint"])
@pytest.mark.parametrize("damage,file,message", [
    (_truncate, "model.safetensors", "cannot be read (Error while deserializing header: incomplete metadata, file not "
                                     "fully covered); the checkpoint is damaged: save or copy it again"),
    (lambda f: f.write_text('{"model_type": "bert",'), "config.json", "cannot be read ("),
], ids=["truncated-weights", "invalid-config"])
def test_a_damaged_checkpoint_file_is_named_in_one_line(checkpoint_copy, tmp_path, load, damage, file, message):
    damage(checkpoint_copy / file)
    with pytest.raises(CheckpointError) as err:
        load(checkpoint_copy, tmp_path)
    assert str(err.value).startswith(f"{checkpoint_copy / file}: {message}") and "\n" not in str(err.value)
    assert str(err.value).endswith("the checkpoint is damaged: save or copy it again")
    _assert_nothing_written(tmp_path / "pretrained")


def test_missing_checkpoint_folder_names_the_key(tmp_path):
    with pytest.raises(SourceError, match=r"\(params.yaml model.checkpoint\) is neither a local folder"):
        download_checkpoint(str(tmp_path / "nowhere"), tmp_path / "pretrained")
    _assert_nothing_written(tmp_path / "pretrained")


@pytest.fixture
def three_label_checkpoint(tiny_checkpoint, tokenizer, tmp_path) -> Path:
    """A classifier checkpoint with a 3-label head (like an MNLI model) and the tokenizer."""
    folder = tmp_path / "mnli-like"
    config = BertConfig.from_pretrained(tiny_checkpoint, num_labels=3)
    BertForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_a_head_of_another_size_is_replaced(three_label_checkpoint):
    model = load_classifier(three_label_checkpoint, MRPC)
    assert model.config.num_labels == 2 and model.config.id2label == {0: "not_equivalent", 1: "equivalent"}
    assert model.classifier.out_features == 2
