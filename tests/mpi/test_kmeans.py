"""mpinb.KMeans under mpiexec at 1-4 ranks: agreement with scikit-learn, independence of the number
of ranks, collective errors, empty shards, interrupts and the one-Allreduce-per-iteration rule,
each on both executors of the row passes (NumPy and compiled)."""

from __future__ import annotations

import warnings
from collections import Counter
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI
from sklearn.cluster import KMeans as SkKMeans
from sklearn.exceptions import ConvergenceWarning

import mpinb
from mpinb import CollectiveMismatchError, KMeans
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


def blobs(per_rank: int = 600, d: int = 5, centers: int = 6, std: float = 3.0, seed: int = 0) -> np.ndarray:
    return kmeans_cases.blobs(per_rank * SIZE, d, centers, std, seed)


CASES = kmeans_cases.agreement_cases(600 * SIZE, 500 * SIZE)


@pytest.fixture(autouse=True, params=["numpy", "compiled"])
def executor(request, monkeypatch):
    """Every test here runs on both executors of the row passes: the data are small, so left to
    itself a fit would always take the NumPy one (MPINB_NUMBA is read at each fit, the same on
    every rank)."""
    monkeypatch.setenv("MPINB_NUMBA", "off" if request.param == "numpy" else "on")
    return request.param


def assert_matches(ours: KMeans, ref: Any, X: np.ndarray, rtol: float = 1e-10) -> None:
    """``ours`` (fitted on this rank's shard) equals ``ref`` (fitted on all of X), on every rank."""
    scale = np.abs(ref.cluster_centers_).max()
    assert_everywhere(np.abs(ours.cluster_centers_ - ref.cluster_centers_).max() <= rtol * scale, "centres")
    assert_everywhere(np.array_equal(ours.labels_, local(ref.labels_)), "labels")
    assert_everywhere(ours.n_iter_ == ref.n_iter_, f"n_iter {ours.n_iter_} vs {ref.n_iter_}")
    assert_everywhere(abs(ours.inertia_ - ref.inertia_) <= rtol * ref.inertia_, "inertia")
    # Everything but labels_ is identical on every rank, bit for bit.
    assert_same_everywhere(ours.cluster_centers_)
    assert_same_everywhere(ours.inertia_)
    assert_same_everywhere(ours.n_iter_)
    assert_same_everywhere(ours.inertia_history_)


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_sklearn_from_same_init(case):
    X, init = CASES[case]()
    k = init.shape[0]
    ref = SkKMeans(k, init=init, n_init=1, algorithm="lloyd").fit(X)
    ours = KMeans(k, init=init).fit(local(X))
    assert_matches(ours, ref, X)


def test_sample_weight_matches_sklearn():
    X = blobs()
    w = np.random.default_rng(1).uniform(0, 2, len(X))
    ref = SkKMeans(6, init=X[:6], n_init=1, algorithm="lloyd").fit(X, sample_weight=w)
    ours = KMeans(6, init=X[:6]).fit(local(X), sample_weight=local(w))
    assert_matches(ours, ref, X)


@pytest.mark.parametrize("init", ["k-means++", "k-means||", "random"])
def test_same_random_state_same_result_at_any_number_of_ranks(init):
    X = blobs(400, 4, 8, 2.5, seed=5)
    ref = KMeans(8, init=init, n_init=2, random_state=7, comm=MPI.COMM_SELF).fit(X)
    ours = KMeans(8, init=init, n_init=2, random_state=7).fit(local(X))
    assert_matches(ours, ref, X)


def test_kmeans_plusplus_matches_sklearn_seeding():
    X = blobs(400, 4, 8, 2.5, seed=6)
    ref = SkKMeans(8, init="k-means++", random_state=3, algorithm="lloyd").fit(X)
    ours = KMeans(8, init="k-means++", random_state=3).fit(local(X))
    assert_matches(ours, ref, X)


@pytest.mark.mpi_sizes(2, 3, 4)
def test_empty_shard_on_one_rank():
    X = blobs()
    lo, hi = mpinb.shard_bounds(len(X), rank=RANK, size=SIZE - 1) if RANK < SIZE - 1 else (0, 0)
    ref = KMeans(6, random_state=2, comm=MPI.COMM_SELF).fit(X)
    ours = KMeans(6, random_state=2).fit(X[lo:hi])
    assert_everywhere(np.abs(ours.cluster_centers_ - ref.cluster_centers_).max() <= 1e-10 * np.abs(X).max())
    assert_everywhere(np.array_equal(ours.labels_, ref.labels_[lo:hi]), "labels")
    assert_everywhere(ours.labels_.shape == (hi - lo,))
    assert_same_everywhere(ours.inertia_)
    assert_everywhere(abs(ours.inertia_ - ref.inertia_) <= 1e-10 * ref.inertia_)


def test_float32_shards():
    X = blobs(800, 6, 6, 2.0, seed=8).astype(np.float32)
    ref = KMeans(6, init=X[:6], comm=MPI.COMM_SELF).fit(X)
    ours = KMeans(6, init=X[:6]).fit(local(X))
    assert_everywhere(ours.cluster_centers_.dtype == np.float32)
    assert_everywhere(np.abs(ours.cluster_centers_ - ref.cluster_centers_).max() <= 1e-5)
    assert_everywhere((ours.labels_ != local(ref.labels_)).mean() <= 1e-3)


def test_predict_transform_score_on_shards_equal_sklearn_on_all_rows():
    """Each rank passes its shard; predictions and distances (gathered in rank order) and the
    collective score equal scikit-learn's on all rows, with and without weights."""
    X = blobs()
    w = np.random.default_rng(3).uniform(0, 2, len(X))
    ref = SkKMeans(6, init=X[:6], n_init=1, algorithm="lloyd").fit(X)
    km = KMeans(6, init=X[:6]).fit(local(X))
    new = blobs(seed=11)  # rows the model has not seen
    labels = mpinb.gather_rows(km.predict(local(new)), root=None)
    assert_everywhere(np.array_equal(labels, ref.predict(new)), "predict over shards")
    dist = mpinb.gather_rows(km.transform(local(new)), root=None)
    assert_everywhere(np.allclose(dist, ref.transform(new), rtol=1e-9, atol=1e-9), "transform over shards")
    score = km.score(local(new))
    assert_same_everywhere(score)
    assert_everywhere(score == pytest.approx(ref.score(new), rel=1e-10), f"score {score} vs {ref.score(new)}")
    weighted = km.score(local(new), sample_weight=local(w))
    assert_everywhere(weighted == pytest.approx(ref.score(new, sample_weight=w), rel=1e-10), "weighted score")
    assert_everywhere(km.score(local(X)) == pytest.approx(-km.inertia_, rel=1e-12), "score of the fitted rows")
    assert_everywhere(np.array_equal(km.predict(local(X)), km.labels_), "predict of the fitted rows")


def test_predict_and_transform_are_local():
    """No communication: a call on one rank only returns (it would hang if it waited for the others)."""
    X = blobs()
    km = KMeans(6, init=X[:6]).fit(local(X))
    if RANK == SIZE - 1:
        assert km.predict(X[:5]).shape == (5,)
        assert km.transform(X[:5]).shape == (5, 6)
    COMM.Barrier()


def test_score_errors_reach_every_rank():
    X = blobs()
    km = KMeans(6, init=X[:6]).fit(local(X))
    bad = local(X).copy()
    if RANK == SIZE - 1 and len(bad):
        bad[0, 0] = np.nan
    with raises_everywhere(ValueError, "contains NaN"):
        km.score(bad)
    narrow = local(X)[:, :3] if RANK == 0 else local(X)
    with raises_everywhere(ValueError, "features"):
        km.score(narrow)
    if SIZE > 1:
        other = KMeans(6, init=X[:6]).fit(local(X))
        if RANK == 1:
            other.cluster_centers_ = other.cluster_centers_ + 1.0  # as if refitted alone
        with raises_everywhere(CollectiveMismatchError, "cluster_centers_"):
            other.score(local(X))
    assert_everywhere(km.score(local(X)) == pytest.approx(-km.inertia_, rel=1e-12), "score after the errors")


# ---------------------------------------------------------------------------------------------
# A callable init: called on every rank with its own shard, checked to agree


def test_callable_init_with_fixed_centres():
    X = blobs()
    ours = KMeans(6, init=kmeans_cases.fixed_centres(X, 6), n_init=1).fit(local(X))
    assert_matches(ours, SkKMeans(6, init=X[:6], n_init=1, algorithm="lloyd").fit(X), X)


def test_callable_init_from_random_state_is_independent_of_the_number_of_ranks():
    X = blobs(400, 4, 8, 2.5, seed=5)
    drawn = kmeans_cases.drawn_centres(-10.0, 10.0, 4)
    draws = []

    def init(X_local, n_clusters, random_state):
        draws.append(isinstance(random_state, np.random.RandomState))
        return drawn(X_local, n_clusters, random_state)

    ref = KMeans(8, init=drawn, random_state=4, comm=MPI.COMM_SELF).fit(X)
    ours = KMeans(8, init=init, random_state=4).fit(local(X))
    assert_everywhere(draws == [True] * 10, f"n_init='auto' ran the callable {len(draws)} times")
    assert_matches(ours, ref, X)


@pytest.mark.mpi_sizes(2, 3, 4)
def test_callable_init_that_picks_rows_of_its_shard():
    X = blobs()
    with raises_everywhere(
        CollectiveMismatchError,
        match=r"^init\(X_local, n_clusters, random_state\) returned different centres on different ranks "
        r"\(ranks that agree: 0 \| 1\b.*must not depend on the rows of X_local",
    ):
        KMeans(6, init=lambda X_local, k, random_state: X_local[:k]).fit(local(X))


@pytest.mark.mpi_sizes(2, 3, 4)
def test_callable_init_whose_draws_depend_on_the_shard():
    X = blobs()

    def init(X_local, k, random_state):
        random_state.random_sample(1 + (RANK == SIZE - 1))
        return X[:k].copy()

    with raises_everywhere(
        CollectiveMismatchError,
        match=rf"left random_state in different states on different ranks \(ranks that agree: "
        rf"{', '.join(map(str, range(SIZE - 1)))} \| {SIZE - 1}\)",
    ):
        KMeans(6, init=init, n_init=1).fit(local(X))


def test_callable_init_raising_on_one_rank():
    X = blobs()
    where = "on the only rank" if SIZE == 1 else f"on rank {SIZE - 1} of {SIZE}"

    def init(X_local, k, random_state):
        if RANK == SIZE - 1:
            raise RuntimeError("no centres on this rank")
        return X[:k].copy()

    with raises_everywhere(RuntimeError, match=rf"^no centres on this rank \[{where}\]$"):
        KMeans(6, init=init).fit(local(X))


def test_callable_init_of_wrong_shape_on_one_rank():
    X = blobs()

    def init(X_local, k, random_state):
        return X[: k + (RANK == SIZE - 1)].copy()

    message = r"returned an array of shape \(7, 5\), but it must be \(n_clusters, n_features\) = \(6, 5\)"
    with raises_everywhere(ValueError, match=message):
        KMeans(6, init=init).fit(local(X))


# ---------------------------------------------------------------------------------------------
# transform and more clusters than distinct points


@pytest.mark.parametrize("seed", range(4))
def test_transform_of_centres_has_zero_diagonal(seed):
    X = blobs(250, 5, 4, 1.0)
    km = KMeans(8, random_state=seed).fit(local(X))
    Xt = km.transform(km.cluster_centers_)
    assert_everywhere(np.array_equal(Xt.diagonal(), np.zeros(8)), f"zero diagonal {Xt.diagonal()}")
    exact = np.sqrt(((km.cluster_centers_[:, None] - km.cluster_centers_[None]) ** 2).sum(-1))
    assert_everywhere(np.allclose(Xt, exact, rtol=1e-12, atol=0), "pairwise distances")


@pytest.mark.parametrize("repeat", [1, 30])
def test_relocating_with_duplicates_stops_after_one_iteration(repeat):
    """scikit-learn issue 28055, with the rows spread over the ranks (some may hold none)."""
    X = kmeans_cases.duplicates(repeat * SIZE)
    init = kmeans_cases.duplicates(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ref = SkKMeans(5, init=init, n_init=1, algorithm="lloyd").fit(X)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = KMeans(5, init=init).fit(local(X))
    message = "Number of distinct clusters (4) found smaller than n_clusters (5)"
    assert_everywhere(
        any(w.category is ConvergenceWarning and message in str(w.message) for w in caught), "warning"
    )
    assert_everywhere(ours.n_iter_ == ref.n_iter_ == 1, f"n_iter_ {ours.n_iter_}")
    assert_everywhere(np.array_equal(ours.labels_, local(ref.labels_)), "labels")
    assert_everywhere(np.abs(ours.cluster_centers_ - ref.cluster_centers_).max() <= 1e-13, "centres")
    assert_everywhere(ours.inertia_ <= 1e-25, f"inertia {ours.inertia_}")
    assert_same_everywhere(ours.cluster_centers_)


# ---------------------------------------------------------------------------------------------
# Bad input: the same error on every rank, and the communicator still works


def last_rank_gets(bad: Any, good: Any) -> Any:
    return bad if RANK == SIZE - 1 else good


def test_nan_on_one_rank():
    X = local(blobs()).copy()
    if RANK == SIZE - 1:
        X[2, 1] = np.nan
    with raises_everywhere(ValueError, match=r"X_local contains NaN \(first at local row 2\)"):
        KMeans(3).fit(X)


@pytest.mark.mpi_sizes(2, 3, 4)
def test_different_n_features():
    X = local(blobs(d=5))
    X = last_rank_gets(np.hstack([X, X[:, :1]]), X)
    with raises_everywhere(CollectiveMismatchError,
                           match=r"the number of features \(columns of X_local\) must be the same on every rank"):
        KMeans(3, init="random").fit(X)


def test_fewer_samples_than_clusters():
    with raises_everywhere(ValueError, match=rf"n_clusters must be <= the total number of samples \({SIZE} "):
        KMeans(SIZE + 1).fit(np.ones((1, 3)) * RANK)


def test_n_clusters_not_positive():
    with raises_everywhere(ValueError, match=r"n_clusters must be a positive integer; got 0"):
        KMeans(0).fit(local(blobs()))


def test_init_array_of_wrong_shape_on_one_rank():
    X = blobs()
    init = last_rank_gets(X[:4], X[:3])
    with raises_everywhere(ValueError,
                           match=r"init has shape \(4, 5\), but it must be \(n_clusters, n_features\) = \(3, 5\)"):
        KMeans(3, init=init).fit(local(X))


@pytest.mark.mpi_sizes(2, 3, 4)
def test_init_arrays_differ_between_ranks():
    X = blobs()
    with raises_everywhere(CollectiveMismatchError, match="the KMeans configuration must be the same on every rank"):
        KMeans(3, init=X[:3] + (RANK == SIZE - 1)).fit(local(X))


def test_negative_sample_weight_on_one_rank():
    X = local(blobs())
    w = np.ones(len(X))
    w[0] = last_rank_gets(-2.0, 1.0)
    with raises_everywhere(ValueError, match=r"sample_weight must be finite and non-negative; got a minimum of -2\.0"):
        KMeans(3).fit(X, sample_weight=w)


def test_sample_weight_length_mismatch_on_one_rank():
    X = local(blobs())
    w = np.ones(len(X) - (RANK == SIZE - 1))
    with raises_everywhere(ValueError, match=r"sample_weight has shape .* but X_local has \d+ rows"):
        KMeans(3).fit(X, sample_weight=w)


@pytest.mark.mpi_sizes(2, 3, 4)
@pytest.mark.parametrize("param", ["n_clusters", "random_state", "tol"])
def test_different_hyper_parameters(param):
    values = {"n_clusters": (5, 6), "random_state": (0, 1), "tol": (1e-4, 1e-3)}[param]
    kwargs = {"n_clusters": 5, param: last_rank_gets(values[1], values[0])}
    with raises_everywhere(CollectiveMismatchError,
                           match=rf"the KMeans configuration must be the same on every rank.*{param}"):
        KMeans(**kwargs).fit(local(blobs()))


# ---------------------------------------------------------------------------------------------
# Interrupts and communication per iteration


def hard_data() -> np.ndarray:
    """Uniform noise: Lloyd keeps moving for many iterations."""
    return np.random.default_rng(4).uniform(size=(500 * SIZE, 4))


@pytest.mark.parametrize("how", ["sigint", "request"])
def test_interrupt_stops_every_rank_at_the_same_iteration(how):
    X = hard_data()
    km = KMeans(20, init=X[:20], max_iter=100, tol=0)
    assert_interrupt_stops_together(km, local(X), "iteration", how, r"iteration 4\)")


def test_one_allreduce_per_iteration():
    from support.counting import CountingComm

    X = hard_data()
    calls = {}
    for max_iter in (3, 7):
        base = COMM.Dup()
        comm = CountingComm(base)
        mpinb.world(comm)  # mpinb's one-off set-up on a communicator new to it
        del comm.calls[:]
        km = KMeans(20, init=X[:20], max_iter=max_iter, tol=0, comm=comm).fit(local(X))
        assert_everywhere(km.n_iter_ == max_iter, "did not converge early")
        calls[max_iter] = Counter(name for name, _ in comm.calls if "probe" not in name)  # probes: notices
        base.Free()
    extra = calls[7] - calls[3]
    # Each mpinb collective is one arrival message plus its data: two Iallreduce per iteration.
    assert_everywhere(dict(extra) == ({"Iallreduce": 8} if SIZE > 1 else {}), f"4 more iterations cost {dict(extra)}")
    # Nothing else happens per iteration: the whole fit is setup plus one collective per iteration.
    assert_everywhere(sum(calls[3].values()) <= 24, f"setup and finish use {dict(calls[3])}")
