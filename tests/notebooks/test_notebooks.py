"""Every tutorial notebook, executed top to bottom against a real MPI engine cluster (2 engines,
small parameters), with a check that no cluster process is left afterwards.

The assertions are on the values the notebook produced (its data, the engines' results), compared
here with what this test computes itself -- scikit-learn's k-means on the same data, the shard
bounds, the files on disk -- never on a flag the notebook computed about itself."""

from __future__ import annotations

import math
import os
import pickle
import re
import shutil
import tempfile
import uuid
from pathlib import Path

import nbformat
import numpy as np
import psutil
import pytest
from jupyter_client import KernelManager
from nbclient import NotebookClient

from support import saved_outputs

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def run_notebook(name: str, parameters: dict, results: list[str], timeout: int = 600) -> dict:
    """Execute ``name`` with ``parameters`` injected after its ``parameters`` cell (papermill's
    convention) and return the values of ``results`` from the kernel's namespace (pickled, so
    arrays arrive as arrays)."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    # A tutorial saved with its outputs keeps the parameters they were made with: these replace them.
    nb.cells = [c for c in nb.cells if "injected-parameters" not in c.get("metadata", {}).get("tags", [])]
    index = next(i for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", []))
    overrides = "\n".join(f"{key} = {value!r}" for key, value in parameters.items())
    nb.cells.insert(index + 1, nbformat.v4.new_code_cell(overrides, metadata={"tags": ["injected-parameters"]}))
    out = tempfile.NamedTemporaryFile(prefix="mpinb-nb-results-", suffix=".pkl", delete=False)
    out.close()
    dump = (f"import pickle as _p\nwith open({out.name!r}, 'wb') as _f:\n"
            f"    _p.dump({{k: globals()[k] for k in {results!r}}}, _f)")
    nb.cells.append(nbformat.v4.new_code_cell(dump))

    marker = uuid.uuid4().hex
    ipython_dir = tempfile.mkdtemp(prefix="mpinb-nb-ipython-")
    env = dict(os.environ, IPYTHONDIR=ipython_dir, IPP_NONINTERACTIVE="1", MPINB_NOTEBOOK_RUN=marker, MPLBACKEND="module://matplotlib_inline.backend_inline")
    # The kernel listens on Unix sockets in the run's own folder: with TCP, jupyter_client picks
    # free ports that the kernel binds a moment later, and a port another tier took in between
    # killed the kernel at its start ("Address already in use", CI).
    km = KernelManager(kernel_name="python3", transport="ipc", ip=os.path.join(ipython_dir, "kernel"))
    client = NotebookClient(nb, km=km, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    try:
        client.execute(env=env)
    finally:
        if km.has_kernel:  # a kernel manager given to nbclient is the caller's to shut down
            km.shutdown_kernel(now=True)
        leftovers = processes_marked(marker)
        for proc in leftovers:
            proc.kill()
        shutil.rmtree(ipython_dir, ignore_errors=True)  # the run's profiles: nothing left in /tmp
        assert not leftovers, f"{name} left {len(leftovers)} process(es) running: {[p.pid for p in leftovers]}"
    try:
        with open(out.name, "rb") as fh:
            values = pickle.load(fh)
    finally:
        os.unlink(out.name)
    return values | {"_notebook": nb, "_name": name}


@pytest.fixture
def keep_outputs():
    """Save a tutorial with its outputs when the run asks for it (``--save-outputs``), once its test
    has passed: the test calls the fixture with what :func:`run_notebook` returned, last."""
    def keep(got: dict) -> None:
        if saved_outputs.asked():
            saved_outputs.save(got["_notebook"], NOTEBOOKS / got["_name"])
    return keep


def processes_marked(marker: str) -> list[psutil.Process]:
    """Processes that inherited this run's environment: kernel, controller, mpiexec, engines."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get("MPINB_NOTEBOOK_RUN") == marker:
                found.append(proc)
        except psutil.Error:
            continue
    _, alive = psutil.wait_procs(found, timeout=10)
    return alive


def figures(nb) -> int:
    return sum(1 for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {}))


def errors(nb) -> list[str]:
    return [o.get("ename", "") for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]


def test_01_mpi_engines(keep_outputs) -> None:
    got = run_notebook(
        "01_mpi_engines.ipynb",
        {"n_engines": 2, "n_rows": 2_001},  # odd, so the shards differ: rank 0 owns one row more
        ["ranks", "sizes", "global_mean", "X", "row_index", "owner", "messages", "left_messages", "waits",
         "timeout_messages", "ranks_after", "rows_after"],
    )
    assert got["ranks"] == [0, 1] and got["sizes"] == [2, 2]
    # The engines' allreduce mean equals the mean of the gathered rows, computed here.
    np.testing.assert_allclose(got["global_mean"], got["X"].mean(axis=0), rtol=1e-12)
    # The engines tagged their rows with global index and MPI rank; gathered, they read 0..n-1, and
    # rank r owns the rows shard_bounds(2001, r, 2) says: 1,001 then 1,000.
    np.testing.assert_array_equal(got["row_index"], np.arange(2_001))
    np.testing.assert_array_equal(got["owner"], np.repeat([0, 1], [1_001, 1_000]))
    assert len(got["X"]) == 2_001
    # Rank 1 raised before an allreduce rank 0 entered: with no deadline, rank 0 stopped waiting
    # within a second, naming rank 1 and its error; the cell showed that one error (tagged).
    assert got["left_messages"][1] is None
    assert "rank 1 ended its cell (raised ZeroDivisionError: division by zero)" in got["left_messages"][0]
    assert len(got["waits"]) == 1 and got["waits"][0] < 1.0, got["waits"]
    # raise_together: one message, the same on both ranks, naming the rank that failed.
    messages = got["messages"]
    assert len(messages) == 2 and messages[0] == messages[1] and "rank 1" in messages[0], messages
    # Rank 1 stalled before an allreduce: rank 0's deadline named it, and without a restart the next
    # cell's allreduce ran on both ranks over the rows made before the timeout.
    waited, skipped = got["timeout_messages"]
    assert skipped is None and re.search(r"\brank 1\b", waited or ""), got["timeout_messages"]
    assert got["ranks_after"] == [2, 2]
    assert got["rows_after"] == [2_001, 2_001]
    nb = got["_notebook"]
    failed = [c for c in nb.cells if any(o.get("output_type") == "error" for o in c.get("outputs", []))]
    assert figures(nb) == 1 and len(failed) == 1 and "raises-exception" in failed[0].metadata.get("tags", [])
    keep_outputs(got)


def test_03_sharded_keras(keep_outputs) -> None:
    epochs = 12
    got = run_notebook(
        "03_sharded_keras.ipynb",
        # 5 part files on 2 ranks: uneven on purpose, so rank 0 holds more batches than it may run.
        {"n_engines": 2, "epochs": epochs, "cnn_epochs": 5, "global_batch": 64, "n_files": 5},
        ["test_accuracy", "weights_accuracy", "live_epochs", "checksums", "reload_accuracy",
         "checkpoint_accuracy", "naive", "cnn_weights", "cnn_losses", "cnn_val_accuracy",
         "files_by_rank", "batches_by_rank", "data_dir", "files_weights", "files_losses", "files_steps",
         "uneven_bounds", "history_u"],
    )
    assert got["test_accuracy"] > 0.9
    assert abs(got["weights_accuracy"] - got["test_accuracy"]) < 0.05
    assert got["live_epochs"] == epochs
    assert len(got["checksums"]) == 2 and got["checksums"][0] == got["checksums"][1], got["checksums"]
    assert got["reload_accuracy"] == pytest.approx(got["checkpoint_accuracy"], abs=1e-6)
    # Uneven shards (1:2 on two ranks): the bounds cover the training split once, and every rank
    # trained on each of its rows once per epoch, in ceil(rows / global batch) steps.
    from mpinb.data import load_digits

    n_train = len(load_digits(test_size=0.25, random_state=0, shard=False)[0])
    (lo0, hi0), (lo1, hi1) = got["uneven_bounds"]
    assert lo0 == 0 and hi0 == lo1 and hi1 == n_train and abs(2 * (hi0 - lo0) - (hi1 - lo1)) <= 2
    held = [hi0 - lo0, hi1 - lo1]
    h = got["history_u"]
    assert h["rows_used"] == [held] * 3
    assert h["steps"] == [math.ceil(n_train / 64)] * 3
    # Global logs weighted by rows: the larger shard counts twice as much.
    np.testing.assert_allclose(np.asarray(h["rank_accuracy"]) @ held / n_train, h["accuracy"], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(h["rank_loss"]) @ held / n_train, h["loss"], rtol=1e-6)
    # Conv2D + BatchNorm + Dropout: bit-identical weights and moving statistics on both ranks, and it learned.
    first, second = got["cnn_weights"]
    assert first.size > 1000 and np.array_equal(first, second)
    assert len(got["cnn_losses"]) == 5 and got["cnn_losses"][-1] < got["cnn_losses"][0] / 2
    assert got["cnn_val_accuracy"] > 0.8
    # Training from files: rank 0 got parts 0-2 and rank 1 parts 3-4, each file read once, in sorted
    # order; both ranks ran as many steps as the rank with more batches (every batch used); weights
    # identical; it learned.
    files_by_rank = got["files_by_rank"]
    assert [[os.path.basename(f) for f in files] for files in files_by_rank] == [
        [f"part-{i:05d}.npz" for i in range(3)], [f"part-{i:05d}.npz" for i in range(3, 5)]]
    rank0_batches, rank1_batches = got["batches_by_rank"]
    assert rank0_batches > rank1_batches > 0
    assert got["files_steps"] == [rank0_batches] * 5  # the section trains 5 epochs
    assert np.array_equal(*got["files_weights"])
    assert len(got["files_losses"]) == 5 and got["files_losses"][-1] < got["files_losses"][0] / 2
    assert not os.path.exists(got["data_dir"])  # the notebook removed the part files
    assert figures(got["_notebook"]) >= 4 and not errors(got["_notebook"])
    keep_outputs(got)


def test_04_scaling(keep_outputs) -> None:
    got = run_notebook(
        "04_scaling.ipynb",
        {"ranks": [1, 2], "n_rows": 40_000, "train_rows": 2_048, "global_batch": 256, "epochs": 2},
        ["results", "sizes", "kmeans_seconds", "step_seconds", "kmeans_speedup", "comm_fraction", "wait_fraction"],
    )
    results = got["results"]
    # Each world size ran as its own job of that many ranks, one thread each; every rank clustered
    # its share of the rows, and the global batch was split among the ranks (8 steps per epoch at
    # every size, where an unsplit batch would give 4 at two ranks).
    assert got["sizes"] == [r["ranks"] for r in results] == [1, 2]
    assert [r["threads_per_rank"] for r in results] == [1, 1]
    assert [r["kmeans"]["rows_per_rank"] for r in results] == [40_000, 20_000]
    assert [r["keras"]["steps_per_epoch"] for r in results] == [2_048 // 256] * 2
    times = got["kmeans_seconds"] + got["step_seconds"]
    assert all(math.isfinite(s) and s > 0 for s in times), times
    # Speed-up is the one-rank time over each measured time (not its inverse).
    seconds = got["kmeans_seconds"]
    assert got["kmeans_speedup"] == pytest.approx([seconds[0] / s for s in seconds], rel=1e-12)
    assert got["comm_fraction"][0] == 0.0 and 0.0 < got["comm_fraction"][1] < 1.0  # one rank has nothing to exchange
    assert got["wait_fraction"][0] == 0.0 and 0.0 <= got["wait_fraction"][1] <= got["comm_fraction"][1]
    assert figures(got["_notebook"]) == 2 and not errors(got["_notebook"])
    keep_outputs(got)


def test_02_distributed_kmeans(keep_outputs) -> None:
    got = run_notebook(
        "02_distributed_kmeans.ipynb",
        {"n_engines": 2, "n_rows": 20_000, "n_clusters": 5, "n_features": 2},
        ["X", "X_raw", "start", "ours_centers", "ours_labels", "ours_n_iter", "ours_inertia", "error_messages"],
    )
    from sklearn.cluster import KMeans
    from sklearn.preprocessing import StandardScaler

    # The engines clustered their raw rows (features in units 10x apart) as scikit-learn scales them.
    spread = got["X_raw"].std(axis=0)
    assert spread[1] > 3 * spread[0], spread
    np.testing.assert_allclose(got["X"], StandardScaler().fit_transform(got["X_raw"]), rtol=0, atol=1e-12)
    # scikit-learn here, on the rows the engines held, from the start the notebook gave both.
    sk = KMeans(n_clusters=5, init=got["start"], n_init=1, algorithm="lloyd").fit(got["X"])
    np.testing.assert_allclose(got["ours_centers"], sk.cluster_centers_, rtol=1e-10, atol=1e-10)
    np.testing.assert_array_equal(got["ours_labels"], sk.labels_)
    assert got["ours_n_iter"] == sk.n_iter_
    assert got["ours_inertia"] == pytest.approx(sk.inertia_, rel=1e-10)
    # A NaN on rank 1 only: the same clear error on both ranks.
    messages = got["error_messages"]
    assert len(messages) == 2 and messages[0] == messages[1] and "NaN" in messages[0], messages
    assert figures(got["_notebook"]) >= 3 and not errors(got["_notebook"])  # live inertia, clusters, convergence
    keep_outputs(got)
