"""Tests of mpinb under another MPI than the mpich wheel's, run in that MPI's own venv by
``python3 tests/run.py --tier mpis``: a private IPYTHONDIR, and nothing left running."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import psutil
import pytest

_IPYTHONDIR = tempfile.mkdtemp(prefix="mpinb-test-ipython-")
atexit.register(shutil.rmtree, _IPYTHONDIR, True)
os.environ["IPYTHONDIR"] = _IPYTHONDIR
os.environ.setdefault("IPP_NONINTERACTIVE", "1")

# "Open MPI" or "Intel(R) MPI": how this venv's MPI_Get_library_version begins (tests/run.py).
LIBRARY = os.environ.get("MPINB_TEST_MPI", "")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not LIBRARY:
        for item in items:
            item.add_marker(pytest.mark.skip(reason="run by tests/run.py --tier mpis, in an MPI's own venv"))


@pytest.fixture(autouse=True)
def nothing_left_running():
    """After each test, no process it started may remain (engines, controllers, launchers)."""
    yield
    left = psutil.Process().children(recursive=True)
    gone, alive = psutil.wait_procs(left, timeout=10)
    for proc in alive:
        proc.kill()
    assert not alive, f"processes left running: {[(p.pid, p.name()) for p in alive]}"
