"""The code passes ruff ([tool.ruff] in pyproject.toml: pyflakes, pycodestyle, import order, pyupgrade, bugbear)."""

import subprocess
import sys

from tests.helpers import REPO


def test_ruff_finds_nothing():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
