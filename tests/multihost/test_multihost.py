"""mpinb across hosts, simulated on one machine (see conftest.py and netsim.py).

Each simulated host is a network + UTS namespace with its own hostname and address on a private
bridge; MPICH's Hydra reaches them through ``launcher.sh`` as it would reach machines through ssh,
and MPI between hosts goes over TCP across the bridge. This process stays in the root namespace and
plays the notebook: it starts an MPICluster whose engines run on the hosts.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from support import netsim
from support.netsim import TCP, YIELD

HERE = Path(__file__).parent
RANKS_TESTS = HERE / "ranks" / "test_across_hosts.py"
MiB = 1 << 20


def test_hosts_are_separate_machines(sim):
    for host in sim.hosts:
        name = host.run(["hostname"]).stdout.strip()
        links = host.run(["ip", "-o", "-4", "addr"]).stdout
        assert name == host.name
        # Only its loopback and its own address on the bridge; nothing of the root namespace.
        assert sorted(re.findall(r"inet (\S+)/", links)) == sorted(["127.0.0.1", host.address])
        routes = host.run(["ip", "-4", "route"]).stdout.splitlines()
        assert [r.split()[0] for r in routes] == [str(sim.subnet)]  # the bridge's subnet; no default route


@pytest.mark.parametrize("netmod", ["ucx", "ofi"])
def test_mpi_traffic_crosses_the_bridge(sim, mpi_env, netmod, tmp_path):
    code = (
        "import socket, numpy as np; from mpi4py import MPI; c = MPI.COMM_WORLD;"
        "a = np.full(1 << 20, c.rank + 1.0); c.Allreduce(MPI.IN_PLACE, a);"
        "rows = c.gather((c.rank, c.size, socket.gethostname(), a.min(), a.max()));"
        "c.rank == 0 and print('\\n'.join('RANK %d %d %s %s %s' % row for row in rows), flush=True)"
    )  # printed by rank 0 alone: lines from ranks sharing a proxy can interleave mid-line
    before = sim.bridge_bytes()
    proc = sim.mpiexec({"host1": 2, "host2": 1}, [sys.executable, "-m", "mpi4py", "-c", code],
                       env={**mpi_env, **TCP[netmod]}, timeout=60, hostfile=tmp_path / "hosts")
    after = sim.bridge_bytes()
    assert proc.returncode == 0, proc.stdout[-3000:]
    ranks = sorted((int(r), int(s), h, float(lo), float(hi))
                   for r, s, h, lo, hi in re.findall(r"RANK (\d+) (\d+) (\S+) (\S+) (\S+)", proc.stdout))
    assert [(r, s, h) for r, s, h, _, _ in ranks] == [(0, 3, "host1"), (1, 3, "host1"), (2, 3, "host2")]
    assert all(lo == hi == 6.0 for *_, lo, hi in ranks)  # 1 + 2 + 3
    sent = {name: after[name] - before[name] for name in after}
    print(f"{netmod}: bytes each host sent into the bridge: {sent}")
    # 8 MiB reduced between host1's ranks and host2's: megabytes each way through the bridge (UCX
    # left to itself moves them through shared memory and the bridge sees a few KiB of start-up).
    assert sent["host1"] > 4 * MiB and sent["host2"] > 4 * MiB, f"bytes sent into the bridge: {sent}"
    assert sent["host3"] < MiB, f"host3 has no rank but sent {sent['host3']} bytes"


def test_mpinb_across_hosts_matches_one_host(sim, mpi_env, tmp_path):
    """KMeans, keras.fit, limit_threads and world() on 3 ranks over 2 hosts (tests/multihost/ranks)."""
    env = {**mpi_env, "MPINB_TEST_TIER": "multihost-ranks",
           "MPINB_MULTIHOST_EXPECT": json.dumps(["host1", "host1", "host2"])}
    before = sim.bridge_bytes()
    proc = sim.mpiexec(
        {"host1": 2, "host2": 1},
        [sys.executable, "-m", "mpi4py", "-m", "pytest", str(RANKS_TESTS), "-q", "-x", "-p", "no:cacheprovider",
         "--timeout=120", "--timeout-method=thread", "--durations=4"],
        env=env, timeout=150, hostfile=tmp_path / "hosts",
    )
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-5000:]
    assert re.search(r"\b4 passed\b", proc.stdout), proc.stdout[-2000:]
    assert sim.bridge_bytes()["host2"] > before["host2"]


def test_cluster_gathers_from_every_host_in_rank_order(sim, tmp_path):
    import mpinb

    # Rank 0 on host3, ranks 1-2 on host1: rank order is neither engine-id nor hostname order.
    hostfile = sim.hostfile({"host3": 1, "host1": 2}, tmp_path / "hosts")
    with mpinb.MPICluster(n=3, mpi_args=sim.mpi_args(hostfile), controller_ip=sim.gateway,
                          env={**TCP["ucx"], **YIELD, **sim.env()}, threads_per_rank=1, timeout=90) as cluster, \
            _shared_memory_removed(cluster):
        cluster.view.execute(
            "import os, socket, numpy as np, mpinb\n"
            "host, pid = socket.gethostname(), os.getpid()\n"
            "threads = mpinb.limit_threads()\n"
            "w = mpinb.world()\n"
            "rows = np.full(w.rank + 1, w.rank)\n"
            "total = mpinb.allreduce([np.float64(w.rank + 1)])[0]\n"
        )
        assert cluster.pull("host") == ["host3", "host1", "host1"]
        assert [w.local_size for w in cluster.pull("w")] == [1, 2, 2]
        cores = len(os.sched_getaffinity(0))
        assert cluster.pull("threads") == [cores, max(1, cores // 2), max(1, cores // 2)]
        np.testing.assert_array_equal(cluster.gather("rows"), [0, 1, 1, 2, 2, 2])
        assert cluster.pull("total") == [6.0, 6.0, 6.0]
        # Rank 1 (host1) raises before an allreduce that rank 2 (host1: the board tells it) and rank 0
        # (host3: a notice across the bridge tells it) wait in, with no deadline: both stop at once.
        ar = cluster.view.execute(
            "import time\ncaught = None\nbegan = time.monotonic()\n"
            "try:\n"
            "    if w.rank == 1:\n        1 / 0\n"
            "    mpinb.allreduce([1])\n"
            "except mpinb.CollectiveAbandoned as err:\n    caught = (str(err), time.monotonic() - began)\n",
            block=False,
        )
        ar.wait(timeout=30)
        assert ar.ready(), "the ranks waiting for rank 1 did not stop"
        caught = cluster.pull("caught")
        for rank in (0, 2):
            message, waited = caught[rank]
            assert "rank 1 ended its cell (raised ZeroDivisionError: division by zero)" in message, message
            assert waited < 1.0, f"rank {rank} waited {waited:.2f} s"
        cluster.view.execute("total = mpinb.allreduce([np.float64(w.rank + 1)])[0]")
        assert cluster.pull("total") == [6.0, 6.0, 6.0]
        pids = cluster.pull("pid")
        # Each engine really runs inside its host's network namespace.
        assert [_netns_of(pid) for pid in pids] == [sim.hosts_by_name[h].netns for h in ("host3", "host1", "host1")]
    # ... and is gone with the cluster.
    assert not [pid for pid in pids if Path(f"/proc/{pid}").exists()]


def test_cluster_engines_share_each_hosts_cores(sim, tmp_path):
    """MPICluster's own thread budget ("auto"): each host's cores shared among that host's ranks,
    decided on the engines, which know their host; the launcher here cannot know where ranks land.
    And interrupt() reaches engines on other hosts."""
    import mpinb

    hostfile = sim.hostfile({"host1": 1, "host2": 2}, tmp_path / "hosts")
    with mpinb.MPICluster(n=3, mpi_args=sim.mpi_args(hostfile), controller_ip=sim.gateway,
                          env={**TCP["ucx"], **YIELD, **sim.env()}, timeout=90) as cluster, \
            _shared_memory_removed(cluster):
        cluster.view.execute(
            "import os, socket, numpy, mpinb.comm\n"
            "from threadpoolctl import threadpool_info\n"
            "host, cores = socket.gethostname(), len(os.sched_getaffinity(0))\n"
            "budget = {v: os.environ.get(v)\n"
            "          for v in ('OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS', 'TF_NUM_INTRAOP_THREADS')}\n"
            "pools = [p['num_threads'] for p in threadpool_info()]\n"
            "chosen = mpinb.comm.threads_chosen()\n"
        )
        hosts, cores = cluster.pull("host"), cluster.pull("cores")
        assert hosts == ["host1", "host2", "host2"]
        # host1's one rank gets all its cores, host2's two ranks half each (1 each on 2 cores).
        expected = [max(1, cores[r] // hosts.count(hosts[r])) for r in range(3)]
        assert cores[0] < 2 or expected[0] > expected[1], f"cores {cores}: the test cannot tell the hosts apart"
        assert cluster.pull("budget") == [dict.fromkeys(("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                          "TF_NUM_INTRAOP_THREADS"), str(e)) for e in expected]
        pools_by_rank = cluster.pull("pools")
        assert all(n <= e for pools, e in zip(pools_by_rank, expected, strict=True) for n in pools), pools_by_rank
        assert cluster.pull("chosen") == [True, True, True]  # keras.fit keeps it
        # Engines on other hosts (by hostname) get interrupt()'s SIGINT through their nannies.
        ar = cluster.view.execute("import time\ntry:\n    time.sleep(60)\n    stopped = False\n"
                                  "except KeyboardInterrupt:\n    stopped = True\n", block=False)
        time.sleep(1.0)
        cluster.interrupt()
        ar.wait(timeout=20)
        assert ar.ready(), "interrupt() did not reach the engines on the simulated hosts"
        assert cluster.pull("stopped") == [True, True, True]


def test_info_lists_reachable_hosts(sim, mpi_env, tmp_path):
    hostfile = sim.hostfile({"host1": 2, "host2": 1}, tmp_path / "hosts")  # by address, as MPICH reads it
    proc = _mpinb_info(sim, ["--hostfile", str(hostfile), "--controller-ip", sim.gateway], mpi_env)
    assert proc.returncode == 0, proc.stdout
    one, two = (re.escape(sim.hosts_by_name[h].address) for h in ("host1", "host2"))
    assert f"Pre-flight for 2 host(s) through {sim.launcher}, controller address {sim.gateway}:" in proc.stdout
    launcher = re.escape(Path(sim.launcher).name)
    assert re.search(rf"ok +{one}: reached with {launcher} .*hostname host1.*reaches " + re.escape(sim.gateway),
                     proc.stdout)
    assert re.search(rf"ok +{two}: reached .*hostname host2", proc.stdout)
    assert re.search(r"ok +controller address " + re.escape(sim.gateway) + r": assigned to " + sim.uplink, proc.stdout)
    assert re.search(r"ok +3 MPI ranks across 2 host\(s\): one world of 3 \(host1: ranks 0-1, host2: rank 2\)",
                     proc.stdout)
    assert "4 of 4 pre-flight checks passed." in proc.stdout


def test_info_names_an_unreachable_host_and_controller(sim, mpi_env):
    missing = str(sim.subnet[99])  # on the bridge's subnet, but no host has it
    proc = _mpinb_info(sim, ["--hosts", f"host1,{missing}", "--controller-ip", "127.0.0.1", "--timeout", "5"], mpi_env)
    assert proc.returncode == 1, proc.stdout
    launcher = re.escape(Path(sim.launcher).name)
    assert re.search(rf"FAIL +{re.escape(missing)}: not reachable with {launcher} \(exit 255\): .*No route to host",
                     proc.stdout)
    assert re.search(r"FAIL +controller address 127\.0\.0\.1: a loopback address .*cannot reach it", proc.stdout)
    # host1 itself is fine, but what it sees at 127.0.0.1 is its own loopback.
    assert re.search(r"FAIL +host1: reached .*hostname host1.*cannot reach the controller address 127\.0\.0\.1",
                     proc.stdout)
    assert "MPI ranks across" not in proc.stdout  # no MPI start while a host is unreachable

    elsewhere = str(sim.subnet[77])
    proc = _mpinb_info(sim, ["--hosts", "host2", "--controller-ip", elsewhere, "--timeout", "5"], mpi_env)
    assert proc.returncode == 1, proc.stdout
    assert re.search(rf"FAIL +controller address {re.escape(elsewhere)}: "
                     r"not assigned to any interface of this machine.*" + re.escape(sim.gateway), proc.stdout)
    assert re.search(r"ok +host2: reached .*hostname host2", proc.stdout)


def test_nothing_is_left_behind():
    """Hosts torn down with a process still running inside one: everything of theirs is gone."""
    with netsim.SimulatedHosts(2) as other:
        assert Path(f"/sys/class/net/{other.uplink}").exists()
        # A process started the way Hydra starts a proxy, and never stopped: a leaked rank.
        stray = subprocess.Popen([other.launcher, "-x", "host2", "exec sleep 600"],
                                 env={**os.environ, **other.env()}, start_new_session=True)
        for _ in range(250):  # until nsenter has entered the host
            if _in_host(stray.pid, other.hosts[1]):
                break
            time.sleep(0.02)
        assert _in_host(stray.pid, other.hosts[1])
        holders = [h.pid for h in other.hosts]
        inodes = {h.netns for h in other.hosts}
    assert stray.wait(timeout=5) == -9
    assert other.leftovers() == []
    assert not Path(f"/sys/class/net/{other.uplink}").exists()
    assert not [pid for pid in holders if Path(f"/proc/{pid}").exists()]
    assert not [pid for pid in _pids() if _netns_of(pid) in inodes]


def test_a_killed_owner_leaves_nothing_behind():
    """SIGKILL the process that built the hosts and started a rank-like process on one (no finalizer
    runs, as when pytest-timeout ends pytest): the holders end that process, and the kernel the rest."""
    code = (
        "import os, subprocess, sys, time; from support import netsim;"
        "s = netsim.SimulatedHosts(2).start();"
        "p = subprocess.Popen([s.launcher, '-x', 'host2', 'exec sleep 600'], env={**os.environ, **s.env()},"
        "                     start_new_session=True);"
        "time.sleep(0.5); print(s.tag, s.uplink, p.pid, *(h.pid for h in s.hosts), flush=True); time.sleep(600)"
    )
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(HERE.parent)})  # tests/, for the support package
    tag = ""
    try:
        tag, uplink, stray, *holders = owner.stdout.readline().split()
        assert Path(f"/sys/class/net/{uplink}").exists() and _alive(int(stray))
    finally:
        owner.kill()
        owner.wait()
        owner.stdout.close()
        if tag:  # a copy of the launcher, where the checkout lost its mode: the kernel cannot know
            for path in Path(tempfile.gettempdir()).glob(f"{tag}-*"):
                path.unlink()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (Path(f"/sys/class/net/{uplink}").exists()
                                           or any(_alive(int(pid)) for pid in [stray, *holders])):
        time.sleep(0.05)
    assert not Path(f"/sys/class/net/{uplink}").exists()
    assert not [pid for pid in [stray, *holders] if _alive(int(pid))]


@contextlib.contextmanager
def _shared_memory_removed(cluster):
    """Remove the engines' MPI segments in /dev/shm at the end. MPICluster.stop() removes those of
    engines on this host only (a PID means nothing on another host); the simulated hosts' engines
    have other hostnames but share this machine's /dev/shm, so their segments are the test's to remove."""
    from mpinb.client._processes import remove_files

    cluster.view.execute("import os\nfrom mpinb.client._processes import shared_memory_of\n"
                         "_shm = sorted(shared_memory_of([os.getpid()]))")
    segments = {path for paths in cluster.pull("_shm") for path in paths}
    try:
        yield
    finally:
        remove_files(segments)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _pids() -> list[int]:
    return [int(e) for e in os.listdir("/proc") if e.isdigit()]


def _netns_of(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def _in_host(pid: int, host: netsim.Host) -> bool:
    return _netns_of(pid) == host.netns


def _mpinb_info(sim, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "mpinb.client.cli", "info", "--launcher-exec", sim.launcher, *args]
    proc = subprocess.run(cmd, env=env, check=False, capture_output=True, text=True, timeout=120)
    print(proc.stdout, proc.stderr)
    return proc
