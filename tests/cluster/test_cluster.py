"""MPICluster against real MPI engines: start, rank order, health, restart, stop without leaks."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from conftest import LATE_OUTPUT_ENGINE, PERMUTED_ENGINE

import mpinb


@pytest.fixture(scope="module")
def cluster2():
    with mpinb.MPICluster(n=2) as cluster:
        yield cluster


def test_engines_form_one_world_ordered_by_rank(cluster2) -> None:
    cluster2.view.execute("import mpinb; w = mpinb.world(); rank, size = w.rank, w.size")
    assert cluster2.pull("rank") == [0, 1]
    assert cluster2.pull("size") == [2, 2]
    assert cluster2.pull_root("rank") == 0
    assert len(cluster2.ids_by_rank) == 2


def test_each_rank_reports_its_device(cluster2) -> None:
    # No GPU on the test machines: every rank chose the CPU, and the repr says so in one word.
    cluster2.view.execute("from mpinb import gpus; mine = gpus.device()")
    assert cluster2.devices == cluster2.pull("mine") == ["CPU", "CPU"]
    assert " devices=CPU" in repr(cluster2), repr(cluster2)


def test_engines_get_a_thread_budget_and_yield_settings(cluster2) -> None:
    cluster2.view.execute("import os; "
                          "env = {k: os.environ.get(k) for k in ('OMP_NUM_THREADS', 'TF_NUM_INTRAOP_THREADS')}")
    cores = len(os.sched_getaffinity(0))
    budget = str(max(1, cores // 2))
    assert cluster2.pull("env") == [{"OMP_NUM_THREADS": budget, "TF_NUM_INTRAOP_THREADS": budget}] * 2


def test_gather_and_scatter_round_trip(cluster2) -> None:
    data = np.arange(14.0).reshape(7, 2)
    cluster2.scatter("part", data)
    np.testing.assert_array_equal(cluster2.gather("part"), data)
    assert [len(p) for p in cluster2.pull("part")] == [4, 3]
    cluster2.view.execute("items = [rank] * (rank + 1)")
    assert cluster2.gather("items") == [0, 1, 1]


def test_controller_listens_on_loopback_only(cluster2) -> None:
    info = cluster2.cluster.controller.get_connection_info()
    info = info if isinstance(info, dict) else None
    client_info = cluster2.client._config if hasattr(cluster2.client, "_config") else {}
    urls = json.dumps(client_info) + json.dumps(info or {}, default=str)
    assert "127.0.0.1" in urls
    controller = psutil.Process(cluster2.cluster.controller.pid)
    for proc in [controller, *controller.children(recursive=True)]:
        for conn in proc.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN:
                assert conn.laddr.ip == "127.0.0.1", f"controller listens on {conn.laddr}"


def test_a_one_machine_cluster_listens_on_loopback_and_keeps_its_files_private(cluster2) -> None:
    engines = [psutil.Process(pid) for pid in cluster2._engine_pids]
    for proc in engines:
        listening = [c.laddr for c in proc.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
        assert listening and all(addr.ip in ("127.0.0.1", "::1") for addr in listening), (proc.pid, listening)
    # The other processes of the cluster (the controller's tree; mpiexec and its proxy, the engines'
    # ancestors below this process) listen on loopback too, all but Hydra's control port, which Hydra
    # binds to every address whatever its options (see mpinb._listeners)...
    ancestors = {a for proc in engines for a in proc.parents() if os.getpid() in {p.pid for p in a.parents()}}
    controller = psutil.Process(cluster2.cluster.controller.pid)
    wide: dict[tuple[str, int], set[str]] = {}
    for proc in ancestors | {controller, *controller.children(recursive=True)}:
        for c in proc.net_connections(kind="inet"):
            if c.status == psutil.CONN_LISTEN and c.laddr.ip not in ("127.0.0.1", "::1"):
                wide.setdefault((c.laddr.ip, c.laddr.port), set()).add(proc.name())
    (((ip, port), holders),) = wide.items()
    assert ip == "0.0.0.0" and "hydra_pmi_proxy" in holders, wide
    assert holders <= {"mpiexec", "mpiexec.hydra", "hydra_pmi_proxy"}, wide
    # ...and that port answers loopback alone (the engines attached a filter to it): from any other
    # address of this machine a connection gets no answer, as behind a firewall's DROP.
    outside = [a.address for addrs in psutil.net_if_addrs().values() for a in addrs
               if a.family == socket.AF_INET and not a.address.startswith("127.")]
    for address in outside:
        with socket.socket() as probe:
            probe.settimeout(1.0)
            with pytest.raises(TimeoutError):
                probe.connect((address, port))
    security = Path(cluster2.cluster.profile_dir) / "security"
    assert security.stat().st_mode & 0o777 == 0o700
    assert {p.name: p.stat().st_mode & 0o777 for p in security.iterdir()} == dict.fromkeys(
        (p.name for p in security.iterdir()), 0o600)
    # TensorFlow's generated code and any other temporary file of the engines stay in their folder.
    cluster2.view.execute("import tempfile; tmp = tempfile.gettempdir()")
    (tmp,) = set(cluster2.pull("tmp"))
    assert os.path.basename(tmp).startswith("mpinb-engines-") and tmp in cluster2._path.leftovers


def test_stuck_rank_is_named_and_restart_recovers(cluster2) -> None:
    assert cluster2.healthy(timeout=5).ok
    # Rank 1 waits in a barrier that rank 0 never enters: the classic hang.
    cluster2.view.execute(
        "from mpi4py import MPI\nif MPI.COMM_WORLD.Get_rank() == 1:\n    MPI.COMM_WORLD.Barrier()", block=False
    )
    time.sleep(0.5)
    health = cluster2.healthy(timeout=2)
    assert not health and health.silent == [1] and health.answered == [0]
    assert "rank 1 did not answer" in str(health)
    old_pids = set(cluster2._engine_pids)
    old_files = set(cluster2._path.leftovers)
    cluster2.restart()
    # The old world's files (MPI's shared memory, Hydra's topology file, the engines' TMPDIR) are
    # gone; the new world's exist (UCX unlinks its own segments early).
    assert not [p for p in old_files if os.path.exists(p)], "restart() left the old world's files"
    new_files = cluster2._path.leftovers
    for kind in ("/dev/shm/mpich_shm_", "/tmp/hydra_hwloc_xmlfile_", "mpinb-engines-"):
        assert any(kind in p and os.path.exists(p) for p in new_files), (kind, new_files)
    assert cluster2.healthy(timeout=5).ok
    # A fresh controller numbers the new engines from 0 again: engine id == MPI rank, as before.
    assert cluster2.ids_by_rank == [0, 1] and sorted(cluster2.client.ids) == [0, 1]
    # ...so ipyparallel's own engine order, that of %%px output, is rank order.
    cluster2.client[:].execute("import mpinb; r = mpinb.world().rank", block=True)
    assert cluster2.client[:].pull("r", block=True) == [0, 1]
    assert not old_pids & set(cluster2._engine_pids)
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in old_pids)
    cluster2.view.execute("import mpinb; total = mpinb.allreduce([1])[0]")
    assert cluster2.pull("total") == [2, 2]


def test_gather_orders_by_rank_when_engine_ids_are_permuted() -> None:
    config = {"MPIEngineSetLauncher": {"engine_cmd": [sys.executable, PERMUTED_ENGINE]}}
    with mpinb.MPICluster(n=4, config=config) as cluster:
        # Engine ids run opposite to ranks: rank 0 is the engine with the highest id.
        assert cluster.ids_by_rank == [103, 102, 101, 100]
        cluster.view.execute("import numpy as np, mpinb; w = mpinb.world(); x = np.full(w.rank + 1, w.rank)")
        np.testing.assert_array_equal(cluster.gather("x"), [0, 1, 1, 2, 2, 2, 3, 3, 3, 3])
        assert cluster.pull("w")[2].rank == 2
        assert cluster.pull_root("w").rank == 0
        data = np.arange(10)
        cluster.scatter("mine", data)
        cluster.view.execute("lo = int(mine[0]) if len(mine) else -1")
        assert cluster.pull("lo") == [0, 3, 6, 8]  # balanced shards, by rank
        pids = cluster._tracked_pids()
    assert pids and not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)


def test_the_first_cell_shows_its_output_when_the_engines_output_joins_late() -> None:
    # Each engine's output channel joins the controller 3 s after the engine could answer
    # (late_output_engine.py): what an engine sends before it is dropped. Without the start's wait,
    # the first cell's result came back and its output never did: execute(block=True) hung.
    config = {"MPIEngineSetLauncher": {"engine_cmd": [sys.executable, LATE_OUTPUT_ENGINE]}}
    with mpinb.MPICluster(n=2, config=config, env={"MPINB_TEST_IOPUB_DELAY": "8"}) as cluster:
        ar = cluster.view.execute("import mpinb; print('rank', mpinb.world().rank)", block=False)
        assert ar.wait_for_output(timeout=30)
        assert ar.stdout == ["rank 0\n", "rank 1\n"]


def test_failure_inside_the_block_still_stops_everything() -> None:
    from ipyparallel.error import CompositeError

    with pytest.raises(CompositeError, match="ZeroDivisionError"):
        with mpinb.MPICluster(n=2) as cluster:
            pids = cluster._tracked_pids()
            files = set(cluster._path.leftovers)
            cluster.view.execute("1 / 0")
    assert cluster.client is None
    assert len(files) >= 3 and not [p for p in files if os.path.exists(p)], files  # stop() left no file
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert pids and not alive


def test_connect_to_an_ipcluster_started_outside(tmp_path) -> None:
    from mpinb.client.launch import find_mpiexec

    ipcluster = str(Path(sys.executable).parent / "ipcluster")
    profile = f"--profile-dir={tmp_path / 'profile'}"
    start = [ipcluster, "start", profile, "--engines=MPI", "--n=2", "--daemonize", "--log-level=ERROR",
             f"--MPILauncher.mpi_cmd=['{find_mpiexec()}']", "--Cluster.controller_ip=127.0.0.1"]
    subprocess.run(start, check=True, timeout=60, capture_output=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                cluster = mpinb.MPICluster.connect(profile_dir=str(tmp_path / "profile"), timeout=60)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        try:
            if len(cluster.ids_by_rank) < 2:
                cluster.client.wait_for_engines(2, timeout=60)
                cluster.stop()
                cluster = mpinb.MPICluster.connect(profile_dir=str(tmp_path / "profile"))
            cluster.view.execute("import mpinb; r = mpinb.world().rank")
            assert cluster.pull("r") == [0, 1]
        finally:
            cluster.stop()  # a connected cluster only disconnects
    finally:
        subprocess.run([ipcluster, "stop", profile, "--all"], timeout=60, capture_output=True)
        deadline = time.monotonic() + 20
        while cluster_processes_anywhere(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.2)


def cluster_processes_anywhere(tmp_path: Path) -> list[int]:
    """Daemonized ipcluster processes are not our children: find them by their profile dir."""
    pids = []
    for proc in psutil.process_iter(["pid", "cmdline", "environ"]):
        try:
            text = " ".join(proc.info["cmdline"] or []) + json.dumps(proc.info["environ"] or {})
        except psutil.Error:
            continue
        if str(tmp_path) in text and proc.pid != os.getpid():
            pids.append(proc.pid)
    return pids


def test_live_loss_updates_every_epoch_during_a_nonblocking_fit(cluster2) -> None:
    """The client receives the global loss of every epoch while the training cell still runs."""
    from mpinb.live import watch

    cluster2.view.execute(
        "import time, numpy as np, keras, mpinb, mpinb.keras\n"
        "from mpinb.data import make_classification\n"
        "X, y = make_classification(512, n_features=8, random_state=0)\n"
        "keras.utils.set_random_seed(0)\n"
        "model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation='relu'),\n"
        "                          keras.layers.Dense(2, activation='softmax')])\n"
        "model.compile(optimizer='adam', loss='sparse_categorical_crossentropy')\n"
        "class Slow(keras.callbacks.Callback):\n"
        "    def on_epoch_end(self, epoch, logs=None):\n"
        "        time.sleep(0.4)  # long enough epochs that the client polls inside each one\n"
    )
    epochs = 5
    ar = cluster2.view.execute(
        f"history = mpinb.keras.fit(model, X, y, batch_size=64, epochs={epochs}, callbacks=[Slow()], verbose=0)",
        block=False,
    )
    seen = watch(ar, interval=0.05, display=False)
    steps = [step for _, step in seen.redraws]
    assert sorted(set(steps)) == list(range(1, epochs + 1))  # every epoch seen (the last twice: done)
    # Updates arrived while the cell ran, not all at the end.
    assert seen.redraws[0][0] < seen.redraws[-1][0] - 1.0
    history = cluster2.pull_root("history")
    assert seen.progress["series"]["loss"] == pytest.approx(history["loss"], rel=1e-12)
    assert seen.progress["done"] is True


def test_live_inertia_from_kmeans_equals_its_history(cluster2) -> None:
    from mpinb.live import watch

    ar = cluster2.view.execute(
        "import mpinb\nfrom mpinb.data import make_blobs\n"
        "X, _ = make_blobs(20_000, n_features=4, centers=6, cluster_std=3.0, random_state=1)\n"
        "km = mpinb.KMeans(6, random_state=0).fit(X)\nhist = km.inertia_history_",
        block=False,
    )
    seen = watch(ar, interval=0.02, display=False)
    history = cluster2.pull_root("hist")
    assert seen.progress["kind"] == "inertia" and seen.progress["done"]
    assert seen.progress["series"]["inertia"] == pytest.approx(list(history), rel=1e-12)
    assert seen.progress["steps"] == list(range(1, len(history) + 1))


def test_the_same_error_on_every_rank_is_shown_once_with_its_ranks(cluster2) -> None:
    import ipyparallel as ipp

    with pytest.raises(ipp.error.CompositeError) as info:
        cluster2.view.execute("import mpinb; mpinb.check_all(False, 'no good')", block=True)
    lines = info.value._render_traceback_()
    assert lines[0] == "ValueError on ranks 0-1 (2 of 2 errors, the same):", lines[:3]
    assert sum(line.startswith("ValueError on") for line in lines) == 1
    assert sorted(info.value.by_rank) == [0, 1]
