"""The benchmark's project way runs the stages themselves (tokenize, train, evaluate) with validated overrides, and
a workspace left on another task is refused in one line."""

from __future__ import annotations

import json

import pytest

from benchmarks.workspace import check_workspace
from finetune.tasks import glue_task
from tests.helpers import REPO, make_project, python, reset_accelerate, run, squeeze, tiny_params, write_params

e2e = pytest.mark.e2e  # the stages in subprocesses, as the benchmark runs them


@pytest.fixture(scope="module")
def project(tiny_raw, tiny_checkpoint, tmp_path_factory):
    """A project with data/raw and models/pretrained, what the benchmark reads (`dvc repro download`)."""
    return make_project(tmp_path_factory.mktemp("benchmark") / "p", tiny_params(), tiny_raw, tiny_checkpoint).root


def test_the_project_way_trains_and_evaluates_through_the_stages(project, monkeypatch):
    # In this process (the way's own process, as the benchmark starts it: the checkpoints below).
    from benchmarks.pipeline import project as project_way

    monkeypatch.chdir(project)
    result = project_way(3, {"train": {"batch_size": 4}})
    reset_accelerate()
    assert result["steps"] == 3 and result["samples"] == 12  # 3 optimizer steps of the overridden batch of 4
    assert 0 <= result["accuracy"] <= 1 and 0 <= result["f1"] <= 1
    assert result["settings"]["batch_size"] == 4


def test_a_misspelt_override_is_named(project, monkeypatch):
    from benchmarks.pipeline import project as project_way
    from finetune.errors import ParamsError

    monkeypatch.chdir(project)  # checked before anything runs
    with pytest.raises(ParamsError, match="benchmark overrides: train.batch_sise: Extra inputs are not permitted"):
        project_way(None, {"train": {"batch_sise": 4}})


@e2e
def test_checkpoints_side_by_side_with_the_flop_ratio_of_their_shapes(project, tiny_checkpoint, tokenizer, tmp_path,
                                                                     monkeypatch):
    # `--checkpoints` in this process, given a ceiling instead of measuring one (seconds of 2048² matmuls); each
    # checkpoint is the project way in its own process (`--way project --checkpoint`), as the command starts it.
    from benchmarks.checkpoints import compare_checkpoints
    from tests.helpers import make_checkpoint

    wider = make_checkpoint(tmp_path / "wider", tokenizer, hidden_size=64, intermediate_size=128)
    monkeypatch.chdir(project)
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the ways' processes import benchmarks/ from this checkout
    compare_checkpoints([str(tiny_checkpoint), str(wider)], 2, {"fp32_gflops": 100.0, "bf16_gflops": None}, tmp_path)
    records = json.loads((tmp_path / "checkpoints.json").read_text())["checkpoints"]
    assert [r["hidden"] for r in records] == [32, 64] and all(r["steps"] == 2 for r in records)
    assert records[0]["expected_flops_ratio"] == 1.0 and records[1]["expected_flops_ratio"] > 2
    # samples/s from the unrounded time: 2 steps of a tiny model may round train_seconds to 0.0
    assert all(r["samples_per_s"] > 0 and r["peak_rss_mb"] > 0 and r["settings"]["batch_size"] == 8 for r in records)
    assert all(r["samples"] == 2 * 8 for r in records)
    assert "| checkpoint | type | layers × hidden |" in squeeze((tmp_path / "CHECKPOINTS.md").read_text())


# A workspace whose last experiment left another dataset (own files by -S, or another GLUE task in data/raw).

def test_a_workspace_on_own_files_is_refused_naming_what_to_restore(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_params(tmp_path, tiny_params(data={"dataset": None, "config": None, "local_copy": None,
                                             "files": {"train": "data/own/sick.csv"},
                                             "text_columns": ["sentence_A", "sentence_B"], "label_column": "label"}))
    assert check_workspace() == (
        "the benchmark runs on GLUE MRPC, but params.yaml's data is data.files {'train': 'data/own/sick.csv'}: restore "
        "params.yaml's data section (`git checkout params.yaml`, or `dvc exp apply` of an MRPC experiment), then "
        "`dvc repro download`")
    out = run(python("-m", "benchmarks.benchmark", "--mode", "short"), tmp_path, ok=False)
    assert out.strip().splitlines() == [f"ERROR: python -m benchmarks.benchmark: {check_workspace()}"]  # no traceback


def test_data_raw_of_another_task_is_refused_and_mrpc_passes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_params(tmp_path, tiny_params())
    assert check_workspace() == "data/raw/task.json not found: run `dvc repro download` first"
    (tmp_path / "data/raw").mkdir(parents=True)
    glue_task("rte").save(tmp_path / "data/raw")
    assert check_workspace() == ("the benchmark runs on GLUE MRPC, but data/raw holds task 'rte': run "
                                 "`dvc repro download`")
    glue_task("mrpc").save(tmp_path / "data/raw")
    assert check_workspace() is None


def test_serve_base_of_another_task_is_refused_before_any_timing(tmp_path):
    from benchmarks.serve import fine_tuned

    folder = tmp_path / "kept"
    folder.mkdir()
    assert fine_tuned(str(folder)) is False  # no task.json: a pretrained checkpoint, scored by agreement only
    glue_task("mrpc").save(folder)
    assert fine_tuned(str(folder)) is True
    glue_task("rte").save(folder)
    with pytest.raises(SystemExit, match=f"--base {folder} is fine-tuned on 'rte'"):
        fine_tuned(str(folder))


def test_the_load_goals_compare_the_engine_with_the_baseline_and_the_bare_engine():
    from benchmarks.load import goals_of

    def row(server, clients, rate, p99):
        return {"server": server, "clients": clients, "requests_per_s": rate, "p99_ms": p99}

    rows = [row("baseline", 32, 60.0, 900), row("bare", 1, 100.0, 10.0), row("bare", 32, 320.0, 120),
            row("engine", 1, 95.0, 11.5), row("engine", 32, 300.0, 130)]
    goals = goals_of(rows, {"errors": 0, "requests": 20000})
    assert goals == {
        "baseline 32": "32 clients: 5.00x the baseline's requests/s (goal 5x): met",
        "bare 32": "32 clients: 0.94x the bare engine's requests/s (goal 0.9x): met",
        "p99 1": "1 client: p99 11.5 ms, 1.15x the bare engine's 10.0 ms (goal at most 1.2x): met",
        "soak": "soak: 0 errors in 20000 requests (goal 0): met"}
    rows[-1]["requests_per_s"] = 250.0
    assert goals_of(rows, None)["bare 32"].endswith("0.78x the bare engine's requests/s (goal 0.9x): missed")
