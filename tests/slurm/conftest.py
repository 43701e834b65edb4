"""The slurm tier: a real Slurm (munged, slurmctld, a slurmd per simulated host) for the session.

Needs root (network namespaces, Slurm's daemons) and Debian's Slurm packages; without them every
test here skips with one reason, which ``tests/run.py`` prints in one line.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from support import (
    netsim,  # noqa: E402
    slurmsim,  # noqa: E402
)

NODES = 3


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "loses_a_node: the test leaves a Slurm node lost; it runs after the others")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    netsim.skip_tier_unless(items, Path(__file__).parent, "slurm", slurmsim.unavailable_reason)
    # The tests that lose a node run last, in file order (the node-loss test, then the one that
    # boots the node again): the others need every node.
    items.sort(key=lambda item: item.get_closest_marker("loses_a_node") is not None)


@pytest.fixture(scope="session")
def slurm():
    """Slurm nodes host1..host3 for the whole tier; its commands find it through os.environ. Afterwards
    nothing of it (daemons, hosts, files) may remain."""
    cluster = slurmsim.SlurmCluster(NODES)
    try:
        cluster.start()
        with netsim.session_environment(cluster.env()):
            yield cluster
    finally:
        cluster.stop()
    left = cluster.leftovers()
    assert not left, f"the Slurm cluster left behind: {left}"


@pytest.fixture(autouse=True)
def no_job_left_behind(request):
    """After each test that used the cluster, Slurm runs no job of it any more."""
    yield
    if "slurm" in request.fixturenames:
        cluster = request.getfixturevalue("slurm")
        left = cluster.jobs()
        for line in left:
            cluster.run(["scancel", line.split()[0]])
        assert not [j for j in left if " COMPLETING " not in f" {j} "], f"jobs left in Slurm: {left}"


@pytest.fixture(autouse=True, scope="module")
def no_process_left_behind():
    """After the module, no engine, controller, srun or watchdog of ours may still run (the session's
    daemons aside: the slurm fixture ends them)."""
    yield
    alive = netsim.processes_left(("ipyparallel", "mpinb.client._watchdog", "srun", "salloc", "sbatch", "mpi4py"),
                                  keep=set(slurmsim.DAEMON_PIDS))
    assert not alive, f"processes left running: {alive}"
