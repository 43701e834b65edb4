"""The repository passes ``ruff check .`` with the rules in ``pyproject.toml``: the pinned ruff of
the ``test`` extra, the same run as the pre-commit hook and ``docs/contributing.md``'s lint step."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_finds_nothing() -> None:
    pytest.importorskip("ruff", reason="ruff is in the test extra: pip install -e '.[test]'")
    # From the root, so pyproject.toml's settings and excludes apply as they do on the command line.
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    if proc.returncode != 0:  # ruff's own report, not the CompletedProcess's repr
        pytest.fail(f"ruff check . exited {proc.returncode}:\n{proc.stdout}{proc.stderr}", pytrace=False)
