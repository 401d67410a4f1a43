"""A train stage killed mid-run (SIGINT, SIGTERM, SIGKILL) resumes from its last checkpoint and ends exactly where an
uninterrupted run ends; killed runs leave no finished-looking output."""

from __future__ import annotations

import json
import shutil
import signal
import time
from pathlib import Path

import pandas as pd
import pytest
from safetensors.torch import load_file

from finetune.overrides import with_overrides
from finetune.paths import Paths
from finetune.runtime import write_json
from finetune.train.recipe import train
from tests.helpers import (
    REPO,
    interrupt_and_resume,
    make_project,
    make_raw,
    python,
    reset_accelerate,
    run,
    start,
    tiny_params,
)

EPOCHS = 3
TIMING_KEYS = {"train_seconds", "samples_per_second", "wall_seconds", "peak_memory_mb", "resumed_from_step"}
# 800 train rows in batches of 8: 100 optimizer steps an epoch, long enough to be killed during epoch 2.
PARAMS = dict(train={"seed": 3, "epochs": EPOCHS, "num_threads": 1, "warmup_steps": 0, "warmup_ratio": 0.1,
                     "log_every": 10, "group_by_length": True, "keep_best": True, "scheduler": "cosine",
                     "save_every_steps": 50, "save_total_limit": 2},
              evaluate={"batch_size": 16})


@pytest.fixture(scope="module")
def project_template(tiny_checkpoint, tmp_path_factory) -> Path:
    """A project folder with params.yaml, the train stage's inputs (800 train rows) and the tiny model."""
    root = tmp_path_factory.mktemp("resume-template") / "p"
    make_project(root, tiny_params(**PARAMS), make_raw(800, 40, 20, seed=10), tiny_checkpoint)
    return root


def run_train(project: Path) -> str:
    return run(python("-m", "stages.train"), project, timeout=300)


def outcome(project: Path) -> tuple[dict, dict, dict]:
    """Final weights, train metrics without timings, and the DVCLive epoch/step logs (step and value columns)."""
    weights = load_file(project / "models" / "trained" / "model.safetensors")
    metrics = {k: v for k, v in json.loads((project / "metrics" / "train.json").read_text()).items()
               if k not in TIMING_KEYS}
    logs = {}
    for tsv in sorted((project / "dvclive" / "train").rglob("*.tsv")):
        table = pd.read_csv(tsv, sep="\t")
        logs[str(tsv.relative_to(project))] = table.round(6).to_dict("list")
    return weights, metrics, logs


@pytest.fixture(scope="module")
def uninterrupted(project_template, tmp_path_factory):
    """The run never interrupted, trained in this process (the train stage's ``train``, one torch import less). It
    must equal the resumed subprocess runs bit for bit: one CPU thread (``train.num_threads``), seeded, and this file
    starts first on its worker (``tests/conftest.py``), before other tests' torch state."""
    project = tmp_path_factory.mktemp("uninterrupted") / "p"
    shutil.copytree(project_template, project)
    paths = Paths(project)
    write_json(paths.metrics / "train.json", train(tiny_params(**PARAMS), paths))  # as stages/train.py does
    reset_accelerate()
    return outcome(project)


def kill_after_checkpoint(project: Path, step: int, signum: int) -> str:
    """Start the train stage, send ``signum`` 0.2 s after its checkpoint ``step-<step>`` appears; return its output."""
    process = start(python("-m", "stages.train"), project)
    deadline = time.time() + 240
    while not (project / "models" / "checkpoints" / f"step-{step}").is_dir():
        assert process.poll() is None and time.time() < deadline, f"the run ended before its checkpoint at {step}"
        time.sleep(0.05)
    time.sleep(0.2)
    process.send_signal(signum)
    output, _ = process.communicate(timeout=60)
    assert process.returncode != 0, "the run finished before it was killed"
    return output


@pytest.mark.e2e  # the train stage as a subprocess, killed and started again
def test_a_run_killed_three_times_resumes_to_the_uninterrupted_result(project_template, uninterrupted, tmp_path):
    # Ctrl-C in epoch 1, before the first evaluation (step 100); SIGTERM (kill, schedulers, dvc queue kill) in epoch 3
    # of the resumed run; SIGKILL later in epoch 3 of the run resumed again. The last resume ends exactly where an
    # uninterrupted run ends.
    project = tmp_path / "p"
    shutil.copytree(project_template, project)
    resumed_from = 0
    for step, signum in ((50, signal.SIGINT), (200, signal.SIGTERM), (250, signal.SIGKILL)):
        output = kill_after_checkpoint(project, step, signum)
        if resumed_from:
            assert f"Resuming from step {resumed_from}" in output
        else:
            assert not (project / "models" / "checkpoints" / "best").exists()  # no evaluation yet
        # Nothing that looks finished: no model, no metrics; SIGINT/SIGTERM also removed their temp folders.
        assert not (project / "models" / "trained").exists()
        assert not (project / "metrics" / "train.json").exists()
        assert not (project / "dvclive" / "train").exists()
        if signum != signal.SIGKILL:
            assert not [p for p in project.rglob(".*.tmp")], output[-2000:]
        checkpoints = sorted(int(p.name.split("-")[1]) for p in (project / "models" / "checkpoints").glob("step-*"))
        assert checkpoints and step <= checkpoints[-1] < 100 * EPOCHS
        resumed_from = checkpoints[-1]

    log = run_train(project)
    assert f"Resuming from step {resumed_from}" in log
    weights, metrics, logs = outcome(project)
    expected_weights, expected_metrics, expected_logs = uninterrupted
    assert weights.keys() == expected_weights.keys()
    for name, tensor in expected_weights.items():
        assert weights[name].equal(tensor), name
    assert metrics == expected_metrics
    assert logs == expected_logs
    assert json.loads((project / "metrics" / "train.json").read_text())["resumed_from_step"] >= 250
    assert not [p for p in project.rglob(".*.tmp")]  # stale temp folders of a SIGKILLed run are cleaned up


def test_a_checkpoint_saved_before_the_first_evaluation_resumes(tiny_project, monkeypatch):
    # 5 steps, evaluated at the end of the epoch: stopped at step 3, after the checkpoint of step 2. A checkpoint
    # written before the first evaluation may hold no early-stopping record ("stopping": {}); the resume starts a fresh
    # one.
    params = tiny_params(train={"epochs": 1, "save_every_steps": 2, "early_stopping_patience": 1, "num_threads": 1})
    expected = train(params, tiny_project("whole", params))
    reset_accelerate()
    paths = tiny_project("stopped", params)

    def forget_the_stopping_record():
        state = paths.checkpoints / "step-2" / "trainer_state.json"
        state.write_text(json.dumps({**json.loads(state.read_text()), "stopping": {}}))

    metrics = interrupt_and_resume(params, paths, monkeypatch, step=3, between=forget_the_stopping_record)
    assert metrics["resumed_from_step"] == 2
    assert {k: v for k, v in metrics.items() if k not in TIMING_KEYS} == \
        {k: v for k, v in expected.items() if k not in TIMING_KEYS}


def test_changed_params_start_afresh_instead_of_resuming(project_template, tmp_path):
    project = tmp_path / "p"
    shutil.copytree(project_template, project)
    first = tiny_params(**{**PARAMS, "train": {**PARAMS["train"], "epochs": 1}})
    train(first, Paths(project))
    reset_accelerate()
    # another run: its checkpoints must not be continued
    assert list((project / "models" / "checkpoints").glob("step-*"))
    metrics = train(with_overrides(first, {"train": {"lr": 5e-4}}), Paths(project))
    assert metrics["resumed_from_step"] == 0


def test_changed_code_changes_the_run_fingerprint(tmp_path, monkeypatch):
    # A checkpoint written by other training code is not continued: the fingerprint hashes every project file the
    # train stage runs, the metric module loaded by path included.
    from finetune import code

    project = tmp_path / "repo"
    for name in code.project_files("stages.train"):
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, project / name)
    monkeypatch.setattr(code, "ROOT", project)
    before = code.code_digest("stages.train")
    assert code.code_digest("stages.train") == before
    metric = project / "finetune" / "evaluate" / "glue_metric.py"
    metric.write_text(metric.read_text() + "\n# changed\n")
    assert code.code_digest("stages.train") != before


def test_the_resolved_precision_is_part_of_the_run_fingerprint(tiny_project):
    # train.mixed_precision: auto is bf16 on a CPU with AVX512-BF16 and fp32 on one without: the same params.yaml
    # must not continue the other machine's checkpoint.
    from datasets import load_from_disk

    from finetune.train.resume import run_fingerprint

    params = tiny_params()
    paths = tiny_project("project", params)
    tokenized = load_from_disk(str(paths.tokenized))
    bf16, fp32 = (run_fingerprint(params, paths, tokenized, 1, precision) for precision in ("bf16", "no"))
    assert bf16 != fp32 and run_fingerprint(params, paths, tokenized, 1, "no") == fp32
