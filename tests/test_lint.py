"""ruff (rules in pyproject.toml) passes on the repository, so a change that breaks it fails the test run too,
not only `make lint` (which also runs mypy; too slow for the test suite)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ruff() -> str | None:
    beside = Path(sys.executable).with_name("ruff")  # the venv's, installed by the lint extra
    return str(beside) if beside.is_file() else shutil.which("ruff")


def test_ruff_passes():
    ruff = _ruff()
    if ruff is None:
        pytest.skip('ruff is not installed (pip install -e ".[lint]"; make installs it)')
    out = subprocess.run([ruff, "check", "--no-cache", "--output-format", "concise", "."], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
