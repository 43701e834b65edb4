"""mpinb across hosts: run by tests/multihost/test_multihost.py as

    mpiexec -f HOSTFILE -launcher ssh -launcher-exec tests/multihost/launcher.sh -iface BRIDGE \\
        -n 3 python -m mpi4py -m pytest tests/multihost/ranks/test_across_hosts.py

with ranks 0 and 1 on host1 and rank 2 on host2 (simulated hosts; MPI over TCP across the bridge).
Each result is compared with one process on one host holding all the data, and every rank asserts
on allgathered values, so the ranks pass or fail together.
"""

from __future__ import annotations

import json
import os
import socket

import numpy as np
import pytest
from mpi4py import MPI

import mpinb
import mpinb.data

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
# Hostname of each rank, in rank order, as the hostfile placed them.
EXPECTED_HOSTS = json.loads(os.environ.get("MPINB_MULTIHOST_EXPECT", "[]"))


def agree(ok: bool, what: str) -> None:
    bad = [r for r, v in enumerate(COMM.allgather(bool(ok))) if not v]
    assert not bad, f"{what} failed on ranks {bad}"


def test_ranks_run_on_the_hosts_the_hostfile_names():
    hosts = COMM.allgather(socket.gethostname())
    assert hosts == EXPECTED_HOSTS
    w = mpinb.world()
    # mpinb's own view of the nodes: ranks grouped by host, not one node of SIZE ranks.
    here = hosts[RANK]
    agree(w.host == here and w.local_size == hosts.count(here) and w.local_rank == hosts[:RANK].count(here),
          f"world() on {here}: local_rank {w.local_rank}, local_size {w.local_size}")


def test_limit_threads_counts_ranks_per_host():
    hosts = COMM.allgather(socket.gethostname())
    cores = COMM.allgather(len(os.sched_getaffinity(0)))
    try:
        threads = COMM.allgather(mpinb.limit_threads())
        here = os.environ["OMP_NUM_THREADS"]
    finally:
        mpinb.limit_threads(1)  # back to one thread each for the tests below: 3 ranks share 2 cores
    # The cores of a host shared among the ranks on that host: with 2 cores, host1's two ranks get
    # one thread each and host2's single rank gets both.
    expected = [max(1, cores[r] // hosts.count(hosts[r])) for r in range(SIZE)]
    assert threads == expected, f"threads per rank {threads}, expected {expected} for hosts {hosts}, cores {cores}"
    assert here == str(threads[RANK])


def test_kmeans_matches_one_host():
    n, k = 3000, 5
    X, _ = mpinb.data.make_blobs(n, 4, centers=k, random_state=3)  # this rank's rows only
    fitted = mpinb.KMeans(k, random_state=0, n_init=1).fit(X)
    labels = mpinb.gather_rows(fitted.labels_, root=None)

    X_all, _ = mpinb.data.make_blobs(n, 4, centers=k, random_state=3, shard=False)
    one = mpinb.KMeans(k, random_state=0, n_init=1, comm=MPI.COMM_SELF).fit(X_all)

    agree(X.shape[0] < n, "each rank holds only its shard")
    centres = COMM.allgather(fitted.cluster_centers_)
    for r, c in enumerate(centres):
        np.testing.assert_array_equal(c, centres[0], err_msg=f"rank {r}'s centres differ from rank 0's")
    np.testing.assert_allclose(fitted.cluster_centers_, one.cluster_centers_, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(fitted.inertia_, one.inertia_, rtol=1e-10)
    np.testing.assert_array_equal(labels, one.labels_)
    assert fitted.n_iter_ == one.n_iter_


def test_keras_fit_matches_one_host():
    keras = pytest.importorskip("keras")
    mk = pytest.importorskip("mpinb.keras")

    n, per_rank, epochs = 192, 16, 2
    X, y = mpinb.data.make_classification(n, 8, 3, random_state=1)  # this rank's rows
    X_all, y_all = mpinb.data.make_classification(n, 8, 3, random_state=1, shard=False)

    def tiny():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(3, activation="softmax")])
        model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="sparse_categorical_crossentropy")
        return model

    model, reference = tiny(), tiny()
    reference.set_weights(model.get_weights())
    history = mk.fit(model, X, y, batch_size=per_rank * SIZE, epochs=epochs, shuffle=False, verbose=0)

    # One process on one host: at step s it sees every rank's s-th batch, in rank order.
    bounds = [mpinb.shard_bounds(n, rank=r, size=SIZE) for r in range(SIZE)]
    steps = min((hi - lo) // per_rank for lo, hi in bounds)
    order = np.concatenate([np.arange(lo + s * per_rank, lo + (s + 1) * per_rank)
                            for s in range(steps) for lo, _ in bounds])
    ref = reference.fit(X_all[order], y_all[order], batch_size=per_rank * SIZE, epochs=epochs, shuffle=False, verbose=0)

    mine = np.concatenate([w.ravel() for w in model.get_weights()])
    theirs = np.concatenate([w.ravel() for w in reference.get_weights()])
    everyone = COMM.allgather(mine)
    for r, w in enumerate(everyone):
        np.testing.assert_array_equal(w, everyone[0], err_msg=f"rank {r}'s weights differ from rank 0's")
    np.testing.assert_allclose(mine, theirs, rtol=0, atol=1e-5)
    np.testing.assert_allclose(history["loss"], ref.history["loss"], rtol=1e-5)
    assert history["steps"] == [steps] * epochs
