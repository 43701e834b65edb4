"""A cluster MPICluster started ends with its owner, however the owner ends; a clean stop ends the watchdog."""

from __future__ import annotations

import glob
import json
import os
import select
import signal
import subprocess
import sys
import time

import psutil

from mpinb.client.cluster import MPICluster

OWNER = """
import json, time
from mpinb.client.cluster import MPICluster
cluster = MPICluster(n=2)
cluster.restart()
print(json.dumps({"cluster": cluster._tracked_pids(), "watchdog": cluster._watchdog.process.pid,
                  "leftovers": sorted(cluster._path.leftovers)}), flush=True)
time.sleep(600)
"""


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_cluster_ends_within_10_s_of_its_owner_being_killed_and_leaves_no_file(tmp_path):
    log = open(tmp_path / "owner.log", "w")
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        ready, _, _ = select.select([owner.stdout], [], [], 180)
        assert ready, f"the owner never reported its cluster: {(tmp_path / 'owner.log').read_text()[-2000:]}"
        info = json.loads(owner.stdout.readline())
        cluster = info["cluster"]
        procs = [psutil.Process(p) for p in cluster]
        kinds = [(p.name(), " ".join(p.cmdline())) for p in procs]
        # The controller, mpiexec (with its proxy) and both engines are all being watched.
        engines = [c for name, c in kinds if name.startswith("python") and "nanny" not in c
                   and ("ipyparallel.engine" in c or "mpinb._engine_boot" in c)]
        assert len(engines) == 2, kinds
        assert any("ipyparallel.controller" in c for _, c in kinds) and any("mpiexec" in n for n, _ in kinds), kinds
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        t0 = time.monotonic()
        left = cluster + [info["watchdog"]]
        while time.monotonic() - t0 < 10 and not all(gone(p) for p in left):
            time.sleep(0.1)
        alive = [p for p in left if not gone(p)]
        assert not alive, f"still running 10 s after the owner's SIGKILL: {alive}"
        # What the killed world left (MPI's shared memory, Hydra's topology file, the engines'
        # temporary folder): the watchdog removed it too.
        leftovers = info["leftovers"]
        assert any(p.startswith("/dev/shm/mpich_shm_") for p in leftovers), leftovers
        assert any("hydra_hwloc_xmlfile_" in p for p in leftovers), leftovers
        assert any(os.path.basename(p).startswith("mpinb-engines-") for p in leftovers), leftovers
        # ...and the cluster's own files in the profile (logs, engines<id>.json, cluster and
        # connection files), which ipyparallel removes only on a clean stop, if at all.
        assert any(p.endswith(os.path.join("log", "*")) or "/log/*" in p for p in leftovers), leftovers
        assert not [p for pattern in leftovers for p in glob.glob(pattern)]
        # Starting and restarting printed nothing (it once printed runpy's warning about the watchdog).
        assert (tmp_path / "owner.log").read_text() == ""
    finally:
        if owner.poll() is None:
            owner.kill()
        for pid in (info["cluster"] if "info" in locals() else []):
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
        log.close()


def test_a_clean_stop_ends_the_watchdog_and_a_joined_cluster_has_none():
    cluster = MPICluster(n=1)
    try:
        watchdog = cluster._watchdog.process
        assert watchdog.poll() is None
    finally:
        cluster.stop()
    assert watchdog.wait(timeout=10) == 0
    assert cluster._watchdog is None
