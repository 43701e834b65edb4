"""The multihost tier: MPI across simulated hosts (network + UTS namespaces joined by a bridge).

``netsim.SimulatedHosts`` builds the hosts; ``launcher.sh`` is the ``ssh`` that MPICH's Hydra and
``mpinb info --hosts`` use to reach them. Without root (or where namespaces cannot be made) every
test here is skipped for one stated reason; ``tests/run.py`` then prints that reason in one line.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).parent))  # for ``import netsim``

import netsim

# tests/multihost/ranks/ runs under mpiexec on the simulated hosts (test_multihost.py starts it);
# collected here, its conftest would import mpi4py.MPI into this client process.
collect_ignore = ["ranks"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mine = [item for item in items if Path(str(item.fspath)).parent == Path(__file__).parent]
    reason = netsim.unavailable_reason() if mine else None
    if reason:
        for item in mine:
            item.add_marker(pytest.mark.skip(reason=f"multihost tier: {reason}"))


@pytest.fixture(scope="session")
def sim():
    """Three simulated hosts, host1..host3, for the whole tier; afterwards nothing of them may remain."""
    hosts = netsim.SimulatedHosts(3)
    ipython_dir = tempfile.mkdtemp(prefix="mpinb-test-ipython-")
    saved = {var: os.environ.get(var) for var in ("MPINB_SIMHOSTS", "IPYTHONDIR", "IPP_NONINTERACTIVE")}
    try:
        with hosts:
            # For the launcher wrapper in the processes this test process starts (mpiexec directly
            # or through ipyparallel); and a private IPYTHONDIR, read when ipyparallel builds profile
            # paths, so no test touches the user's profiles.
            os.environ.update(**hosts.env(), IPYTHONDIR=ipython_dir, IPP_NONINTERACTIVE="1")
            yield hosts
    finally:
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value
        shutil.rmtree(ipython_dir, ignore_errors=True)
    left = hosts.leftovers()
    assert not left, f"the simulated hosts left behind: {left}"


@pytest.fixture
def mpi_env(sim) -> dict[str, str]:
    """Environment for ranks on the simulated hosts: one thread each, MPICH yielding, UCX over TCP."""
    from mpinb.client.launch import mpi_env as base_env

    env = base_env(3, threads_per_rank=1, base=os.environ)
    return {**env, **netsim.YIELD, **netsim.TCP["ucx"], **sim.env()}


@pytest.fixture(autouse=True, scope="module")
def no_process_left_behind():
    """After the module, no mpiexec, proxy, engine or controller of ours may still run."""
    yield
    tags = ("mpiexec", "hydra_pmi_proxy", "ipyparallel", "mpinb.client._watchdog", "nsenter", "mpi4py")
    left = []
    for proc in psutil.Process().children(recursive=True):
        if proc.pid in netsim.HOLDERS:  # the session's hosts: ended by the sim fixture
            continue
        try:
            if any(tag in " ".join(proc.cmdline()) for tag in tags):
                left.append(proc)
        except psutil.Error:
            continue
    _, alive = psutil.wait_procs(left, timeout=10)
    for proc in alive:
        proc.kill()
    assert not alive, f"processes left running: {[p.pid for p in alive]}"
