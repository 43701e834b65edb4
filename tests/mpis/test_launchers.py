"""MPICluster, ``mpinb info`` and a rank's death under this venv's MPI (Open MPI or Intel MPI):
started, used, interrupted and stopped with nothing left, listening on loopback alone."""

from __future__ import annotations

import glob
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

import psutil
import pytest
from conftest import LIBRARY

import mpinb
from mpinb.client.launch import run_mpi
from support.cells import names_the_dead_rank

OPEN_MPI = LIBRARY == "Open MPI"


def test_mpi4py_loads_this_venvs_mpi_and_there_is_no_mpich_wheel() -> None:
    with pytest.raises(metadata.PackageNotFoundError):
        metadata.distribution("mpich")
    done = run_mpi(2, ["-c", "from mpi4py import MPI; print(MPI.Get_library_version())"], timeout=120, capture=True)
    assert done.returncode == 0 and [line.startswith(LIBRARY) for line in done.stdout.split("\n") if line.strip()] == [
        True, True], done.stdout


def test_mpinb_info_passes_its_two_rank_check() -> None:
    before = set(os.listdir("/dev/shm"))
    done = subprocess.run([str(Path(sys.executable).parent / "mpinb"), "info"], capture_output=True, text=True,
                          timeout=300)
    # Nothing of MPI's left behind (Open MPI 5.0's singletons leave their shared-memory segment).
    assert not set(os.listdir("/dev/shm")) - before, sorted(set(os.listdir("/dev/shm")) - before)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(rf"MPI library +{re.escape(LIBRARY)}", done.stdout), done.stdout
    assert "2 MPI ranks: shard_bounds split 1000 rows, allreduce summed them to 499500 (expected 499500)" in done.stdout


def test_the_launcher_is_told_apart_for_rank_tags() -> None:
    # Intel MPI's mpiexec is a Hydra that says so only by its library's name: its lines get rank tags
    # ("[1] ..."), whose last words a death report quotes; PRRTE's prterun has no such option.
    from mpinb.client.launch import find_mpiexec, is_hydra

    assert is_hydra(find_mpiexec()) is (not OPEN_MPI)


LOOP = """
import time, numpy as np, mpinb
rank = mpinb.world().rank
try:
    for step in range(100_000):
        mpinb.allreduce([np.ones(1)])
        time.sleep(0.01)
    raised = None
except BaseException as exc:
    raised = type(exc).__name__
"""


def test_a_cluster_starts_runs_cells_stops_at_an_interrupt_and_leaves_nothing() -> None:
    with mpinb.MPICluster(n=2) as cluster:
        cluster.view.execute("import numpy as np, mpinb\n"
                             "total = mpinb.allreduce([np.ones(3) * (mpinb.world().rank + 1)])[0].tolist()", block=True)
        assert cluster.pull("total") == [[3.0] * 3] * 2
        wide = listening_beyond_loopback()
        for (ip, port), holders in wide.items():
            # Held on a wildcard address (prterun's daemon port, Hydra's control port), it answers
            # loopback alone: from this machine's other addresses a connection gets no answer.
            for address in other_addresses(socket.AF_INET6 if ":" in ip else socket.AF_INET):
                with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET) as probe:
                    probe.settimeout(1.0)
                    with pytest.raises(TimeoutError):
                        probe.connect((address, port))
                        pytest.fail(f"{holders} answer on {address}:{port}")
        ar = cluster.view.execute(LOOP, block=False)
        time.sleep(2.0)
        cluster.interrupt()
        ar.wait(timeout=60)
        assert ar.ready(), "the cell outlived the interrupt"
        raised = cluster.pull("raised")
        assert "KeyboardInterrupt" in raised and set(raised) <= {"KeyboardInterrupt", "CollectiveAbandoned"}, raised
        cluster.view.execute("total = mpinb.allreduce([np.ones(1)])[0].tolist()", block=True)
        assert cluster.pull("total") == [[2.0]] * 2
        pids = [*cluster._engine_pids, *(launcher.pid for launcher in cluster.cluster.engines.values())]
        files = set(cluster._path.leftovers)  # its connection files, MPI's shared memory, the engines' TMPDIR
    assert not [pid for pid in pids if psutil.pid_exists(pid)]
    assert not [path for path in files if os.path.exists(path)]
    assert not launcher_session_files(pids)


def test_a_killed_rank_is_reported_in_the_launchers_words() -> None:
    with mpinb.MPICluster(n=2) as cluster:
        cluster.view.execute("import time, mpinb\nrank = mpinb.world().rank", block=True)
        ar = cluster.view.execute("mpinb.allreduce([1]) if rank == 0 else time.sleep(30)", block=False)
        time.sleep(1.0)
        pid = cluster._engine_pids[1]
        launchers = [launcher.pid for launcher in cluster.cluster.engines.values()]
        os.kill(pid, signal.SIGKILL)
        ar.wait(timeout=60)
        assert ar.ready(), "the cell outlived the killed rank"
        deaths = None
        for _ in range(100):  # the launcher writes its report as the job ends
            deaths = cluster.deaths()
            if deaths:
                break
            time.sleep(0.1)
        # Open MPI's prterun names the signal ("exited on signal 9 (Killed)"); Hydra may end first.
        how = r" \(SIGKILL\)" if OPEN_MPI else r"( \(SIGKILL\))?"
        assert names_the_dead_rank(deaths, 1, cluster.ids_by_rank[1], pid, how), deaths
        cluster.restart()
        cluster.view.execute("import mpinb; size = mpinb.world().size", block=True)
        assert cluster.pull("size") == [2, 2]
    assert not launcher_session_files(launchers)


def test_a_launcher_that_ends_at_once_is_quoted() -> None:
    wrong, said = (["--map-by", "nonsense"], "mapby directive is not recognized") if OPEN_MPI else (
        ["-bogus-option"], "unrecognized argument bogus-option")
    with pytest.raises(RuntimeError, match=rf"the engines' mpiexec ended before 2 of 2 engines registered: .*{said}"):
        mpinb.MPICluster(n=2, mpi_args=wrong, timeout=60).start()


def listening_beyond_loopback() -> dict[tuple[str, int], set[str]]:
    """The sockets this process's descendants listen on, on an address other than loopback."""
    wide: dict[tuple[str, int], set[str]] = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            for c in proc.net_connections(kind="inet"):
                if c.status == psutil.CONN_LISTEN and c.laddr.ip not in ("127.0.0.1", "::1"):
                    wide.setdefault((c.laddr.ip, c.laddr.port), set()).add(proc.name())
        except psutil.Error:
            continue
    assert all(ip in ("0.0.0.0", "::") for ip, _ in wide), wide  # bound to another address: nothing to filter
    return wide


def other_addresses(family: int) -> list[str]:
    found = [a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs
             if a.family in (socket.AF_INET, socket.AF_INET6) and not a.address.startswith(("127.", "::1", "fe80"))]
    return [a for a in found if family == socket.AF_INET6 or ":" not in a]


def launcher_session_files(pids: list[int]) -> list[str]:
    """Open MPI's session folders (``/tmp/prte.HOST.UID/dvm.PID``) of these launchers."""
    return [path for pid in pids for path in glob.glob(f"{tempfile.gettempdir()}/prte.*/*.{pid}")]
