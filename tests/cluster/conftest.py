"""Tests that start real MPI engine clusters: a private IPYTHONDIR, and nothing left running."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import time
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
    began = time.time()
    yield
    left = cluster_processes()
    gone, alive = psutil.wait_procs(left, timeout=10)
    for proc in alive:
        proc.kill()
    assert not alive, f"processes left running: {[p.pid for p in alive]}"
    orphans = _orphan_segments(began)
    for path in orphans:
        os.unlink(path)
    assert not orphans, f"MPI shared-memory segments left in /dev/shm: {orphans}"


def _orphan_segments(since: float, settle: float = 10.0) -> list[str]:
    """MPICH's segments made since ``since`` that no process maps, and still there ``settle``
    seconds on: a world whose ranks died, which the cluster's stop had to remove. Segments of a
    cluster another test process runs meanwhile (the tier runs in two shards side by side) are
    mapped, or removed by their owner within the settling time."""
    deadline = time.monotonic() + settle
    while True:
        try:
            made = {os.path.join("/dev/shm", n) for n in os.listdir("/dev/shm") if n.startswith("mpich_shm_")}
        except OSError:
            return []
        made = {p for p in made if _mtime(p) >= since - 1}
        orphans = sorted(made - _mapped())
        if not orphans or time.monotonic() > deadline:
            return orphans
        time.sleep(0.5)


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def _mapped() -> set[str]:
    found = set()
    for pid in psutil.pids():
        try:
            with open(f"/proc/{pid}/maps") as maps:
                found.update(line.split(maxsplit=5)[-1].strip().removesuffix(" (deleted)")
                             for line in maps if "/dev/shm/" in line)
        except OSError:
            continue
    return found
