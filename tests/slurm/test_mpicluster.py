"""MPICluster(launcher="slurm") on a real Slurm: a batch job from outside an allocation, an srun step
inside one, owned (stop, restart, a killed owner leave no job), the controller on the bridge."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from support.netsim import TCP, YIELD

ENGINE_ENV = {**TCP["ucx"], **YIELD}
KMEANS = (
    "import socket, numpy as np, mpinb, mpinb.data\n"
    "from mpi4py import MPI\n"
    "host = socket.gethostname()\n"
    "w = mpinb.world()\n"
    "X, _ = mpinb.data.make_blobs(1500, 3, centers=4, random_state=5)\n"
    "fitted = mpinb.KMeans(4, random_state=0, n_init=1).fit(X)\n"
    "X_all, _ = mpinb.data.make_blobs(1500, 3, centers=4, random_state=5, shard=False)\n"
    "one = mpinb.KMeans(4, random_state=0, n_init=1, comm=MPI.COMM_SELF).fit(X_all)\n"
    "same = bool(np.allclose(fitted.cluster_centers_, one.cluster_centers_, rtol=1e-10, atol=1e-12))\n"
    "labels = fitted.labels_\n"
)


def start(n=3, **kwargs):
    import mpinb

    return mpinb.MPICluster(n, launcher="slurm", env=ENGINE_ENV, threads_per_rank=1, timeout=120, **kwargs)


def check_world(cluster, slurm, hosts) -> None:
    cluster.view.execute(KMEANS)
    assert cluster.pull("host") == hosts
    assert [w.size for w in cluster.pull("w")] == [len(hosts)] * len(hosts)
    assert cluster.pull("same") == [True] * len(hosts)  # KMeans over 2 nodes == one process
    one = cluster.pull("one")[0]
    np.testing.assert_array_equal(cluster.gather("labels"), one.labels_)
    assert f"controller={slurm.sim.gateway}>" in repr(cluster)  # the bridge, never loopback


def scripts() -> list[Path]:
    """The batch scripts of this process's clusters still on disk."""
    return list(Path(tempfile.gettempdir()).glob(f"mpinb-sbatch-*/mpinb-{os.getpid()}-*.sbatch"))


def check_hosts(cluster, hosts) -> None:
    """One world, ranks in order on the nodes ``hosts`` names (cheaper than check_world: no KMeans)."""
    cluster.view.execute("import mpinb, socket; host, size = socket.gethostname(), mpinb.world().size")
    assert cluster.pull("host") == hosts and cluster.pull("size") == [len(hosts)] * len(hosts)


def test_batch_job_from_outside_an_allocation_then_restart(slurm):
    assert "SLURM_JOB_ID" not in os.environ
    cluster = start(launcher_args=["--partition=debug", "--time=10"])
    try:
        job = re.search(r"slurm job (\d+) --mpi=pmi2", repr(cluster)).group(1)
        assert [j.split()[:2] for j in slurm.jobs()] == [[job, "RUNNING"]]
        assert slurm.run(["squeue", "-h", "-j", job, "-o", "%j %P %l"]).stdout.split() == [
            cluster._path.slurm.job_name, "debug", "10:00"]
        # Three ranks on nodes of 2 CPUs: Slurm fills host1, then host2.
        check_world(cluster, slurm, ["host1", "host1", "host2"])

        cluster.restart()
        again = re.search(r"slurm job (\d+)", repr(cluster)).group(1)
        assert again != job and [j.split()[:2] for j in slurm.jobs()] == [[again, "RUNNING"]]
        check_hosts(cluster, ["host1", "host1", "host2"])
        # The batch script is gone once submitted: not in the notebook's folder, not in /tmp.
        assert not list(Path.cwd().glob("*.sbatch")) and not scripts()
    finally:
        cluster.stop()
    assert slurm.jobs() == []  # stop() waited until Slurm had ended the job


def test_srun_step_inside_an_allocation(slurm, monkeypatch):
    granted = slurm.run(["salloc", "--no-shell", "-N", "2", "-n", "2"], timeout=60)
    job = re.search(r"Granted job allocation (\d+)", granted.stderr + granted.stdout).group(1)
    try:
        nodes = slurm.run(["squeue", "-h", "-j", job, "-o", "%N"]).stdout.strip()
        # What salloc (or a batch spawner) puts in the environment of the notebook it starts.
        monkeypatch.setenv("SLURM_JOB_ID", job)
        monkeypatch.setenv("SLURM_JOB_NODELIST", nodes)
        cluster = start(2)
        try:
            assert re.search(rf"slurm step {job}\.\d+ --mpi=pmi2", repr(cluster)), repr(cluster)
            check_hosts(cluster, ["host1", "host2"])  # one task on each node of the allocation
            assert f"controller={slurm.sim.gateway}>" in repr(cluster)
            # Ctrl-C on every rank: srun would keep a single SIGINT to itself; Slurm signals the step.
            ar = cluster.view.execute("import time\ntry:\n    time.sleep(60)\n    how = 'slept'\n"
                                      "except KeyboardInterrupt:\n    how = 'interrupted'\n", block=False)
            time.sleep(1.0)
            cluster.interrupt()
            ar.wait(timeout=20)
            assert ar.ready() and cluster.pull("how") == ["interrupted", "interrupted"]
            step = re.search(r"slurm step (\S+)", repr(cluster)).group(1)
            cluster.restart()  # a fresh step in the same allocation
            again = re.search(r"slurm step (\S+)", repr(cluster)).group(1)
            assert again != step and again.startswith(f"{job}.")
            check_hosts(cluster, ["host1", "host2"])
        finally:
            cluster.stop()
        # The step ended with the cluster; the allocation is the user's and stays.
        assert slurm.run(["squeue", "-h", "-s", "-j", job, "-o", "%i"]).stdout.split() in ([], [f"{job}.extern"])
        assert [j.split()[:2] for j in slurm.jobs()] == [[job, "RUNNING"]]
    finally:
        slurm.run(["scancel", job])
        deadline = time.monotonic() + 15
        while slurm.jobs() and time.monotonic() < deadline:
            time.sleep(0.2)


OWNER = """
import sys, time, mpinb
from support.netsim import TCP, YIELD
cluster = mpinb.MPICluster(2, launcher="slurm", env={**TCP["ucx"], **YIELD}, threads_per_rank=1, timeout=90)
print("JOB", cluster._path.slurm.job, flush=True)
time.sleep(600)
"""


def test_killed_owner_leaves_no_job(slurm):
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        line = owner.stdout.readline()
        job = line.split()[1] if line.startswith("JOB ") else pytest.fail(f"the owner said {line!r}")
        assert [j.split()[:2] for j in slurm.jobs()] == [[job, "RUNNING"]]
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        t0 = time.monotonic()
        while slurm.jobs() and time.monotonic() - t0 < 15:
            time.sleep(0.2)
        assert slurm.jobs() == [], f"job {job} still there {time.monotonic() - t0:.0f} s after its owner died"
    finally:
        owner.kill()
        owner.wait()
        owner.stdout.close()


def test_a_pmi_that_does_not_work_is_reported_at_once(slurm):
    """Debian's pmix plugin does not load here: the batch job fails, and start() says so without
    waiting out its timeout."""
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"the engines' batch job \d+ ended before they registered \(--mpi=pmix; "
                                           r"`srun --mpi=list` shows .*\): .*pmix"):
        start(1, launcher_args=["--mpi=pmix"])
    assert time.monotonic() - t0 < 30
    assert not scripts()

