""".ci/setup refuses an interpreter the lock is not made for, and a torch it cannot find, with one line saying what
to do and before it installs anything. Run on a copy of the files it reads, with stand-in interpreters and pip."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.helpers import REPO


def setup_copy(tmp_path: Path) -> Path:
    """A folder with what .ci/setup reads: itself, pyproject.toml and requirements.lock."""
    (tmp_path / ".ci").mkdir()
    for name in (".ci/setup", "pyproject.toml", "requirements.lock"):
        shutil.copy(REPO / name, tmp_path / name)
    return tmp_path


def stand_in(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def run_setup(root: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", ".ci/setup"], cwd=root, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", **env})


def test_another_python_is_refused_before_anything_is_installed(tmp_path):
    root = setup_copy(tmp_path)
    python = stand_in(tmp_path / "bin/python3.12", 'echo "CPython 3.12.1"')
    result = run_setup(root, PYTHON=str(python))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f".ci/setup: requirements.lock is for CPython 3.11, but {python} is CPython 3.12.1: install CPython 3.11 "
        "and run PYTHON=python3.11 bash .ci/setup"]
    assert not (root / ".venv").exists()


def test_a_missing_python_is_named(tmp_path):
    result = run_setup(setup_copy(tmp_path), PYTHON="no-such-python")
    assert result.returncode == 1
    assert result.stderr.strip() == (".ci/setup: no Python at 'no-such-python': install CPython 3.11 and run "
                                     "PYTHON=python3.11 bash .ci/setup")


def test_a_venv_of_another_python_is_named(tmp_path):
    root = setup_copy(tmp_path)
    stand_in(root / ".venv/bin/python", 'echo "CPython 3.10.13"')
    result = run_setup(root)
    assert result.returncode == 1
    assert "but .venv has CPython 3.10.13: rm -rf .venv, then PYTHON=python3.11 bash .ci/setup" in result.stderr


def test_torch_comes_from_pytorchs_cpu_index_when_pips_sources_lack_it(tmp_path):
    """The stand-in venv's pip logs its arguments and fails every torch install, as a user's pip without access to
    PyTorch's index does: setup asks that index second and stops with one line naming both places."""
    root = setup_copy(tmp_path)
    stand_in(root / ".venv/bin/python", f"""
case "$1" in
  -c) echo "CPython 3.11.7" ;;
  -m) echo "$@" >>{tmp_path}/pip-calls; case "$*" in *requirements-torch.lock*) exit 1 ;; esac ;;
esac""")
    result = run_setup(root)
    assert result.returncode == 1
    assert result.stdout.strip() == (".ci/setup: torch's CPU wheel is not among pip's sources; installing it from "
                                     "https://download.pytorch.org/whl/cpu")
    error = result.stderr.strip().splitlines()
    assert len(error) == 1 and error[0].startswith(".ci/setup: could not install torch==2.13.0+cpu from PyPI or "
                                                   "https://download.pytorch.org/whl/cpu (pip's log:")
    calls = (tmp_path / "pip-calls").read_text().splitlines()
    torch_calls = [c for c in calls if "requirements-torch.lock" in c]
    assert len(torch_calls) == 2 and "--index-url https://download.pytorch.org/whl/cpu" in torch_calls[1]
    assert not any("requirements-no-torch.lock" in c for c in calls)  # nothing else installed after the failure
    torch_entry = (root / ".venv/requirements-torch.lock").read_text()
    assert torch_entry.startswith("torch==2.13.0+cpu \\\n") and "--hash=sha256:" in torch_entry
    assert "torch==" not in (root / ".venv/requirements-no-torch.lock").read_text()
