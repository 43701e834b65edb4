"""The collective layer is the only place mpinb communicates: proven with a counting communicator."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest
from mpi4py import MPI

import mpinb
from mpinb.data import load_digits, load_npy, make_blobs
from support.counting import CountingComm
from support.mpitools import assert_everywhere, assert_same_everywhere

RANK, SIZE = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


@pytest.fixture
def counted():
    # A fresh duplicate: mpinb's channels are cached by communicator, and this one is new to it.
    base = MPI.COMM_WORLD.Dup()
    comm = CountingComm(base)
    yield comm
    MPI.COMM_WORLD.Barrier()
    base.Free()


def test_kmeans_data_and_errors_communicate_only_through_the_layer(counted) -> None:
    X, _ = make_blobs(3000, n_features=4, centers=3, random_state=0, comm=counted)
    km = mpinb.KMeans(3, random_state=0, n_init=2, comm=counted).fit(X)
    km.score(X)
    mpinb.KMeans(3, init="random", random_state=1, comm=counted).fit(X)
    digits = load_digits(comm=counted)
    with tempfile.TemporaryDirectory() as tmp:
        path = mpinb.bcast(os.path.join(tmp, "x.npy"), comm=counted)
        if RANK == 0:
            np.save(path, np.arange(40.0).reshape(20, 2))
        mpinb.check_all(True, "saved", comm=counted)
        rows = load_npy(path, comm=counted)
        mpinb.check_all(True, "read", comm=counted)
    with pytest.raises(ValueError, match="bad"):
        with mpinb.raise_together(comm=counted):
            if RANK == 0:
                raise ValueError("bad")
    mpinb.limit_threads(comm=counted)
    assert_everywhere(len(digits.X_train) > 0 and len(rows) >= 0)
    outside = counted.outside()
    inside = [m for m, who in counted.calls if who.startswith("mpinb._collective")]
    assert_everywhere(not outside, f"MPI calls outside the collective layer: {outside}")
    # At one rank the layer sends nothing at all; with more, everything went through it.
    assert_everywhere((len(inside) > 0) == (SIZE > 1), f"{len(inside)} calls in the layer")
    assert_same_everywhere(km.cluster_centers_)


def test_reduce_in_place_takes_an_op_per_buffer_and_votes_in_the_arrival() -> None:
    from mpinb import _collective

    sums, peaks = np.full(3, RANK + 1.0), np.array([RANK], dtype=np.int64)
    op = _collective.reduce_in_place([sums, peaks], ["sum", "max"], name="test's reduction",
                                     votes=(int(RANK == SIZE - 1), 0))
    np.testing.assert_array_equal(sums, np.full(3, SIZE * (SIZE + 1) / 2))
    assert peaks[0] == SIZE - 1
    assert op.votes == (1, 0, 0)  # the last rank's vote, known to every rank


def test_a_stop_flag_keeps_the_callers_votes_beside_its_own() -> None:
    from mpinb import _collective
    from mpinb.interrupt import StopFlag

    stop = StopFlag()
    if RANK == SIZE - 1:
        stop.request()
    sums = np.full(2, 1.0)
    with pytest.raises(KeyboardInterrupt, match="the test's loop"):
        _collective.reduce_in_place([sums], name="test's stopped reduction", votes=(RANK + 1,), stop=stop,
                                    where="the test's loop")
    np.testing.assert_array_equal(sums, np.full(2, 1.0))  # a stop moves no data
    op = _collective.reduce_in_place([sums], name="test's reduction", votes=(RANK + 1, 2), stop=StopFlag())
    assert op.votes == (SIZE, 2, 0) and sums[0] == SIZE  # the caller's votes, no stop


@pytest.mark.mpi_sizes(2, 3, 4)
def test_a_second_thread_in_a_collective_gets_an_error_at_once() -> None:
    """Rank 0 calls from a second thread while its first thread's collective is in progress: the
    second call raises at once, the first one gives the right sum, and the next call works."""
    import threading
    import time

    from mpinb import _collective

    mpinb.allreduce([np.zeros(1)])  # the channel set up, so the thread's call is an ordinary one
    chan = _collective.channel()
    first: dict = {}
    error = ""
    if RANK == 0:
        worker = threading.Thread(target=lambda: first.update(v=mpinb.allreduce([np.full(3, 1.0)])[0]))
        worker.start()
        while chan._owner is None and worker.is_alive():
            time.sleep(1e-3)
        try:
            mpinb.allreduce([np.full(3, 5.0)])
        except RuntimeError as err:
            error = str(err)
        worker.join()
    else:
        time.sleep(0.3)  # rank 0's thread is inside its collective, waiting for this rank
        first["v"] = mpinb.allreduce([np.full(3, 1.0)])[0]
    assert_everywhere(RANK != 0 or "from a second thread" in error, f"rank 0's second thread got: {error!r}")
    assert_everywhere(bool(np.all(first["v"] == SIZE)), f"the first thread's sum: {first['v']}")
    after = mpinb.allreduce([np.full(2, RANK + 1.0)])[0]
    assert_everywhere(bool(np.all(after == SIZE * (SIZE + 1) / 2)), f"the next call gave {after}")
