"""End to end: the real dvc.yaml in a temp git repo, tiny params, `dvc repro`, `dvc exp run`, `dvc exp show`.

Stages run as `python -m stages.<name>` exactly as for a user; the venv's bin folder goes first on PATH so
`python` and `dvc` are this interpreter's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

pytestmark = pytest.mark.e2e

# What a clone holds that the pipeline needs (everything else is generated).
PROJECT_FILES = ["stages", "dvc.yaml", "params.yaml", ".dvcignore", ".gitignore", ".dvc/config", ".dvc/.gitignore"]


def run(cmd: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    assert result.returncode == 0, f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def project(tmp_path_factory, hub_layout_dataset, tiny_checkpoint):
    """A git repo holding the project with tiny params: the tiny local dataset and checkpoint, 3 steps."""
    root = tmp_path_factory.mktemp("e2e") / "project"
    for name in PROJECT_FILES:
        src, dst = REPO / name, root / name
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["data"].update(dataset=str(hub_layout_dataset), local_copy=None)
    params["model"]["checkpoint"] = str(tiny_checkpoint)
    params["tokenize"]["max_length"] = 128
    params["train"].update(max_steps=3, epochs=1, lr=1e-3)
    params["evaluate"]["batch_size"] = 8
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))

    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "HF_HUB_OFFLINE": "1", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    env.pop("PYTHONPATH", None)
    for cmd in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A"], ["git", "commit", "-qm", "project"]):
        run(cmd, root, env)
    return root, env


def dvc(root: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return run([str(Path(sys.executable).parent / "dvc"), *args], root, env)


def test_repro_exp_run_and_exp_show(project):
    root, env = project

    out = dvc(root, env, "repro")
    for stage in ("download", "tokenize", "collate-check", "train", "evaluate"):
        assert f"Running stage '{stage}'" in out.stdout
    for path in ("data/raw", "data/tokenized", "data/predictions/validation.csv", "data/predictions/test.csv",
                 "models/pretrained/config.json", "models/finetuned/model.safetensors", "dvc.lock"):
        assert (root / path).exists(), path
    metrics = json.loads((root / "metrics/eval.json").read_text())
    assert set(metrics) == {"validation", "test"}
    assert 0 <= metrics["validation"]["accuracy"] <= 1 and 0 <= metrics["validation"]["f1"] <= 1
    assert json.loads((root / "metrics/train.json").read_text())["steps"] == 3
    provenance = json.loads((root / "metrics/provenance.json").read_text())
    assert provenance["dataset"]["kind"] == "local" and provenance["dataset"]["splits"]["train"]["rows"] == 40
    # DVC outputs are git-ignored; metrics are not.
    ignored = run(["git", "status", "--porcelain", "--ignored"], root, env).stdout
    assert "!! data/raw" in ignored and "!! models/finetuned" in ignored
    assert "metrics/" in run(["git", "status", "--porcelain"], root, env).stdout

    # Nothing changed: status is clean and a second repro runs no stage.
    assert "up to date" in dvc(root, env, "status").stdout
    again = dvc(root, env, "repro")
    assert "Running stage" not in again.stdout

    run(["git", "add", "-A"], root, env)
    run(["git", "commit", "-qm", "baseline run"], root, env)

    # Changing train.lr reruns train and evaluate only.
    exp = dvc(root, env, "exp", "run", "-S", "train.lr=3e-4", "--name", "lr-3e-4")
    assert "Running stage 'train'" in exp.stdout and "Running stage 'evaluate'" in exp.stdout
    assert "Running stage 'tokenize'" not in exp.stdout and "Running stage 'download'" not in exp.stdout

    shown = json.loads(dvc(root, env, "exp", "show", "--json").stdout)
    runs = {}
    for commit in shown:
        runs[commit.get("name") or commit["rev"]] = commit["data"]
        for exp_group in commit.get("experiments") or []:
            for rev in exp_group["revs"]:
                runs[rev.get("name") or rev["rev"]] = rev["data"]
    assert "lr-3e-4" in runs
    lrs = set()
    for data in runs.values():
        if not data or not data.get("metrics"):
            continue  # the workspace entry after `exp run` mirrors the experiment
        lrs.add(data["params"]["params.yaml"]["data"]["train"]["lr"])
        assert "validation" in data["metrics"]["metrics/eval.json"]["data"]
    assert {1e-3, 3e-4} <= {float(lr) for lr in lrs}
