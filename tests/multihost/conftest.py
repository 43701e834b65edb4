"""The multihost tier: MPI across simulated hosts (network + UTS namespaces joined by a bridge).

``netsim.SimulatedHosts`` builds the hosts; ``launcher.sh`` is the ``ssh`` that MPICH's Hydra and
``mpinb info --hosts`` use to reach them. Without root (or where namespaces cannot be made) every
test here is skipped for one stated reason; ``tests/run.py`` then prints that reason in one line.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from support import netsim

# tests/multihost/ranks/ runs under mpiexec on the simulated hosts (test_multihost.py starts it);
# collected here, its conftest would import mpi4py.MPI into this client process.
collect_ignore = ["ranks"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    netsim.skip_tier_unless(items, Path(__file__).parent, "multihost", netsim.unavailable_reason)


@pytest.fixture(scope="session")
def sim():
    """Three simulated hosts, host1..host3, for the whole tier; afterwards nothing of them may remain."""
    before = netsim.mpi_leftovers()
    hosts = netsim.SimulatedHosts(3)
    # The host map, for the launcher wrapper in the processes this test process starts (mpiexec
    # directly or through ipyparallel).
    with hosts, netsim.session_environment(hosts.env()):
        yield hosts
    # Ranks and Hydra proxies on the simulated hosts end with their hosts, before MPI finalizes.
    netsim.remove_orphans(before)
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
    alive = netsim.processes_left(tags)
    assert not alive, f"processes left running: {alive}"
