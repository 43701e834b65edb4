"""Tests that start real MPI engine clusters: a private IPYTHONDIR, and nothing left running."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import psutil
import pytest

# ipyparallel reads IPYTHONDIR when it builds profile paths: set it before any cluster exists so
# tests never touch (or collide with) the user's profiles.
_IPYTHONDIR = tempfile.mkdtemp(prefix="mpinb-test-ipython-")
atexit.register(shutil.rmtree, _IPYTHONDIR, True)  # the tier's profiles: nothing left in /tmp
os.environ["IPYTHONDIR"] = _IPYTHONDIR
os.environ.setdefault("IPP_NONINTERACTIVE", "1")

PERMUTED_ENGINE = str(Path(__file__).parent / "permuted_engine.py")
LATE_OUTPUT_ENGINE = str(Path(__file__).parent / "late_output_engine.py")


def cluster_processes() -> list[psutil.Process]:
    """Engines, controllers and mpiexec started under this test process."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        if any(tag in cmd for tag in ("ipyparallel.engine", "mpinb._engine_boot", "ipyparallel.controller", "mpiexec",
                                      "hydra_pmi_proxy", "permuted_engine", "mpinb.client._watchdog")):
            found.append(proc)
    return found


@pytest.fixture(autouse=True, scope="module")
def no_cluster_left_behind():
    """After each module, even a failing one, no cluster process of ours may remain (module scope:
    set up before, and so torn down after, the module's shared cluster fixtures)."""
    yield
    left = cluster_processes()
    gone, alive = psutil.wait_procs(left, timeout=10)
    for proc in alive:
        proc.kill()
    assert not alive, f"processes left running: {[p.pid for p in alive]}"
