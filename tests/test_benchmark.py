"""The benchmark's project way runs the stages themselves (tokenize, train, evaluate) with validated overrides, and
a workspace left on another task is refused in one line; the load test's report takes each level's median over the
rounds, and compares served with evaluated labels row by row within what the precisions allow."""

from __future__ import annotations

import json
import sys

import pytest

from benchmarks.workspace import check_workspace
from finetune.tasks import glue_task
from tests.helpers import REPO, make_project, reset_accelerate, squeeze, tiny_params, write_params

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
    from benchmarks.benchmark import main

    monkeypatch.setattr(sys, "argv", ["benchmarks.benchmark", "--mode", "short"])
    with pytest.raises(SystemExit) as exit_:  # one line, before any way runs
        main()
    assert exit_.value.code == f"ERROR: python -m benchmarks.benchmark: {check_workspace()}"


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


def test_the_load_report_takes_each_levels_median_over_the_rounds_and_states_the_goals():
    from benchmarks.load_agreement import Agreement
    from benchmarks.load_report import goals, headline, medians

    def run(server, *levels):
        return {"server": server, "levels": [{"clients": c, "requests_per_s": rate, "p50_ms": p99 / 2, "p99_ms": p99,
                                              "errors": 0, "requests": 100, "accuracy": 0.8, "f1": 0.9,
                                              "cpu": {"HTTP": rate / 100}}
                                             for c, rate, p99 in levels]}

    runs = [run("engine", (1, 95.0, 11.5), (32, 300.0, 130)), run("bare", (1, 100.0, 12.0), (32, 320.0, 120)),
            run("engine", (1, 90.0, 12.5), (32, 330.0, 140)), run("bare", (1, 99.0, 10.0), (32, 290.0, 125)),
            run("engine", (1, 99.0, 11.0), (32, 310.0, 135)), run("bare", (1, 98.0, 13.0), (32, 300.0, 110)),
            run("baseline", (1, 50.0, 20.0), (32, 62.0, 900))]
    by = {server: medians(runs, server) for server in ("baseline", "bare", "engine")}
    assert by["engine"][32]["requests_per_s"] == 310.0 and by["engine"][32]["each"] == [300.0, 330.0, 310.0]
    assert by["engine"][32]["cpu"] == {"HTTP": 3.1} and by["engine"][32]["requests"] == 300
    assert headline(by) == ["32 clients: 5.00x the baseline", "32 clients: 1.03x the bare engine",
                            "1 client p99: tools.serve 11.5 ms, the bare engine 12.0 ms"]
    assert goals(by, Agreement(408, 406, [3, 7], 0.01, allowed=2), {"errors": 0, "requests": 20000}) == [
        "32 clients: at least 5x the baseline's requests/s: met",
        "32 clients: at least 1x the bare engine's requests/s: met",
        "1 client: a p99 at most the bare engine's: met",
        "served as evaluated (at most 2 rows differ): met",
        "soak: no error in 20000 requests: met"]
    assert goals(by, Agreement(408, 407, [3], 1e-5, allowed=0), None)[-1] == (
        "served as evaluated (every label the same): missed")


def test_served_and_evaluated_labels_are_compared_row_by_row_within_what_the_precisions_allow(monkeypatch):
    import pandas as pd

    from benchmarks.load_agreement import agreement, allowed_differences, served_precision

    evaluated = pd.DataFrame({"idx": [10, 11, 12], "prediction": ["yes", "no", "yes"],
                              "probability_no": [0.2, 0.7, 0.4], "probability_yes": [0.8, 0.3, 0.6]})
    same = [{"label": "yes", "probabilities": {"no": 0.2, "yes": 0.8}},
            {"label": "no", "probabilities": {"no": 0.70001, "yes": 0.29999}},
            {"label": "yes", "probabilities": {"no": 0.4, "yes": 0.6}}]
    result = agreement(same, evaluated)
    assert (result.same, result.rows, result.differing, result.met) == (3, 3, [], True)
    assert result.line() == "agreement with the evaluate stage's predictions: 3 / 3 rows"
    assert result.max_probability_diff == pytest.approx(1e-5)
    moved = [same[0], {"label": "yes", "probabilities": {"no": 0.49, "yes": 0.51}}, None]  # one moved, one unanswered
    assert (agreement(moved, evaluated).differing, agreement(moved, evaluated).met) == ([11, 12], False)
    assert agreement(moved, evaluated, allowed=2).met is True
    with pytest.raises(ValueError, match="2 answers for 3 evaluated rows"):
        agreement(same[:2], evaluated)

    assert [served_precision(f, "cpu") for f in ("pytorch", "onnx-fp32", "onnx-int8", "openvino-bf16")] == [
        "fp32", "fp32", "int8", "bf16"]
    for bf16, precision in ((True, "bf16"), (False, "fp16")):  # a GPU with bf16, and one without (T4, V100)
        monkeypatch.setattr("torch.cuda.is_bf16_supported", lambda bf16=bf16: bf16)
        assert served_precision("pytorch", "cuda") == precision
    export = {"openvino-int8": {"validation": {"agreement": 0.9779}}}
    assert allowed_differences("onnx-fp32", "fp32", "fp32", export, 408, 0)[0] == 0
    allowed, why = allowed_differences("openvino-int8", "bf16", "int8", export, 408, 2)
    assert allowed == 11 and why.startswith("evaluated in bf16 (metrics/train.json), served in int8 (openvino-int8): "
                                            "at most 11 rows may differ: 9 rows where openvino-int8 differs")
    assert allowed_differences("pytorch", "bf16", "fp32", export, 408, 2)[0] == 2
    assert allowed_differences("onnx-int8", "fp32", "int8", export, 408, 0)[0] is None  # export.json gives nothing
