"""mpinb passes ``mypy`` with the settings in ``pyproject.toml`` (``[tool.mypy]``): the package ships
``py.typed``, so its annotations are a promise to every user's type checker. The pinned mypy of the
``test`` extra, the same run as the pre-commit hook and ``docs/contributing.md``'s type-check step."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_mypy_finds_nothing(tmp_path: Path) -> None:
    pytest.importorskip("mypy", reason="mypy is in the test extra: pip install -e '.[test]'")
    # From the root, so pyproject.toml's files and overrides apply; the cache goes with tmp_path.
    proc = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        pytest.fail(f"mypy exited {proc.returncode}:\n{proc.stdout}{proc.stderr}", pytrace=False)
