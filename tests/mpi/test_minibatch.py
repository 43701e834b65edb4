"""mpinb.MiniBatchKMeans under mpiexec at 1-4 ranks: the one-process result at every size, on every
rank, collective errors, empty shards, partial_fit over shards, reassignment across ranks,
interrupts and the one-Allreduce-per-mini-batch rule."""

from __future__ import annotations

import contextlib
import io
from collections import Counter
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI
from sklearn.cluster import MiniBatchKMeans as SkMiniBatchKMeans
from threadpoolctl import threadpool_limits

import mpinb
from mpinb import CollectiveMismatchError, MiniBatchKMeans
from support import kmeans_cases
from support.mpitools import (
    assert_everywhere,
    assert_interrupt_stops_together,
    assert_same_everywhere,
    local,
    raises_everywhere,
)

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()


@pytest.fixture(autouse=True)
def one_thread():
    """One thread per rank, whatever the environment: scikit-learn's OpenMP hand-offs per mini-batch
    are slow where ranks share the cores."""
    with threadpool_limits(limits=1):
        yield


def blobs(per_rank: int = 600, d: int = 4, centers: int = 8, std: float = 2.0, seed: int = 1) -> np.ndarray:
    return kmeans_cases.blobs(per_rank * SIZE, d, centers, std, seed)


def assert_matches(ours: Any, ref: Any, labels: np.ndarray | None, rtol: float = 1e-10) -> None:
    """``ours`` (fitted on shards) equals ``ref`` (one process, all rows), on every rank."""
    scale = np.abs(ref.cluster_centers_).max()
    assert_everywhere(np.abs(ours.cluster_centers_ - ref.cluster_centers_).max() <= rtol * scale, "centres")
    assert_everywhere(ours.n_steps_ == ref.n_steps_, f"n_steps {ours.n_steps_} vs {ref.n_steps_}")
    assert_everywhere(abs(ours.inertia_ - ref.inertia_) <= rtol * ref.inertia_, "inertia")
    if labels is not None:
        assert_everywhere(np.array_equal(ours.labels_, labels), "labels")
    # Everything but labels_ is identical on every rank, bit for bit.
    assert_same_everywhere(ours.cluster_centers_)
    assert_same_everywhere(ours.inertia_)
    assert_same_everywhere(ours.n_steps_)


CASES = {
    "default": ({}, False),  # init_size >= n: the start is chosen from all rows, gathered
    "small batches, init sample": ({"batch_size": 128}, False),
    "random init, n_init=3, weighted": ({"batch_size": 256, "init": "random"}, True),
    "reassignment": ({"batch_size": 128, "init": "far"}, False),
    "k-means|| on the sample": ({"batch_size": 128, "init": "k-means||"}, False),
}


@pytest.mark.parametrize("executor", ["numpy", "compiled"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_same_result_as_one_process(case, executor, monkeypatch):
    # Both executors of the mini-batch pass (the data are small: left to itself a fit takes the
    # NumPy one); MPINB_NUMBA is read once per fit, the same on every rank.
    monkeypatch.setenv("MPINB_NUMBA", "0" if executor == "numpy" else "1")
    params, weighted = CASES[case]
    X = blobs()
    if params.get("init") == "far":
        params = dict(params, init=far_centres(X))
    fit_kwargs = {}
    if weighted:
        w = np.random.default_rng(2).uniform(0, 2, len(X))
        w[::9] = 0.0
        fit_kwargs = {"sample_weight": w}
    ref = MiniBatchKMeans(8, random_state=4, comm=MPI.COMM_SELF, **params).fit(X, **fit_kwargs)
    local_kwargs = {name: local(value) for name, value in fit_kwargs.items()}
    ours = MiniBatchKMeans(8, random_state=4, **params).fit(local(X), **local_kwargs)
    assert_matches(ours, ref, local(ref.labels_))
    assert_everywhere(ours.n_iter_ == ref.n_iter_, "n_iter")


def far_centres(X: np.ndarray) -> np.ndarray:
    """Three initial centres far from every row: reassigned to rows of the first mini-batch,
    which any rank may hold."""
    init = X[:8].copy()
    init[5:] = X.max(axis=0) + 100.0 * np.arange(1, 4)[:, None]
    return init


@kmeans_cases.sklearn_draws_as_mpinb
def test_matches_sklearn():
    X = blobs()
    theirs = SkMiniBatchKMeans(8, batch_size=128, random_state=6).fit(X)
    ours = MiniBatchKMeans(8, batch_size=128, random_state=6).fit(local(X))
    assert_matches(ours, theirs, local(theirs.labels_))
    # Distributed predict, transform (local) and score (collective) equal scikit-learn's on all rows.
    Xl = local(X)
    assert_everywhere(np.array_equal(ours.predict(Xl), local(theirs.predict(X))), "predict")
    expected = local(theirs.transform(X))
    assert_everywhere(np.allclose(ours.transform(Xl), expected, rtol=1e-10, atol=1e-10), "transform")
    score = ours.score(Xl)
    assert_same_everywhere(score)
    assert_everywhere(score == pytest.approx(theirs.score(X), rel=1e-10), f"score {score}")


@pytest.mark.mpi_sizes(2, 3, 4)
def test_empty_shard_on_one_rank():
    X = blobs()
    lo, hi = mpinb.shard_bounds(len(X), rank=RANK, size=SIZE - 1) if RANK < SIZE - 1 else (0, 0)
    ref = MiniBatchKMeans(8, batch_size=128, random_state=2, comm=MPI.COMM_SELF).fit(X)
    ours = MiniBatchKMeans(8, batch_size=128, random_state=2).fit(X[lo:hi])
    assert_matches(ours, ref, ref.labels_[lo:hi])
    assert_everywhere(ours.labels_.shape == (hi - lo,))
    # partial_fit with the empty rank in the union, first call and later ones.
    ref = MiniBatchKMeans(8, random_state=2, comm=MPI.COMM_SELF).partial_fit(X).partial_fit(X)
    ours = MiniBatchKMeans(8, random_state=2).partial_fit(X[lo:hi]).partial_fit(X[lo:hi])
    assert_matches(ours, ref, ref.labels_[lo:hi])


def test_partial_fit_over_shards():
    """Each call's mini-batch is the union of the ranks' rows: the same updates as one process
    given the concatenated batches, and as scikit-learn."""
    X = blobs()
    w = np.random.default_rng(3).uniform(0, 2, len(X))
    init = far_centres(X)  # so the second call reassigns, to rows any rank may hold
    batches = np.array_split(np.arange(len(X)), 4)
    theirs = SkMiniBatchKMeans(8, init=init, batch_size=200, random_state=1)
    ours = MiniBatchKMeans(8, init=init, batch_size=200, random_state=1)
    for rows in batches:
        theirs.partial_fit(X[rows], sample_weight=w[rows])
        ours.partial_fit(local(X[rows]), sample_weight=local(w[rows]))
        assert_matches(ours, theirs, local(theirs.labels_))
    # And from k-means++ on the first call's rows (more than batch_size: a gathered sample).
    theirs = SkMiniBatchKMeans(8, batch_size=200, random_state=1)
    ours = MiniBatchKMeans(8, batch_size=200, random_state=1)
    for rows in batches:
        theirs.partial_fit(X[rows])
        ours.partial_fit(local(X[rows]))
    assert_matches(ours, theirs, local(theirs.labels_))


def test_float32_shards():
    X = blobs().astype(np.float32)
    ref = MiniBatchKMeans(8, batch_size=128, random_state=0, comm=MPI.COMM_SELF).fit(X)
    ours = MiniBatchKMeans(8, batch_size=128, random_state=0).fit(local(X))
    assert_everywhere(ours.cluster_centers_.dtype == np.float32)
    assert_everywhere(np.abs(ours.cluster_centers_ - ref.cluster_centers_).max() <= 1e-5, "centres")
    assert_same_everywhere(ours.cluster_centers_)


# ---------------------------------------------------------------------------------------------
# Bad input: the same error on every rank, and the communicator still works


def last_rank_gets(bad: Any, good: Any) -> Any:
    return bad if RANK == SIZE - 1 else good


@pytest.mark.parametrize("value, kind", [(np.nan, "NaN"), (-np.inf, "infinity")])
def test_non_finite_value_on_one_rank(value, kind):
    X = local(blobs()).copy()
    if RANK == SIZE - 1:
        X[2, 1] = value
    where = "on the only rank" if SIZE == 1 else f"on rank {SIZE - 1} of {SIZE}"
    message = rf"^X_local contains {kind} \(first at local row 2\); .* \[{where}\]$"
    with raises_everywhere(ValueError, match=message):
        MiniBatchKMeans(3).fit(X)
    with raises_everywhere(ValueError, match=message):
        MiniBatchKMeans(3).partial_fit(X)
    fitted = MiniBatchKMeans(3, random_state=0).partial_fit(local(blobs()))
    with raises_everywhere(ValueError, match=message):
        fitted.partial_fit(X)


@pytest.mark.mpi_sizes(2, 3, 4)
def test_different_n_features():
    X = local(blobs())
    bad = last_rank_gets(np.hstack([X, X[:, :1]]), X)
    differ = r"the number of features \(columns of X_local\) must be the same on every rank"
    with raises_everywhere(CollectiveMismatchError, match=differ):
        MiniBatchKMeans(3).fit(bad)
    with raises_everywhere(CollectiveMismatchError, match=differ):
        MiniBatchKMeans(3).partial_fit(bad)
    mbk = MiniBatchKMeans(3, random_state=0).partial_fit(X)
    where = rf"\[on rank {SIZE - 1} of {SIZE}\]$"
    message = r"X_local has 5 features, but MiniBatchKMeans was fitted with 4 features\. " + where
    with raises_everywhere(ValueError, match=message):
        mbk.partial_fit(bad)
    mbk.partial_fit(X)  # still usable, on every rank
    assert_same_everywhere(mbk.cluster_centers_)


def test_partial_fit_with_other_n_features_than_the_first_call():
    X = local(blobs())
    mbk = MiniBatchKMeans(3, random_state=0).partial_fit(X)
    with raises_everywhere(ValueError, match=r"X_local has 3 features, but MiniBatchKMeans was fitted with"):
        mbk.partial_fit(X[:, :3])


def test_fewer_samples_than_clusters():
    with raises_everywhere(ValueError, match=rf"n_clusters must be <= the total number of samples \({SIZE} "):
        MiniBatchKMeans(SIZE + 1).fit(np.ones((1, 3)) * RANK)
    with raises_everywhere(ValueError, match=rf"n_clusters must be <= the total number of samples \({SIZE} "):
        MiniBatchKMeans(SIZE + 1).partial_fit(np.ones((1, 3)) * RANK)


@pytest.mark.parametrize("batch_size, exc", [(0, ValueError), (2.5, TypeError)])
def test_bad_batch_size(batch_size, exc):
    message = rf"batch_size must be a positive integer number of rows over all ranks; got {batch_size}"
    with raises_everywhere(exc, match=message):
        MiniBatchKMeans(3, batch_size=batch_size).fit(local(blobs()))


@pytest.mark.mpi_sizes(2, 3, 4)
@pytest.mark.parametrize("param", ["batch_size", "random_state", "reassignment_ratio", "init"])
def test_different_hyper_parameters(param):
    X = blobs()
    values = {"batch_size": (100, 200), "random_state": (0, 1), "reassignment_ratio": (0.01, 0.02),
              "init": (X[:3], X[:3] + 1.0)}[param]
    kwargs = {"n_clusters": 3, param: last_rank_gets(values[1], values[0])}
    message = rf"the MiniBatchKMeans configuration must be the same on every rank.*{param}"
    with raises_everywhere(CollectiveMismatchError, match=message):
        MiniBatchKMeans(**kwargs).fit(local(X))


@pytest.mark.mpi_sizes(2, 3, 4)
def test_callable_init_that_differs_between_ranks():
    X = blobs()

    def init(X_sample, k, random_state):
        return X_sample[:k] + (RANK == SIZE - 1)

    message = r"what init\(X_sample, n_clusters, random_state\) returned .* must be the same on every rank"
    with raises_everywhere(CollectiveMismatchError, match=message):
        MiniBatchKMeans(3, init=init).fit(local(X))


def test_callable_init_raising_on_one_rank():
    where = "on the only rank" if SIZE == 1 else f"on rank {SIZE - 1} of {SIZE}"

    def init(X_sample, k, random_state):
        if RANK == SIZE - 1:
            raise RuntimeError("no centres on this rank")
        return X_sample[:k]

    with raises_everywhere(RuntimeError, match=rf"^no centres on this rank \[{where}\]$"):
        MiniBatchKMeans(3, init=init).fit(local(blobs()))


# ---------------------------------------------------------------------------------------------
# Interrupts and communication per mini-batch


@pytest.mark.parametrize("how", ["sigint", "request"])
def test_interrupt_stops_every_rank_at_the_same_mini_batch(how):
    X = blobs()
    mbk = MiniBatchKMeans(8, batch_size=64, max_no_improvement=None, max_iter=1)
    assert_interrupt_stops_together(mbk, local(X), "step", how, r"mini-batch 4\)")


def test_one_allreduce_per_mini_batch():
    from support.counting import CountingComm

    X = blobs(400)
    batch = 100
    calls = {}
    for max_iter in (1, 2):
        base = COMM.Dup()
        comm = CountingComm(base)
        mpinb.world(comm)  # mpinb's one-off set-up on a communicator new to it
        del comm.calls[:]
        mbk = MiniBatchKMeans(8, batch_size=batch, max_iter=max_iter, max_no_improvement=None,
                              reassignment_ratio=0.0, random_state=0, comm=comm).fit(local(X))
        assert_everywhere(mbk.n_steps_ == max_iter * len(X) // batch, "ran every mini-batch")
        calls[max_iter] = Counter(name for name, _ in comm.calls if "probe" not in name)  # probes: notices
        base.Free()
    extra = calls[2] - calls[1]
    steps = len(X) // batch
    # Each mpinb collective is one arrival message plus its data: two Iallreduce per mini-batch.
    expected = {"Iallreduce": 2 * steps} if SIZE > 1 else {}
    assert_everywhere(dict(extra) == expected, f"{steps} more mini-batches cost {dict(extra)}")
    # Set-up and finish: checks, the shard summary, the gathered init sample, the final inertia.
    assert_everywhere(sum(calls[1].values()) - 2 * steps <= 30, f"setup and finish use {dict(calls[1])}")


def test_verbose_prints_on_rank_0_only():
    X = local(blobs())
    with contextlib.redirect_stdout(io.StringIO()) as out:
        MiniBatchKMeans(8, batch_size=200, random_state=0, max_iter=1, verbose=1).fit(X)
    printed = out.getvalue()
    assert_everywhere(("Minibatch step 1/" in printed) == (RANK == 0), f"rank {RANK} printed {printed[:80]!r}")
    # It must agree across ranks like every parameter (a verbose fit reduces the inertia of a
    # single start, which it otherwise skips).
    if SIZE > 1:
        with raises_everywhere(CollectiveMismatchError, match=r"the MiniBatchKMeans configuration .*verbose"):
            MiniBatchKMeans(8, batch_size=200, random_state=0, verbose=int(RANK == 0)).fit(X)
