"""Interrupts, faults and security on a real MPI engine cluster."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest
from ipyparallel.error import CompositeError

import mpinb

# One real run per scenario: the orderings of the protocol are explored by the model tier (tests/model).
TRIALS = int(os.environ.get("MPINB_INTERRUPT_TRIALS", "1"))


@pytest.fixture(scope="module")
def cluster4():
    with mpinb.MPICluster(n=4) as cluster:
        cluster.view.execute(
            "import re, numpy as np, mpinb\nfrom mpinb.data import make_blobs\n"
            "X, _ = make_blobs(400_000, n_features=8, centers=8, cluster_std=4.0, random_state=3)\n"
            "rng = np.random.default_rng(0)\nstart = rng.normal(size=(64, 8))\n"
            # Import and JIT-compile before the timed interrupts: a Ctrl-C during an import is an
            # ordinary KeyboardInterrupt on that rank, outside any collective loop.
            "mpinb.KMeans(4, random_state=0).fit(X[:2000])"
        )
        yield cluster


def _interrupted_iterations(error: CompositeError) -> list[int]:
    """The iteration each rank reported in its KeyboardInterrupt."""
    import re

    found = []
    for ename, evalue, *_ in error.elist:
        assert ename == "KeyboardInterrupt", (ename, evalue)
        match = re.search(r"iteration (\d+)", evalue)
        assert match, evalue
        found.append(int(match.group(1)))
    return found


@pytest.mark.parametrize("attempt", range(TRIALS))
def test_interrupt_stops_kmeans_on_every_rank_at_the_same_iteration(cluster4, attempt: int) -> None:
    ar = cluster4.view.execute(
        "km = mpinb.KMeans(64, init=start, n_init=1, max_iter=100_000, tol=0.0).fit(X)", block=False
    )
    time.sleep(0.3 + 0.05 * (attempt % 5))  # land in different iterations
    cluster4.interrupt()
    with pytest.raises(CompositeError) as info:
        ar.get(timeout=30)
    iterations = _interrupted_iterations(info.value)
    assert len(iterations) == 4 and len(set(iterations)) == 1, iterations
    # The next cell on the same cluster works, collectives included.
    cluster4.view.execute("total = mpinb.allreduce([1])[0]")
    assert cluster4.pull("total") == [4, 4, 4, 4]


def test_connection_files_are_private(cluster4) -> None:
    security = Path(cluster4.cluster.profile_dir) / "security"
    assert stat.S_IMODE(security.stat().st_mode) == 0o700
    files = list(security.glob("*.json"))
    assert any("key" in p.read_text() for p in files), f"no connection files in {security}"
    for path in files:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode & 0o077 == 0, f"{path.name} is readable by others: {oct(mode)}"


KERAS_SETUP = (
    "import time, numpy as np, keras, mpinb, mpinb.keras\n"
    "from mpinb.data import make_classification\n"
    "X, y = make_classification(2048, n_features=16, random_state=0)\n"
    "class Slow(keras.callbacks.Callback):\n"
    "    def on_train_batch_end(self, batch, logs=None):\n"
    "        time.sleep(0.01)\n"
    "def build():\n"
    "    keras.utils.set_random_seed(0)\n"
    "    m = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation='relu'),\n"
    "                          keras.layers.Dense(2, activation='softmax')])\n"
    "    m.compile(optimizer='adam', loss='sparse_categorical_crossentropy')\n"
    "    return m\n"
    "model = build()\n"
    "mpinb.keras.fit(model, X, y, batch_size=64, epochs=1, verbose=0)\n"  # import and trace first
)


@pytest.mark.parametrize("attempt", range(TRIALS))
def test_interrupt_stops_keras_fit_on_every_rank_at_the_same_step(cluster4, attempt: int) -> None:
    if attempt == 0:
        cluster4.view.execute(KERAS_SETUP)
    ar = cluster4.view.execute(
        "history = mpinb.keras.fit(model, X, y, batch_size=64, epochs=200, callbacks=[Slow()], verbose=0)",
        block=False,
    )
    time.sleep(0.5 + 0.1 * (attempt % 8))  # land in different epochs and steps
    cluster4.interrupt()
    with pytest.raises(CompositeError) as info:
        ar.get(timeout=60)
    places = []
    for ename, evalue, *_ in info.value.elist:
        assert ename == "KeyboardInterrupt", (ename, evalue)
        places.append(evalue.split(":")[0])
    assert len(places) == 4 and len(set(places)) == 1 and "training stopped at epoch" in places[0], places
    cluster4.view.execute("total = mpinb.allreduce([1])[0]")
    assert cluster4.pull("total") == [4, 4, 4, 4]


def test_killed_engine_is_reported_fast_and_training_resumes_from_the_checkpoint(tmp_path) -> None:
    import json
    import signal

    checkpoint = str(tmp_path / "run.keras")
    with mpinb.MPICluster(n=2) as cluster:
        cluster.view.execute(KERAS_SETUP)
        ar = cluster.view.execute(
            f"history = mpinb.keras.fit(model, X, y, batch_size=64, epochs=100, callbacks=[Slow()], "
            f"checkpoint={checkpoint!r}, verbose=0)",
            block=False,
        )
        record = Path(checkpoint + ".json")
        deadline = time.monotonic() + 120
        while not (record.exists() and json.loads(record.read_text())["epoch"] >= 1):
            assert time.monotonic() < deadline and not ar.ready(), "no checkpoint written"
            time.sleep(0.1)
        killed_at = time.monotonic()
        os.kill(cluster._engine_pids[1], signal.SIGKILL)
        with pytest.raises(Exception) as info:
            ar.get(timeout=30)
        # The death itself, not the 30-s timeout (how fast is the benchmarks' and the model's).
        noticed = time.monotonic() - killed_at
        assert "died" in str(info.value) or "EngineError" in repr(info.value), f"{info.value!r} after {noticed:.1f} s"
        epoch_at_kill = json.loads(record.read_text())["epoch"]

        cluster.restart()
        first_fit = "mpinb.keras.fit(model, X, y, batch_size=64, epochs=1, verbose=0)\n"
        cluster.view.execute(KERAS_SETUP.replace(first_fit, ""))
        cluster.view.execute(
            f"history = mpinb.keras.fit(model, X, y, batch_size=64, epochs={epoch_at_kill + 3}, "
            f"checkpoint={checkpoint!r}, resume=True, verbose=0)"
        )
        history = cluster.pull_root("history")
        # Resumed right after the last saved epoch: at most the epoch in progress was lost.
        assert history["params"]["initial_epoch"] == epoch_at_kill + 1
        assert history["epoch"] == list(range(epoch_at_kill + 1, epoch_at_kill + 3))
