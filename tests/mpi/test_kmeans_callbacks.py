"""scikit-learn's callbacks on mpinb's k-means under mpiexec: only rank 0's hooks run, they see the
global iterations and values (the same at 1, 2 and 3 ranks as one process on all the rows), and a
hook that raises ends the fit on every rank."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from mpi4py import MPI

from mpinb import KMeans, MiniBatchKMeans
from mpinb.errors import CollectiveAbandoned
from support import kmeans_cases
from support.mpitools import assert_everywhere, local

pytestmark = [
    pytest.mark.mpi_sizes(1, 2, 3),
    pytest.mark.skipif(importlib.util.find_spec("sklearn.callback") is None,
                       reason="scikit-learn before 1.9 has no sklearn.callback"),
]

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()


class Recorder:
    """Every hook call, and at each task's end the global values its model carries."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.calls: list[tuple] = []
        self.values: list[tuple] = []
        self.fail_at = fail_at

    def setup(self, estimator, context):
        self.calls.append(("setup",))

    def teardown(self, estimator, context):
        self.calls.append(("teardown",))

    def on_fit_task_begin(self, estimator, context):
        self.calls.append(("begin", context.task_name, context.task_id, context.max_subtasks))

    def on_fit_task_end(self, estimator, context, *, X=None, fitted_estimator=None):
        self.calls.append(("end", context.task_name, context.task_id, context.max_subtasks))
        if self.fail_at is not None and context.task_id == self.fail_at and context.task_name != "fit":
            raise ValueError(f"the callback failed at task {context.task_id}")
        # score() on the hook's model is rank 0's rows alone: a collective here would hang.
        self.values.append((fitted_estimator.inertia_, fitted_estimator.cluster_centers_.copy(),
                            fitted_estimator.score(X)))


def fitted(make, X_local, X_all):
    """Rank 0's and every rank's recordings of ``make()`` fitted on the shards of all ranks, and
    one process's on all rows (COMM_SELF, every rank alike)."""
    ours, alone = Recorder(), Recorder()
    make(None).set_callbacks(ours).fit(X_local)
    make(MPI.COMM_SELF).set_callbacks(alone).fit(X_all)
    return ours, alone


def assert_rank_0_saw_what_one_process_sees(ours, alone):
    assert_everywhere((len(ours.calls) > 0) == (RANK == 0), "hooks called on rank 0 only")
    same = False
    if RANK == 0:
        same = ours.calls == alone.calls and len(ours.values) == len(alone.values) and all(
            np.isclose(a[0], b[0], rtol=1e-12) and np.allclose(a[1], b[1], rtol=0, atol=1e-12 * np.abs(b[1]).max())
            for a, b in zip(ours.values, alone.values, strict=True))
    assert_everywhere(bool(COMM.bcast(same)), "rank 0's hooks saw one process's tasks and values")


@pytest.mark.parametrize("n_init", [1, 2])
def test_callback_kmeans_on_rank_0_with_global_values(n_init):
    X = kmeans_cases.blobs(600 * 3)
    ours, alone = fitted(lambda comm: KMeans(6, init="random", n_init=n_init, random_state=0, comm=comm),
                         local(X), X)
    assert_rank_0_saw_what_one_process_sees(ours, alone)
    score = None
    if RANK == 0:
        # The hooks' model scores rank 0's rows alone (it lives on COMM_SELF): their share of the inertia.
        mine, centers = local(X), ours.values[-1][1]
        share = ((mine[:, None, :] - centers[None]) ** 2).sum(axis=2).min(axis=1).sum()
        score = ours.values[-1][2] / -share
    # Every rank takes part in the broadcast (inside the or, only rank 0 did: its message waited on
    # COMM_WORLD and truncated the next test's Barrier).
    score = COMM.bcast(score)
    assert_everywhere(abs(score - 1) < 1e-9, f"the hooks' score: rank 0's rows ({score})")


def test_callback_minibatch_on_rank_0_with_global_values():
    X = kmeans_cases.blobs(600 * 3)
    ours, alone = fitted(lambda comm: MiniBatchKMeans(6, batch_size=128, random_state=0, comm=comm), local(X), X)
    assert_rank_0_saw_what_one_process_sees(ours, alone)


def test_callback_that_raises_on_rank_0_ends_the_fit_on_every_rank():
    X = local(kmeans_cases.blobs(600 * 3))
    rec = Recorder(fail_at=1)
    km = KMeans(6, random_state=0, max_iter=50, tol=0).set_callbacks(rec)
    with pytest.raises(Exception) as caught:
        km.fit(X)
    err = caught.value
    if RANK == 0:
        ok = isinstance(err, ValueError) and "the callback failed at task 1" in str(err)
    else:
        ok = (isinstance(err, CollectiveAbandoned) and err.by == 0
              and "rank 0 raised ValueError: the callback failed at task 1" in str(err))
    assert_everywhere(ok, f"the error of each rank ({type(err).__name__}: {str(err)[:300]})")
    # The teardown ran on rank 0, and the next fit works on every rank.
    assert_everywhere(rec.calls[-1:] == [("teardown",)] if RANK == 0 else rec.calls == [], "teardown after the error")
    km.set_callbacks().fit(X)
    assert_everywhere(km.n_iter_ >= 1, "the next fit")
