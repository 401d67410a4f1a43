"""The search (tools.tune): bad search spaces stop before any trial, the loop's hook reports to a trial and its
pruner stops the run, and, end to end in a temp git repo with tiny params, a study whose trials are DVC experiments:
its report and recipe, two workers on one storage, a kill and a resume, and two machines sharing a study through a
throwaway PostgreSQL server (and a database that is down: one line, nothing lost).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlsplit

import optuna
import pytest
import yaml
from datasets import Dataset

from finetune.errors import ParamsError
from finetune.params import validate_params
from finetune.train import recipe as training
from finetune.train.recipe import train
from finetune.train.trial import open_storage, trial_env
from tests.helpers import (
    FEATURES,
    REPO,
    dvc,
    exp_show,
    free_port,
    make_project,
    make_split,
    project_env,
    python,
    run,
    run_stages_at_once,
    squeeze,
    tiny_params,
    write_hub_folder,
)
from tools import tune_report
from tools.recipe import load_recipe
from tools.search_space import load_space
from tools.tune import FINISHED, settle_study
from tools.tune import main as tune_main
from tools.tune_storage import connect, database_url

PARAMS = tiny_params().model_dump()
COMMITTED = yaml.safe_load((REPO / "params.yaml").read_text())


def space_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("text, says", [
    ("space:\n  train.learning_rate: {low: 1.0e-5, high: 1.0e-4}\n", "train.learning_rate: not a key of params.yaml"),
    ("space:\n  trainer.lr: {low: 1.0e-5, high: 1.0e-4}\n", "trainer.lr: not a key of params.yaml"),
    ("space:\n  train.lr: {low: 1.0e-4, high: 1.0e-4}\n", "train.lr: empty range"),
    ("space:\n  train.warmup_ratio: {low: 0.0, high: 0.1, log: true}\n", "train.warmup_ratio: a log range must stay"),
    ("space:\n  train.batch_size: {low: 0.5, high: 8.0}\n", "train.batch_size: 0.5 is not a valid value"),
    ("space:\n  train.scheduler: {choices: [linear, bogus]}\n", "train.scheduler: 'bogus' is not a valid value"),
    ("space:\n  train.lr: {low: small, high: 1.0e-4}\n", "train.lr: low and high must be numbers"),
    ("space:\n  train.scheduler: {choices: []}\n", "train.scheduler: choices must be a non-empty list"),
    ("space:\n  train.lr: [1.0e-5, 1.0e-4]\n", "train.lr: expected {low: …, high: …}"),
    ("space:\n  train.lr: {low: 1.0e-5, high: 1.0e-4, scale: log}\n", "train.lr: a range has low, high"),
    ("space:\n  train.lr: {low: 1.0e-5, high: 1.0e-4, log: no}\n", "train.lr: log must be true or false (got 'no')"),
    ("space:\n  train.warmup_ratio: {low: 0.0, high: 0.1, step: 0}\n", "train.warmup_ratio: step must be a number"),
    ("space:\n  train.epochs: {low: 1, high: 3, step: 5}\n", "train.epochs: step must be a number above 0 and at most"),
    ("fixed:\n  train.epochs: 0\nspace:\n  train.lr: {low: 1.0e-5, high: 1.0e-4}\n", "train.epochs"),
    ("space: {}\n", "nothing to search"),
    ("spaces:\n  train.lr: {low: 1.0e-5, high: 1.0e-4}\n", "expected a mapping with `space:`"),
])
def test_bad_search_space_stops_with_one_line_naming_file_and_key(tmp_path, text, says):
    path = space_file(tmp_path, text)
    with pytest.raises(ParamsError) as err:
        load_space(path, COMMITTED)
    message = str(err.value)
    assert str(path) in message and says in message and len(message.splitlines()) == 1, message


def test_search_space_samples_each_kind():
    space = load_space(REPO / "configs/search/rte.yaml", COMMITTED)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    values = space.sample(study.ask())
    assert 5e-6 <= values["train.lr"] <= 2e-4 and isinstance(values["train.epochs"], int)
    assert values["train.batch_size"] in (8, 16, 32) and values["model.pooling"] in ("cls", "mean")
    assert space.fixed == {"data.config": "rte"}


def test_every_shipped_space_is_valid():
    spaces = sorted((REPO / "configs/search").glob("*.yaml"))
    assert spaces, "no search space in configs/search"
    for path in spaces:
        load_space(path, COMMITTED)


def test_a_study_continues_only_with_its_own_seeds_space_and_metric(tmp_path, monkeypatch):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    space = load_space(REPO / "configs/search/rte.yaml", COMMITTED)
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    assert settle_study(study, [42, 1], 42, space, "accuracy", COMMITTED) == [42, 1]  # recorded by the first run
    # a resume without --seeds: the study's; a params.yaml whose sampled or per-trial keys differ (an applied trial)
    applied = {**COMMITTED, "train": {**COMMITTED["train"], "lr": 1e-5, "seed": 3}}
    assert settle_study(study, None, 42, space, "accuracy", applied) == [42, 1]
    longer = {**COMMITTED, "train": {**COMMITTED["train"], "max_grad_norm": 0.5}}
    for seeds, other, metric, params, says in [
            ([7], space, "accuracy", COMMITTED, "began with seeds [42, 1], not [7]"),
            (None, load_space(REPO / "configs/search/cola.yaml", COMMITTED), "accuracy", COMMITTED, "began with space"),
            (None, space, "f1", COMMITTED, "began with metric accuracy, not f1"),
            (None, space, "accuracy", longer, "began on other params.yaml values outside its space: "
                                              f"train.max_grad_norm {COMMITTED['train']['max_grad_norm']!r}, now 0.5; "
                                              "its trials would not compare")]:
        with pytest.raises(SystemExit, match="study s " + says.replace("[", r"\[").replace("]", r"\]")):
            settle_study(study, seeds, 42, other, metric, params)
    # through the command: refused before any trial or report
    monkeypatch.chdir(REPO)  # the command runs in the project root
    args = ["--space", "configs/search/rte.yaml", "--study", "s", "--storage", storage, "--seeds", "3"]
    with pytest.raises(SystemExit, match="began with seeds"):
        tune_main(args)
    assert not (REPO / "metrics/search/s").exists()


def test_a_metric_the_task_does_not_have_is_refused_before_any_trial(tmp_path, monkeypatch):
    # configs/search/rte.yaml fixes data.config: rte, whose metric is accuracy alone (and loss)
    import tools.tune

    monkeypatch.chdir(REPO)
    monkeypatch.setattr(tools.tune, "Objective", lambda *args: pytest.fail("a trial would run in this checkout"))
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    with pytest.raises(SystemExit, match="^tools.tune: --metric 'f1' is not a metric of task 'rte': choose one of "
                                         "loss, accuracy$"):
        tune_main(["--space", "configs/search/rte.yaml", "--study", "s", "--storage", storage, "--metric", "f1"])
    assert not (tmp_path / "study.db").exists() and not (REPO / "metrics/search/s").exists()


def test_workers_starting_together_on_a_new_database_all_connect(tmp_path, monkeypatch):
    # without the retry, most of 4 threads opening a new SQLite file at once fail with "table studies already exists"
    import tools.tune_storage

    real_sleep = time.sleep  # the retry's 1 to 2 s waits a tenth as long, ten times as many tries: the same window
    monkeypatch.setattr(tools.tune_storage, "time", SimpleNamespace(sleep=lambda s: real_sleep(s / 10)))
    errors = []
    for i in range(3):
        args = argparse.Namespace(storage=f"sqlite:///{tmp_path / f'new{i}.db'}", heartbeat=60, grace=180)
        barrier = threading.Barrier(4)

        def open_it(barrier=barrier, args=args):
            barrier.wait()
            try:
                connect(args, attempts=50)
            except Exception as err:  # noqa: BLE001 - collected and shown by the assert
                errors.append(repr(err))

        threads = [threading.Thread(target=open_it) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert errors == []


@pytest.mark.parametrize("given, opened", [
    ("postgresql://u:p@db.example:5432/optuna", "postgresql+psycopg://u:p@db.example:5432/optuna?connect_timeout=10"),
    ("postgresql://u@db/optuna?connect_timeout=3", "postgresql+psycopg://u@db/optuna?connect_timeout=3"),
    ("postgresql+psycopg2://u@db/optuna", "postgresql+psycopg2://u@db/optuna"),  # a driver named: kept
    ("sqlite:////tmp/studies.db", "sqlite:////tmp/studies.db"),
])
def test_a_plain_postgresql_url_opens_with_the_locked_driver(given, opened):
    assert database_url(given) == opened


def test_a_database_that_is_down_stops_with_one_line_and_the_local_study_stays(tmp_path, monkeypatch, caplog):
    import tools.tune_storage

    monkeypatch.setattr(tools.tune_storage, "time", SimpleNamespace(sleep=lambda s: None))  # connect's retries at once
    monkeypatch.chdir(tmp_path)  # a project: params.yaml, the space, a local study and its report
    shutil.copy(REPO / "params.yaml", tmp_path)
    shutil.copytree(REPO / "configs", tmp_path / "configs")
    (tmp_path / ".tune").mkdir()
    local = f"sqlite:///{tmp_path / '.tune/studies.db'}"
    optuna.create_study(study_name="rte", storage=local).add_trial(optuna.trial.create_trial(value=0.5))
    report = tmp_path / "metrics/search/rte/trials.md"
    report.parent.mkdir(parents=True)
    report.write_text("the local study's report")
    port = free_port()  # nothing listens there
    with pytest.raises(SystemExit) as stop:
        tune_main(["--space", "configs/search/rte.yaml",
                   "--storage", f"postgresql://optuna:s3cret@127.0.0.1:{port}/optuna"])
    message = str(stop.value)
    assert message.startswith(f"tools.tune: cannot open the storage postgresql+psycopg://optuna:***@127.0.0.1:{port}/"
                              "optuna?connect_timeout=10: connection failed") and "Connection refused" in message
    assert len(message.splitlines()) == 1 and "s3cret" not in message + caplog.text
    assert [t.value for t in optuna.load_study(study_name="rte", storage=local).trials] == [0.5]
    assert report.read_text() == "the local study's report"


@pytest.fixture
def committed_reports(tmp_path, monkeypatch) -> Path:
    """A fresh clone's project in tmp_path: params.yaml, the spaces, an empty .tune/ and the committed report of study
    rte (metrics/search/rte/); returns that report's trials.md."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(REPO / "params.yaml", tmp_path)
    shutil.copytree(REPO / "configs", tmp_path / "configs")
    shutil.copytree(REPO / "metrics/search/rte", tmp_path / "metrics/search/rte")
    return tmp_path / "metrics/search/rte/trials.md"


def test_a_report_of_nothing_leaves_the_committed_report_alone(committed_reports, tmp_path):
    before = {p.name: p.read_bytes() for p in committed_reports.parent.iterdir()}
    with pytest.raises(SystemExit) as stop:  # argparse: --trials counts trials to finish
        tune_main(["--space", "configs/search/rte.yaml", "--trials", "0"])
    assert stop.value.code == 2
    local = f"sqlite:///{(tmp_path / '.tune/studies.db').resolve()}"
    with pytest.raises(SystemExit, match=f"^tools.tune: --report: no study 'rte' in {local} \\(studies there: none\\); "
                                         "nothing written$"):
        tune_main(["--space", "configs/search/rte.yaml", "--report"])
    with pytest.raises(SystemExit, match="--report: no study 'nosuchstudy'"):
        tune_main(["--space", "configs/search/rte.yaml", "--report", "--study", "nosuchstudy"])
    optuna.create_study(study_name="rte", storage=local)  # a study without trials
    with pytest.raises(SystemExit, match="^tools.tune: study rte has no trials in .*: nothing to report; "
                                         "metrics/search/rte/ is left as it is$"):
        tune_main(["--space", "configs/search/rte.yaml", "--report"])
    assert {p.name: p.read_bytes() for p in committed_reports.parent.iterdir()} == before
    assert sorted(p.name for p in (tmp_path / "metrics/search").iterdir()) == ["rte"]
    assert optuna.get_all_study_names(local) == ["rte"]  # --report made no study


@pytest.mark.parametrize("argv,says", [
    (["--seeds", "-1"], "tools.tune: --seeds: train.seed: Input should be greater than or equal to 0 (got -1)"),
    (["--heartbeat", "0"], None), (["--random-trials", "-1"], None), (["--timeout", "-5"], None),
], ids=["seed", "heartbeat", "random-trials", "timeout"])
def test_bad_numbers_stop_before_any_trial(committed_reports, tmp_path, argv, says, capsys):
    with pytest.raises(SystemExit) as stop:
        tune_main(["--space", "configs/search/rte.yaml", *argv])
    assert stop.value.code == says if says else stop.value.code == 2 and argv[0] in capsys.readouterr().err
    assert not (tmp_path / ".tune/studies.db").exists()


def one_trial_study(storage: str | None = None) -> tuple[optuna.Study, object]:
    """A study "rte" (in memory, or in ``storage``) with one complete trial, and the rte search space."""
    study = optuna.create_study(study_name="rte", direction="maximize", storage=storage)
    study.add_trial(optuna.trial.create_trial(value=0.6, params={"train.lr": 1e-4},
                                              distributions={"train.lr": optuna.distributions.FloatDistribution(
                                                  1e-5, 1e-3, log=True)}))
    return study, load_space(REPO / "configs/search/rte.yaml", COMMITTED)


def test_three_failed_trials_in_a_row_stop_the_search_and_leave_none_running(committed_reports, tmp_path,
                                                                             monkeypatch):
    import tools.tune

    def failing(argv, **kwargs):  # git answers; every `dvc exp run` exits 1
        if argv[:2] == ["git", "rev-parse"]:
            return subprocess.CompletedProcess(argv, 0, stdout="0" * 40 + "\n", stderr="")
        return subprocess.CompletedProcess(argv, 1)

    monkeypatch.setattr(tools.tune.subprocess, "run", failing)
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    with pytest.raises(SystemExit, match=r"^tools.tune: 3 trials failed in a row; see .*\.tune/logs/rte-2\.log$"):
        tune_main(["--space", "configs/search/rte.yaml", "--trials", "10", "--storage", storage, "--seeds", "42",
                   "--pruner", "none"])
    trials = optuna.load_study(study_name="rte", storage=storage).trials
    assert [t.state.name for t in trials] == ["FAIL"] * 3  # none left RUNNING for another worker to retry
    assert all(t.user_attrs["fail_reason"].endswith(f"dvc exp run exited 1 (log .tune/logs/rte-{t.number}.log)")
               for t in trials)


def test_a_report_is_written_whole_or_not_at_all(committed_reports, monkeypatch):
    # the folder is replaced when the report is whole: a failure half-way leaves the committed one
    study, space = one_trial_study()
    before = committed_reports.read_text()

    def broken(study, out):
        raise RuntimeError("the plot failed")

    with monkeypatch.context() as patched, pytest.raises(RuntimeError):
        patched.setattr(tune_report, "write_plots", broken)
        tune_report.write_report(study, space, "accuracy", COMMITTED, committed_reports.parent)
    assert committed_reports.read_text() == before and not list(committed_reports.parent.parent.glob(".rte.*"))
    tune_report.write_report(study, space, "accuracy", COMMITTED, committed_reports.parent)
    assert "1 trials: 1 complete" in committed_reports.read_text()


def test_the_report_of_an_own_data_study_takes_the_metric_it_recorded(tmp_path, monkeypatch):
    # a collector that has not prepared the own data (no data/raw/task.json) still rewrites the report
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    study, _ = one_trial_study(storage)
    study.set_user_attr("metric", "macro_f1")
    monkeypatch.chdir(tmp_path)
    own = {**COMMITTED, "data": {**COMMITTED["data"], "dataset": None, "config": None, "local_copy": None,
                                 "files": {"train": "data/own/reviews.csv"}, "text_columns": ["text"]},
           "train": {**COMMITTED["train"], "accelerate_config": str(REPO / "configs/accelerate/default.yaml")}}
    Path("params.yaml").write_text(yaml.safe_dump(own))
    Path("space.yaml").write_text("space:\n  train.lr: {low: 1.0e-5, high: 1.0e-3, log: true}\n")
    tune_main(["--space", "space.yaml", "--study", "rte", "--storage", storage, "--report"])
    assert json.loads(Path("metrics/search/rte/trials.json").read_text())["summary"]["metric"] == "validation.macro_f1"


def test_workers_of_one_project_write_the_report_one_at_a_time(committed_reports):
    # Two workers of one project that end together: the second waits for the first's lock in .tune/, so neither
    # removes the other's temp folder.
    study, space = one_trial_study()
    before = committed_reports.read_text()
    Path(".tune").mkdir(exist_ok=True)
    with open(Path(".tune/rte.report.lock"), "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # the other worker, writing
        second = threading.Thread(target=tune_report.write_report,
                                  args=(study, space, "accuracy", COMMITTED, committed_reports.parent))
        second.start()
        second.join(timeout=2)
        assert second.is_alive() and committed_reports.read_text() == before  # waiting
    second.join(timeout=60)
    assert not second.is_alive() and "1 trials: 1 complete" in committed_reports.read_text()


def test_a_space_choosing_a_dataset_over_own_files_names_params_yaml(tmp_path):
    own = {**COMMITTED, "data": {**COMMITTED["data"], "dataset": None, "config": None, "text_columns": ["text"],
                                 "files": {"train": "data/own/train.csv"}}}
    with pytest.raises(ParamsError, match=r"^params.yaml: data.files: \{'train': 'data/own/train.csv'\} is set, but "
                                          r".*rte.yaml \(fixed\) chooses a dataset \(data.config: rte\); own files and "
                                          r"a dataset can't both be set: set data.files: null in params.yaml$"):
        load_space(REPO / "configs/search/rte.yaml", own)


def test_pruner_stops_the_run_and_train_json_says_so(tiny_project, tmp_path, monkeypatch):
    # three finished trials that scored 2.0 at every epoch: any F1 is below their median from epoch 1
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="s", storage=open_storage(storage), direction="maximize")
    for _ in range(3):
        study.add_trial(optuna.trial.create_trial(value=1.0, intermediate_values={1: 2.0, 2: 2.0, 3: 2.0}))
    trial = study.ask()
    monkeypatch.setenv(*trial_env(storage, "s", trial._trial_id, "f1", prune_after_trials=3, prune_from=1).popitem())
    paths = tiny_project(params=tiny_params(train={"epochs": 3}))
    metrics = train(tiny_params(train={"epochs": 3}), paths)
    assert metrics["pruned"] and metrics["epochs"] == 1 and metrics["steps"] == 5 and not metrics["stopped_early"]
    reported = optuna.load_study(study_name="s", storage=storage).trials[-1].intermediate_values
    assert list(reported) == [1] and 0 <= reported[1] < 1  # the main metric (f1) of epoch 1
    assert (paths.trained / "model.safetensors").exists()  # the model of the epochs it ran is kept


def test_without_a_study_the_hook_does_nothing(tiny_project, monkeypatch):
    monkeypatch.delenv("FINETUNE_TRIAL", raising=False)
    assert training.trial_from_env("f1") is None
    metrics = train(tiny_params(), tiny_project())
    assert metrics["pruned"] is False and metrics["epochs"] == 2


# --- end to end: trials as DVC experiments ----------------------------------------------------------------------

SPACE = """fixed:
  train.warmup_steps: 1
space:
  train.lr: {low: 3.0e-3, high: 1.0e-2, log: true}
  train.scheduler: {choices: [linear, constant]}
"""


def learnable(n: int, seed: int) -> Dataset:
    """``make_split`` rows whose label is in words (sentence2 ends in "yes yes yes" or "no no no"). With mean pooling
    the tiny model learns it in 4 epochs at lr 3e-3…1e-2 on each of seeds 1, 2, 3, 4, 7, where the made-up
    paraphrases, or a label in the punctuation with CLS pooling, leave it collapsed on one CPU and not another."""
    df = make_split(n, seed).to_pandas()
    df["sentence2"] = [s.rstrip(".!") + (" yes yes yes." if label else " no no no.")
                       for s, label in zip(df["sentence2"], df["label"])]
    return Dataset.from_pandas(df, features=FEATURES, preserve_index=False)


@pytest.fixture(scope="module")
def project(tmp_path_factory, tiny_checkpoint) -> Path:
    """A committed tiny project whose pipeline ran up to the teacher and collate-check stages (neither depends on
    the other) on the splits a trial evaluates, so a trial runs train and evaluate only: 160 learnable train rows, 4
    epochs of 20 steps, mean pooling, one CPU thread per run (two workers' trials run side by side). The stages run
    in one process and are committed (``run_stages_at_once``): a trial's `dvc exp run` must find them unchanged."""
    splits = {"train": learnable(160, 0), "validation": learnable(21, 1), "test": learnable(19, 2)}
    glue = write_hub_folder(tmp_path_factory.mktemp("hub") / "glue", splits)
    params = tiny_params(data={"dataset": str(glue), "local_copy": None},
                         model={"checkpoint": str(tiny_checkpoint), "pooling": "mean"},
                         train={"epochs": 4, "num_threads": 1, "accelerate_config": "configs/accelerate/default.yaml"},
                         evaluate={"splits": ["validation"]})
    root = make_project(tmp_path_factory.mktemp("tune") / "project", params, code=True).root
    (root / "configs/search").mkdir(parents=True, exist_ok=True)
    (root / "configs/search/tiny.yaml").write_text(SPACE)
    for cmd in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A"], ["git", "commit", "-qm", "project"]):
        run(cmd, root)
    run_stages_at_once(root, ["download", "tokenize", "collate-check", "teacher"])
    run(["git", "add", "-A"], root)
    run(["git", "commit", "-qm", "repro"], root)
    return root


def tune(*args: str) -> list[str]:
    return python("-m", "tools.tune", "--space", "configs/search/tiny.yaml", "--random-trials", "2",
                  "--prune-after-trials", "2", *args)


def load(root: Path, name: str = "tiny") -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{root / '.tune/studies.db'}")


@pytest.mark.e2e
@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")  # retried_trial_number
def test_machines_share_a_study_through_postgresql_and_their_experiments_through_git(project, postgres, tmp_path):
    # Two clones of the project act as two machines: one study in PostgreSQL (the plain postgresql:// URL a user
    # writes), one bare git origin and one folder DVC remote. Machine a is killed mid-trial (its process group: no
    # clean-up at all); b, started once a's heartbeat has been silent for --grace, fails that trial and retries its
    # configuration; a comes back and runs a trial of its own. A third clone pulls every experiment and writes the
    # report from the database alone. --timeout 1 (start no trial after 1 s) makes each worker start one trial, so the
    # study ends at exactly --trials 3: the killed trial, its retry and a's new one (without it, a worker whose trial
    # ends before the other's sees fewer than 3 finished and starts another: MaxTrialsCallback counts ended trials).
    origin, remote = tmp_path / "origin.git", tmp_path / "dvc-remote"
    run(["git", "clone", "-q", "--bare", str(project), str(origin)], tmp_path)
    run(dvc("remote", "add", "--local", "seed", str(remote)), project)  # the project's data, for the clones
    run(dvc("push", "-r", "seed"), project)
    run(dvc("remote", "remove", "--local", "seed"), project)

    def machine(name: str, data: bool = True) -> Path:
        path = tmp_path / name
        run(["git", "clone", "-q", str(origin), str(path)], tmp_path)
        run(dvc("remote", "add", "--local", "-d", "storage", str(remote)), path)
        if data:  # the baseline's outputs into the cache, for the trials' `dvc exp run --temp` to check out
            run(dvc("fetch"), path)
        return path

    def worker(root: Path) -> subprocess.Popen:
        with open(root / "tune.out", "a") as out:
            return subprocess.Popen(args, cwd=root, start_new_session=True, stdout=out, stderr=subprocess.STDOUT,
                                    env=project_env())

    def wait_for(what: str, ready, root: Path, timeout: float = 240):
        deadline = time.time() + timeout
        while not (found := ready()):
            if time.time() > deadline:
                pytest.fail(f"{what}: not after {timeout} s; its output:\n{(root / 'tune.out').read_text()[-3000:]}")
            time.sleep(0.5)
        return found

    a, b = machine("a"), machine("b")
    args = tune("--study", "shared", "--trials", "3", "--storage", postgres, "--heartbeat", "1", "--grace", "2",
                "--timeout", "1")
    study = partial(optuna.load_study, study_name="shared", storage=database_url(postgres))
    retry_of = optuna.storages.RetryHeartbeatStaleTrialCallback.retried_trial_number
    first_a = worker(a)
    log = wait_for("a's trial training", lambda: next(
        (f for f in (a / ".tune/logs").glob("shared-*.log") if "Running stage 'train'" in f.read_text()), None), a)
    os.killpg(first_a.pid, signal.SIGKILL)
    first_a.wait()
    [killed] = study().trials
    assert killed.state.name == "RUNNING" and log.stem == f"shared-{killed.number}"
    time.sleep(3)  # longer than --grace: a's trial is stale
    worker_b = worker(b)
    wait_for("b retrying a's trial", lambda: any(retry_of(t) == killed.number for t in study().trials), b)
    second_a = worker(a)  # back, after b took the retry
    for process, root in ((worker_b, b), (second_a, a)):
        assert process.wait(timeout=600) == 0, (root / "tune.out").read_text()[-3000:]

    trials = study().trials
    assert len(trials) == 3 and all(t.state in FINISHED for t in trials)  # the study reached --trials
    assert trials[killed.number].state.name == "FAIL"
    [retry] = [t for t in trials if retry_of(t) == killed.number]  # retried once, by b, the same configuration
    assert retry.params == killed.params
    workers = {t.number: t.user_attrs["worker"].rsplit(":", 1)[1] for t in trials}
    assert workers == {killed.number: str(first_a.pid), retry.number: str(worker_b.pid),
                       ({0, 1, 2} - {killed.number, retry.number}).pop(): str(second_a.pid)}
    ran = {f"shared-{t.number}": t for t in trials if t.number != killed.number}  # a trial that ran has its experiment

    for root in (a, b):
        run(dvc("exp", "push", "origin"), root)
    collector = machine("collector", data=False)
    run(dvc("exp", "pull", "origin"), collector)
    shown = exp_show(collector)
    for name, trial in ran.items():
        # every trial that ran is an experiment: its sampled params are the experiment's, and what it recorded is the
        # experiment's validation f1; its train stage reported the f1 of every epoch it ran to the trial (the loop's
        # hook, through $FINETUNE_TRIAL)
        seed = trial.user_attrs["seed_7"]
        assert sorted(trial.intermediate_values) == list(range(1, seed["epochs"] + 1)), trial.intermediate_values
        train_params = shown[name]["params"]["params.yaml"]["data"]["train"]
        assert train_params["lr"] == pytest.approx(trial.params["train.lr"])
        assert train_params["scheduler"] == trial.params["train.scheduler"] and train_params["warmup_steps"] == 1
        evaluation = shown[name]["metrics"]["metrics/eval.json"]["data"]
        assert evaluation["validation"]["f1"] == pytest.approx(seed["value"])
        assert "test" not in evaluation  # the search never reads test
        assert {"COMPLETE": trial.value == seed["value"], "PRUNED": seed["pruned"],
                "FAIL": "collapsed" in trial.user_attrs.get("fail_reason", "")}[trial.state.name]
    # the same command on the complete study: no trial runs, the report is written from the database alone
    out = run(args, collector)
    assert "dvc exp run" not in out and urlsplit(postgres).password not in out  # the password: never shown
    report = collector / "metrics/search/shared"
    table = squeeze((report / "trials.md").read_text())
    assert "| trial | state | train.lr | train.scheduler | seed 7 | mean f1 | train s | note |" in table
    for trial in trials:
        assert f"| {trial.number} | {trial.state.name} |" in table
    assert f"retry of trial {killed.number}" in table
    summary = json.loads((report / "trials.json").read_text())["summary"]
    assert summary["trials"] == 3 and summary["metric"] == "validation.f1" and summary["direction"] == "maximize"
    assert (report / "history.png").stat().st_size > 0
    if any(t.state.name == "COMPLETE" for t in trials):
        best = study().best_params
        recipe = load_recipe(str(report / "recipe.yaml"))
        assert recipe["train"]["lr"] == pytest.approx(best["train.lr"]) and recipe["train"]["warmup_steps"] == 1
        base = yaml.safe_load((collector / "params.yaml").read_text())
        validate_params({s: {**base[s], **recipe.get(s, {})} for s in base}, "recipe")
