"""The code style CI enforces: ``ruff check`` (pyflakes and pycodestyle errors) and ``ruff format`` (line length
119), both configured in ``ruff.toml``, over the package, the tests, the scripts and the benchmarks."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _ruff() -> list:
    exe = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if exe is None:
        pytest.fail("ruff is not installed: it is part of the [test] extra (pip install -e .[test])")
    return [exe]


def test_ruff_is_configured_with_the_projects_line_length():
    config = (ROOT / "ruff.toml").read_text()
    assert "line-length = 119" in config


def test_ruff_check_passes():
    result = subprocess.run([*_ruff(), "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_leaves_every_file_unchanged():
    result = subprocess.run(
        [*_ruff(), "format", "--no-cache", "--check", "."], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, "run `ruff format .`:\n" + result.stdout + result.stderr
