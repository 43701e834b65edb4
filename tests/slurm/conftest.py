"""The slurm tier: a real Slurm (munged, slurmctld, a slurmd per simulated host) for the session.

Needs root (network namespaces, Slurm's daemons) and Debian's Slurm packages; without them every
test here skips with one reason, which ``tests/run.py`` prints in one line.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).parent))  # for ``import slurmsim``

import slurmsim  # noqa: E402  (first: it puts tests/multihost on the path, for netsim)

import netsim  # noqa: E402

NODES = 3


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mine = [item for item in items if Path(str(item.fspath)).parent == Path(__file__).parent]
    reason = slurmsim.unavailable_reason() if mine else None
    if reason:
        for item in mine:
            item.add_marker(pytest.mark.skip(reason=f"slurm tier: {reason}"))


@pytest.fixture(scope="session")
def slurm():
    """Slurm nodes host1..host3 for the whole tier; its commands find it through os.environ. Afterwards
    nothing of it (daemons, hosts, files) may remain."""
    cluster = slurmsim.SlurmCluster(NODES)
    ipython_dir = tempfile.mkdtemp(prefix="mpinb-test-ipython-")
    names = ("SLURM_CONF", "MPINB_SIMHOSTS", "IPYTHONDIR", "IPP_NONINTERACTIVE", "PATH")
    saved = {var: os.environ.get(var) for var in names}
    try:
        with cluster:
            os.environ.update(**cluster.env(), IPYTHONDIR=ipython_dir, IPP_NONINTERACTIVE="1")
            yield cluster
    finally:
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value
        shutil.rmtree(ipython_dir, ignore_errors=True)
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
    """After the module, no engine, controller, srun or watchdog of ours may still run."""
    yield
    tags = ("ipyparallel", "mpinb.client._watchdog", "srun", "salloc", "sbatch", "mpi4py")
    left = []
    for proc in psutil.Process().children(recursive=True):
        if proc.pid in netsim.HOLDERS:
            continue
        try:
            cmd = proc.cmdline()
            if cmd and Path(cmd[0]).name in slurmsim.DAEMONS[:3]:
                continue  # the session's daemons: ended by the slurm fixture
            if any(tag in " ".join(cmd) for tag in tags):
                left.append(proc)
        except psutil.Error:
            continue
    _, alive = psutil.wait_procs(left, timeout=10)
    for proc in alive:
        proc.kill()
    assert not alive, f"processes left running: {[p.pid for p in alive]}"
