"""tools.predict on bad arguments and files: one line naming the argument, file, row or column, and the limit where
there is one; checked before the model is loaded, with nothing half-written left. What it writes follows --out's
suffix, and it accepts the texts training accepts. Also: the tokenize stage refuses a max_length beyond the model's
positions, and Ctrl-C in a stage is one line."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pandas as pd
import pytest

from finetune.data.loading import FILE_FORMATS, WRITE_FORMATS, load_files
from finetune.data.tokenized import tokenize_splits
from finetune.errors import ParamsError
from finetune.params import Params
from finetune.runtime import run_stage
from tests.helpers import tiny_params
from tools.predict import main, predict

PAIRS = pd.DataFrame({"sentence1": ["The cat sat on the mat.", "Shares fell sharply.", "He won."],
                      "sentence2": ["A cat was sitting on the mat.", "The court rejected the appeal.", "He lost."]})


@pytest.fixture(scope="module")
def model(tiny_finetuned) -> Path:
    return tiny_finetuned


@pytest.fixture
def pairs(tmp_path) -> Path:
    file = tmp_path / "new.csv"
    PAIRS.to_csv(file, index=False)
    return file


def error_of(argv: list[str], capsys) -> str:
    """The one line tools.predict exits with: an ERROR line (exit message) or argparse's error line."""
    with pytest.raises(SystemExit) as exit_:
        main([str(a) for a in argv])
    if isinstance(exit_.value.code, str):
        message = exit_.value.code
    else:
        assert exit_.value.code != 0
        message = capsys.readouterr().err.strip().splitlines()[-1]
    assert "\n" not in message and "Traceback" not in message
    return message


@pytest.mark.parametrize("value,message", [("0", "must be at least 1, got 0"), ("-3", "must be at least 1, got -3"),
                                           ("many", "'many' is not an integer")])
@pytest.mark.parametrize("argument", ["--batch-size", "--max-length"])
def test_counts_below_one_are_refused_before_anything_loads(pairs, tmp_path, capsys, argument, value, message):
    error = error_of([pairs, "--model", tmp_path / "no-model", argument, value], capsys)
    assert error.endswith(f"argument {argument}: {message}")


def test_a_max_length_beyond_the_models_positions_names_the_limit(model, pairs, tmp_path, capsys):
    out = tmp_path / "out.csv"
    error = error_of([pairs, "--model", model, "--max-length", "100000", "--out", out], capsys)
    assert error == ("ERROR: --max-length: 100000 is more than the model's 512 positions (max_position_embeddings in "
                     "its config.json); use at most that, or none for the model's own length")
    assert not out.exists()


def test_the_tokenize_stage_refuses_a_max_length_beyond_the_models_positions(tiny_project):
    paths = tiny_project()
    before = sorted(p.name for p in paths.tokenized.iterdir())
    params = Params(**{**tiny_params().model_dump(), "tokenize": {"max_length": 100000, "num_proc": None}})
    with pytest.raises(ParamsError, match=r"^params.yaml: tokenize.max_length: 100000 is more than the model's 512 "
                                          r"positions"):
        tokenize_splits(params, paths)
    assert sorted(p.name for p in paths.tokenized.iterdir()) == before  # the previous output as it was


@pytest.mark.parametrize("out,message", [
    ("folder", r"--out {tmp}/folder: is a folder; name a file in it"),
    ("a-file/out.csv", r"--out {tmp}/a-file/out.csv: cannot write there: (FileExistsError|NotADirectoryError): "),
    ("/proc/out.csv", r"--out /proc/out.csv: cannot write there: "),
    ("out.xlsx", r"--out {tmp}/out.xlsx: unknown format '.xlsx'; use one of .csv, .tsv, .json, .jsonl, .parquet"),
])
def test_a_bad_out_is_named_before_the_model_loads(pairs, tmp_path, capsys, out, message):
    import re

    (tmp_path / "folder").mkdir()
    (tmp_path / "a-file").write_text("a file, not a folder")
    target = out if out.startswith("/") else tmp_path / out
    error = error_of([pairs, "--model", tmp_path / "no-model", "--out", target], capsys)  # no model: out comes first
    assert re.match("ERROR: " + message.format(tmp=re.escape(str(tmp_path))), error), error
    assert not list((tmp_path / "folder").iterdir()) and not list(tmp_path.glob(".*.tmp"))


def test_out_may_not_be_the_input_unless_told(model, tmp_path, capsys):
    file = tmp_path / "new.parquet"
    PAIRS.to_parquet(file, index=False)
    error = error_of([file, "--model", model, "--out", file], capsys)
    assert error == f"ERROR: --out {file} is the input file; choose another --out, or pass --overwrite-input"
    assert pd.read_parquet(file).equals(PAIRS)
    main([str(file), "--model", str(model), "--out", str(file), "--overwrite-input"])
    scored = pd.read_parquet(file)  # still Parquet: the format of the suffix
    assert list(scored.columns[:2]) == ["sentence1", "sentence2"] and "prediction" in scored


def test_out_is_written_in_the_format_of_its_suffix(model, pairs, tmp_path):
    assert set(WRITE_FORMATS) == set(FILE_FORMATS)  # writes what it reads
    tables = {}
    for suffix in WRITE_FORMATS:
        main([str(pairs), "--model", str(model), "--out", str(tmp_path / f"scored{suffix}")])
        tables[suffix] = load_files({"out": tmp_path / f"scored{suffix}"})["out"].to_pandas()
    first = tables[".csv"]
    for suffix, table in tables.items():
        assert list(table.columns) == list(first.columns), suffix
        assert table["prediction"].tolist() == first["prediction"].tolist(), suffix
        pd.testing.assert_series_equal(table["probability_equivalent"], first["probability_equivalent"],
                                       check_exact=False, atol=1e-6, check_names=False,
                                       check_dtype=False)
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_folder_without_task_json_is_named(tiny_checkpoint, pairs, tmp_path, capsys):
    folder = Path(shutil.copytree(tiny_checkpoint, tmp_path / "pretrained"))  # a checkpoint, not fine-tuned
    error = error_of([pairs, "--model", folder, "--out", tmp_path / "out.csv"], capsys)
    assert error == (f"ERROR: {folder}/task.json: not found; {folder} is not a fine-tuned model folder "
                     "(models/finetuned, or a form in models/exported) or prepared data (data/raw)")


def test_a_missing_input_file_is_named_as_the_argument(model, tmp_path, capsys):
    error = error_of([tmp_path / "nowhere.csv", "--model", model, "--out", tmp_path / "out.csv"], capsys)
    assert error == f"ERROR: {tmp_path}/nowhere.csv: split 'input': file not found (the input file argument)"


def test_numbers_as_texts_are_scored_as_training_reads_them(model, tmp_path):
    numbers = pd.DataFrame({"sentence1": [1, 22, 333], "sentence2": [4, 55, 666]})
    as_text = numbers.astype(str)
    numbers.to_csv(tmp_path / "numbers.csv", index=False)
    (tmp_path / "mixed.jsonl").write_text(json.dumps({"sentence1": 1, "sentence2": "4"}) + "\n"
                                          + json.dumps({"sentence1": "22", "sentence2": 55}) + "\n"
                                          + json.dumps({"sentence1": "333", "sentence2": "666"}) + "\n")
    as_text.to_csv(tmp_path / "text.csv", index=False)
    expected = predict(tmp_path / "text.csv", model)["probability_equivalent"]
    for name in ("numbers.csv", "mixed.jsonl"):
        scored = predict(tmp_path / name, model)["probability_equivalent"]
        pd.testing.assert_series_equal(scored, expected, check_exact=False, atol=1e-6)


def test_an_empty_text_is_named_with_its_row(model, tmp_path, capsys):
    file = tmp_path / "new.csv"
    PAIRS.assign(sentence2=["fine", "  ", "fine"]).to_csv(file, index=False)
    error = error_of([file, "--model", model, "--out", tmp_path / "out.csv"], capsys)
    assert error == f"ERROR: {file}: split 'input' row 1: empty sentence2 (null, empty or only whitespace)"


def test_ctrl_c_is_one_line_and_leaves_nothing(model, pairs, tmp_path, capsys, monkeypatch):
    import tools.predict

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(tools.predict, "predict", interrupted)
    with pytest.raises(SystemExit) as exit_:
        main([str(pairs), "--model", str(model), "--out", str(tmp_path / "out.csv")])
    assert exit_.value.code == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "interrupted (Ctrl-C): outputs are written whole or not at all, so nothing half-written is left")
    assert not (tmp_path / "out.csv").exists() and not list(tmp_path.glob(".*.tmp"))


def test_ctrl_c_in_a_stage_is_one_line(capsys):
    def stage():
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as exit_:
        run_stage(stage)
    assert exit_.value.code == 130
    assert "Traceback" not in capsys.readouterr().err


def test_a_folder_of_prepared_data_is_not_a_model(model, pairs, tmp_path, capsys):
    data = tmp_path / "raw"
    data.mkdir()
    (data / "task.json").write_text((model / "task.json").read_text())  # like data/raw: a task.json, no model
    error = error_of([pairs, "--model", data, "--out", tmp_path / "out.csv"], capsys)
    assert error == (f"ERROR: {data}: no config.json; not a transformers checkpoint folder; --model needs a fine-tuned "
                     "model folder (models/finetuned) or --form a form of models/exported")
    (data / "config.json").write_text((model / "config.json").read_text())  # a config, no weights: said before reading
    assert error_of([pairs, "--model", data, "--out", tmp_path / "out.csv"], capsys).startswith(
        f"ERROR: {data}: no model weights (one of model.safetensors")


@pytest.mark.parametrize("content,message", [(None, "is a folder; name a file"), ("", "the file is empty"),
                                             ("sentence1,sentence2\n", "has no rows")])
def test_an_input_without_rows_is_named(model, tmp_path, capsys, content, message):
    file = tmp_path / "new.csv"
    file.mkdir() if content is None else file.write_text(content)
    error = error_of([file, "--model", model, "--out", tmp_path / "out.csv"], capsys)
    assert error == f"ERROR: {file}: split 'input': {message}"


def test_summarize_names_an_unknown_revision(tmp_path, monkeypatch):
    import subprocess

    from tools.summarize import load_experiments

    monkeypatch.chdir(tmp_path)
    for cmd in (["git", "init", "-q"], ["git", "commit", "-q", "--allow-empty", "-m", "first"]):
        subprocess.run(cmd, check=True, env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                                             "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], check=True)
    with pytest.raises(SystemExit, match=r"^ERROR: --rev: unknown Git revision 'nosuch'"):
        load_experiments(["*"], revs=["nosuch"])


def test_report_out_must_be_a_folder(tmp_path, capsys):
    from tools.report import main as report_main

    file = tmp_path / "README.md"
    file.write_text("a file")
    with pytest.raises(SystemExit) as exit_:
        report_main(["--out", str(file)])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(f"--out {file}: is a file; name a folder")


def test_a_file_that_already_has_the_output_columns_is_refused(model, tmp_path, capsys):
    scored = tmp_path / "scored.csv"
    pd.DataFrame({"sentence1": ["A cat."], "sentence2": ["A dog."], "prediction": ["mine"],
                  "probability_equivalent": [0.5], "prediction_date": ["2026-11-29"],
                  "probability_rain": [0.1]}).to_csv(scored, index=False)
    error = error_of([scored, "--model", model, "--out", tmp_path / "out.csv"], capsys)
    assert error == (f"ERROR: {scored}: has column(s) ['prediction', 'probability_equivalent'], which predict "
                     "writes; rename or drop them first")  # not prediction_date, probability_rain: kept as they are
    assert not (tmp_path / "out.csv").exists()
