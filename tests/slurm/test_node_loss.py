"""A Slurm node lost mid-cell (its slurmd, slurmstepd and tasks SIGKILLed, as a crash looks to the
others): deaths() names its ranks first and says what became of the rest, restart() moves to the
nodes Slurm still has without waiting on the lost job, and a job Slurm cannot start is reported
as queued, with squeue's reason; then the node boots again and the first srun that spans it works."""

from __future__ import annotations

import re
import sys
import time

import pytest
from test_mpicluster import check_hosts, start
from test_slurm import DENSE_HEAP

from mpinb.client.slurm import pmi_relay

LOOP = ("import time, numpy as np, mpinb\n"
        "for _ in range(2000):\n"
        "    mpinb.allreduce(np.ones(3))\n"
        "    time.sleep(0.02)\n")


@pytest.mark.loses_a_node
def test_a_node_lost_mid_cell(slurm, capsys):
    cluster = start(4, launcher_args=["--time=10"])
    lost_job = re.search(r"slurm job (\d+)", repr(cluster)).group(1)
    try:
        check_hosts(cluster, ["host1", "host1", "host2", "host2"])  # two ranks on each node of 2 CPUs
        running = cluster.view.execute(LOOP, block=False)
        time.sleep(1.0)
        slurm.lose_node("host2")
        said = None
        for _ in range(100):  # the probe answers at once: a few looks at most, then a bound
            said = cluster.deaths()
            if said and "host2" in said:
                break
            time.sleep(0.1)
        assert said is not None and said.startswith(
            "ranks 2-3 (host2) were lost with their node: its slurmd does not answer (Slurm says allocated"), said
        # Ranks 0-1 either still live or ended after (MPI ends a world that lost ranks; srun says how);
        # never "died first", never "ended the other ranks with it".
        assert re.search(r"; (then ranks 0-1 \(host1\) ended \(.+\), as MPI ends a world that lost ranks|"
                         r"ranks 0-1 are alive)", said), said
        assert "MPI ended the other ranks with it" not in said
        assert not cluster.healthy(timeout=2)
        cluster.client.abort(running.msg_ids)

        capsys.readouterr()
        cluster.restart(timeout=90)
        # scancel leaves the lost job COMPLETING until slurmctld declares host2 down: restart() says so
        # and goes on at once, on the nodes that answer.
        assert f"mpinb: Slurm job {lost_job} is cancelled; Slurm lists it COMPLETING until it declares host2 down" \
            in capsys.readouterr().err
        check_hosts(cluster, ["host1", "host1", "host3", "host3"])
        assert not [j for j in slurm.jobs() if j.startswith(f"{lost_job} ") and " COMPLETING " not in f" {j} "]

        # Six more ranks need three free nodes: the job waits in the queue, and the error says why.
        with pytest.raises(TimeoutError, match=r"Slurm job \d+ was still queued after 5 s: PENDING \(\w+"):
            _start_queued(6, 5)
        assert "is queued: PENDING (" in capsys.readouterr().err
    finally:
        cluster.stop()  # host2 stays lost until the next test boots it again (see conftest.py)


@pytest.mark.loses_a_node
def test_first_srun_across_a_node_that_came_back(slurm):
    """host2, lost by the test before (its slurmd, stepd and tasks SIGKILLed), boots again: the first
    srun --mpi=pmi2 that spans it, as mpinb starts ranks, is one world (with the heap that overflows
    Slurm's PMI read without mpinb's relay, see test_slurm.py)."""
    slurm.restore_node("host2")
    proc = slurm.run(["srun", "-N", "3", "-n", "3", "--mpi=pmi2", *pmi_relay("pmi2"), sys.executable, "-m",
                      "mpi4py.bench", "helloworld"], env=DENSE_HEAP, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "mpi/pmi2" not in proc.stderr, proc.stderr
    seen = sorted(re.findall(r"I am process (\d+) of (\d+) on (\S+)\.", proc.stdout))
    assert seen == [("0", "3", "host1"), ("1", "3", "host2"), ("2", "3", "host3")]


def _start_queued(n: int, timeout: float) -> None:
    from test_mpicluster import ENGINE_ENV

    import mpinb

    mpinb.MPICluster(n, launcher="slurm", env=ENGINE_ENV, threads_per_rank=1, timeout=timeout)
