"""A train stage killed mid-run (SIGINT, SIGTERM, SIGKILL) resumes from its last checkpoint and ends exactly where an
uninterrupted run ends; killed runs leave no finished-looking output."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from datasets import DatasetDict
from safetensors.torch import load_file

from stages.data import tokenize
from tests.conftest import REPO, make_split

EPOCHS = 3
TIMING_KEYS = {"train_seconds", "samples_per_second", "wall_seconds", "peak_memory_mb", "resumed_from_epoch"}


def write_params(project: Path, **train) -> None:
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["train"].update(seed=3, epochs=EPOCHS, max_steps=None, batch_size=8, num_threads=1, lr=1e-3, warmup_ratio=0.1,
                           warmup_steps=0, weight_decay=0.01, max_grad_norm=1.0, early_stopping_patience=None,
                           mixed_precision="no", log_every=10, group_by_length=True, adamw_impl="default",
                           accelerate_config=str(REPO / "configs/accelerate/default.yaml"))
    params["train"].update(train)
    params["evaluate"].update(batch_size=16)
    (project / "params.yaml").write_text(yaml.safe_dump(params))


@pytest.fixture(scope="module")
def project_template(tokenizer, tiny_checkpoint, tmp_path_factory) -> Path:
    """A project folder with params.yaml, data/tokenized (800 train rows: 100 steps an epoch) and the tiny model."""
    root = tmp_path_factory.mktemp("resume-template")
    raw = DatasetDict({"train": make_split(800, 10), "validation": make_split(40, 11), "test": make_split(20, 12)})
    tokenize(raw, tokenizer, max_length=64).save_to_disk(str(root / "data" / "tokenized"))
    shutil.copytree(tiny_checkpoint, root / "models" / "pretrained")
    write_params(root)
    return root


def start_train(project: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    # A shell starts background jobs with SIGINT ignored, and Python then installs no KeyboardInterrupt handler:
    # give the run the default disposition a terminal gives it, whatever started pytest.
    return subprocess.Popen([sys.executable, "-m", "stages.train"], cwd=project, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def run_train(project: Path) -> str:
    process = start_train(project)
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output[-3000:]
    return output


def outcome(project: Path) -> tuple[dict, dict, dict]:
    """Final weights, train metrics without timings, and the DVCLive epoch/step logs (step and value columns)."""
    weights = load_file(project / "models" / "finetuned" / "model.safetensors")
    metrics = {k: v for k, v in json.loads((project / "metrics" / "train.json").read_text()).items()
               if k not in TIMING_KEYS}
    logs = {}
    for tsv in sorted((project / "dvclive" / "train").rglob("*.tsv")):
        table = pd.read_csv(tsv, sep="\t")
        logs[str(tsv.relative_to(project))] = table.round(6).to_dict("list")
    return weights, metrics, logs


@pytest.fixture(scope="module")
def uninterrupted(project_template, tmp_path_factory):
    project = tmp_path_factory.mktemp("uninterrupted") / "p"
    shutil.copytree(project_template, project)
    run_train(project)
    return outcome(project)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["SIGINT", "SIGTERM", "SIGKILL"])
def test_killed_run_resumes_to_the_uninterrupted_result(project_template, uninterrupted, tmp_path, signum):
    project = tmp_path / "p"
    shutil.copytree(project_template, project)
    process = start_train(project)
    deadline = time.time() + 240
    while not (project / "models" / "checkpoints" / "epoch-1").is_dir():  # wait for the end of epoch 1 ...
        assert process.poll() is None and time.time() < deadline, "the run ended before its first checkpoint"
        time.sleep(0.05)
    time.sleep(0.5)  # ... and kill it during epoch 2
    process.send_signal(signum)
    output, _ = process.communicate(timeout=60)
    assert process.returncode != 0, "the run finished before it was killed"

    # Nothing that looks finished: no model, no metrics; SIGINT/SIGTERM also removed their temp folders.
    assert not (project / "models" / "finetuned").exists()
    assert not (project / "metrics" / "train.json").exists()
    assert not (project / "dvclive" / "train").exists()
    if signum != signal.SIGKILL:
        assert not [p for p in project.rglob(".*.tmp")], output[-2000:]
    checkpoints = sorted(p.name for p in (project / "models" / "checkpoints").glob("epoch-*"))
    assert checkpoints and checkpoints[-1] != f"epoch-{EPOCHS}"

    log = run_train(project)
    assert f"Resuming after epoch {checkpoints[-1].split('-')[1]}" in log
    weights, metrics, logs = outcome(project)
    expected_weights, expected_metrics, expected_logs = uninterrupted
    assert weights.keys() == expected_weights.keys()
    for name, tensor in expected_weights.items():
        assert weights[name].equal(tensor), name
    assert metrics == expected_metrics
    assert logs == expected_logs
    assert json.loads((project / "metrics" / "train.json").read_text())["resumed_from_epoch"] >= 1
    assert not [p for p in project.rglob(".*.tmp")]  # stale temp folders of a SIGKILLed run are cleaned up


def test_changed_params_start_afresh_instead_of_resuming(project_template, tmp_path):
    project = tmp_path / "p"
    shutil.copytree(project_template, project)
    write_params(project, epochs=1)
    run_train(project)
    write_params(project, epochs=1, lr=5e-4)  # another run: its checkpoints must not be continued
    log = run_train(project)
    assert "Resuming" not in log
    assert json.loads((project / "metrics" / "train.json").read_text())["resumed_from_epoch"] == 0


def test_changed_code_changes_the_run_fingerprint(tmp_path, monkeypatch):
    # A checkpoint written by other training code is not continued: the fingerprint covers the stages' source.
    import types

    from stages.train import code_digest

    module = types.ModuleType("stages._probe")
    module.__file__ = str(tmp_path / "_probe.py")
    (tmp_path / "_probe.py").write_text("LR_SCALE = 1\n")
    monkeypatch.setitem(sys.modules, "stages._probe", module)
    before = code_digest()
    assert code_digest() == before
    (tmp_path / "_probe.py").write_text("LR_SCALE = 2\n")
    assert code_digest() != before
