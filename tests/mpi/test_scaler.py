"""mpinb.StandardScaler under mpiexec at 1, 2 and 4 ranks: fitted on uneven shards it equals
scikit-learn fitted on their union, the same on every rank; bad input on one rank raises one error
on every rank; ahead of KMeans in a Pipeline on every rank."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI
from sklearn.cluster import KMeans as SkKMeans
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler as SkScaler

import mpinb
from mpinb import CollectiveMismatchError, StandardScaler
from support.mpitools import assert_everywhere, assert_same_everywhere, raises_everywhere, uneven

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
ATTRIBUTES = ("mean_", "var_", "scale_")


def rows(n: int = 300, seed: int = 0, offset: float = 0.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.normal([3.0, -200.0, 0.5, 9.0], [1.0, 40.0, 1e-3, 2.0], size=(n * SIZE, 4)) + offset


def assert_matches(ours: StandardScaler, ref: SkScaler, rtol: float = 1e-12) -> None:
    for name in ATTRIBUTES:
        mine, theirs = getattr(ours, name), getattr(ref, name)
        if theirs is None:
            assert_everywhere(mine is None, f"{name} is None")
            continue
        worst = float(np.max(np.abs(mine - theirs) / np.abs(theirs)))
        assert_everywhere(worst <= rtol, f"{name}: relative difference {worst:.1e}")
        assert_same_everywhere(mine)
    seen = ours.n_samples_seen_ == pytest.approx(ref.n_samples_seen_, rel=1e-12)
    assert_everywhere(seen, "n_samples_seen_")


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("with_mean, with_std", [(True, True), (False, True), (True, False)])
def test_uneven_shards_equal_sklearn_on_the_union(weighted, with_mean, with_std):
    X = rows(offset=1e6)  # a large mean: the moments are taken about the global mean
    w = np.random.default_rng(1).uniform(0, 2, len(X)) if weighted else None
    ref = SkScaler(with_mean=with_mean, with_std=with_std).fit(X, sample_weight=w)
    X_local, w_local = uneven(X, X[:, 0] if w is None else w)
    ours = StandardScaler(with_mean=with_mean, with_std=with_std)
    ours.fit(X_local, sample_weight=None if w is None else w_local)
    assert_matches(ours, ref)
    mine = ours.transform(X_local)
    # Means near 1e6 summed in another order differ by a few of their last bits (here up to 7),
    # and a feature of spread 1e-3 scales that by 1e3: 64 last bits, scaled, per feature.
    scale = ours.scale_ if with_std else 1.0
    tol = 64 * np.finfo(np.float64).eps * np.abs(X).max(axis=0) / scale
    assert_everywhere((np.abs(mine - uneven(ref.transform(X))) <= tol).all(), "transform")
    assert_everywhere(np.allclose(ours.inverse_transform(mine), X_local, rtol=1e-13), "inverse_transform")


@pytest.mark.mpi_sizes(2, 4)
def test_empty_shards_on_some_ranks():
    X = rows(seed=2)
    ours = StandardScaler().fit(uneven(X, shares=(0, 3, 0, 1)))
    assert_matches(ours, SkScaler().fit(X))


def test_partial_fit_over_batches_equals_sklearns():
    X = rows(400, seed=3)
    ours, ref = StandardScaler(), SkScaler()
    for lo, hi in ((0, 7), (7, 8), (8, 250 * SIZE), (250 * SIZE, 400 * SIZE)):
        ref.partial_fit(X[lo:hi])
        ours.partial_fit(uneven(X[lo:hi], shares=(2, 0, 1, 3)))
    assert_matches(ours, ref)
    assert_matches(ours, SkScaler().fit(X))


def test_two_allreduces_and_no_mpi_call_outside_the_collective_layer(monkeypatch):
    import mpinb._collective
    from support.counting import CountingComm, count_calls

    reductions = count_calls(monkeypatch, mpinb._collective, "reduce_in_place")
    base = COMM.Dup()
    comm = CountingComm(base)
    StandardScaler(comm=comm).fit(uneven(rows()))
    assert_everywhere(len(reductions) == 2, f"{len(reductions)} reductions")
    assert_everywhere(comm.outside() == [], f"MPI calls outside mpinb._collective: {comm.outside()}")
    base.Free()


def test_in_a_pipeline_ahead_of_kmeans():
    X = rows(seed=4)[:, [0, 1, 3]]
    init = SkScaler().fit_transform(X)[:3]
    ref = make_pipeline(SkScaler(), SkKMeans(3, init=init, n_init=1, algorithm="lloyd")).fit(X)
    X_local = uneven(X)
    ours = make_pipeline(StandardScaler(), mpinb.KMeans(3, init=init)).fit(X_local)
    assert_everywhere(np.array_equal(ours.predict(X_local), uneven(ref.predict(X))), "labels")
    assert_everywhere(np.abs(ours[-1].cluster_centers_ - ref[-1].cluster_centers_).max() <= 1e-10, "centres")
    assert_same_everywhere(ours[-1].cluster_centers_)


# ---------------------------------------------------------------------------------------------
# Bad input on one rank: one error on every rank


def last_rank_gets(bad, good):
    return bad if RANK == SIZE - 1 else good


def test_nan_on_one_rank():
    X = uneven(rows()).copy()
    X = last_rank_gets(np.vstack([X, [[1.0, np.nan, 2.0, 3.0]]]), X)
    with raises_everywhere(ValueError, match=r"X_local contains NaN \(first at local row \d+\)"):
        StandardScaler().fit(X)


@pytest.mark.mpi_sizes(2, 4)
def test_different_n_features():
    X = uneven(rows())
    with raises_everywhere(
        CollectiveMismatchError, match=r"the number of features \(columns of X_local\) must"
    ):
        StandardScaler().fit(last_rank_gets(X[:, :3], X))


@pytest.mark.mpi_sizes(2, 4)
def test_different_parameters():
    with raises_everywhere(
        CollectiveMismatchError, match="the StandardScaler configuration must be the same"
    ):
        StandardScaler(with_std=last_rank_gets(False, True)).fit(uneven(rows()))


def test_no_rows_anywhere_and_bad_weights_on_one_rank():
    with raises_everywhere(ValueError, match="StandardScaler.fit got 0 rows on every rank"):
        StandardScaler().fit(np.ones((0, 4)))
    X = uneven(rows())
    w = last_rank_gets(-np.ones(len(X)), np.ones(len(X)))
    with raises_everywhere(
        ValueError, match="sample_weight must be finite and non-negative; got a minimum of -1"
    ):
        StandardScaler().fit(X, sample_weight=w)
    fitted = StandardScaler().fit(X)
    with raises_everywhere(ValueError, match="X_local has 3 features, but StandardScaler was fitted with 4"):
        fitted.partial_fit(last_rank_gets(X[:, :3], X))
    assert_everywhere(fitted.partial_fit(X).n_samples_seen_ == 2 * len(rows()), "usable afterwards")
