"""mpinb.PCA under mpiexec at 1, 2 and 4 ranks: fitted on uneven shards it equals scikit-learn's
exact PCA fitted on their union (components with its signs, variances), the same on every rank;
bad input on one rank raises one error on every rank; in a Pipeline ahead of KMeans."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI
from sklearn.cluster import KMeans as SkKMeans
from sklearn.decomposition import PCA as SkPCA
from sklearn.pipeline import make_pipeline

import mpinb
from mpinb import PCA, CollectiveMismatchError
from support.mpitools import assert_everywhere, assert_same_everywhere, raises_everywhere, uneven

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
FITTED = ("components_", "explained_variance_", "explained_variance_ratio_", "singular_values_", "mean_")


def rows(n: int = 250, d: int = 6, offset: float = 10.0, seed: int = 0) -> np.ndarray:
    """Correlated features with well-separated variances (so each component is well defined)."""
    rng = np.random.default_rng(seed)
    mix = np.linalg.qr(rng.normal(size=(d, d)))[0]
    return rng.normal(size=(n * SIZE, d)) * np.geomspace(5.0, 0.1, d) @ mix + offset


def assert_matches(ours: PCA, ref: SkPCA, rtol: float = 1e-10) -> None:
    assert_everywhere(ours.n_components_ == ref.n_components_, f"n_components_ {ours.n_components_}")
    top = float(ref.explained_variance_[0])
    def worst(a, b):
        return float(np.abs(a - b).max(initial=0.0))

    diffs = {
        "components_": worst(ours.components_, ref.components_),
        "explained_variance_": worst(ours.explained_variance_, ref.explained_variance_) / top,
        "explained_variance_ratio_": worst(ours.explained_variance_ratio_, ref.explained_variance_ratio_),
        "singular_values_": np.abs(ours.singular_values_ / ref.singular_values_ - 1).max(initial=0.0),
        "mean_": np.abs(ours.mean_ - ref.mean_).max() / np.abs(ref.mean_).max(),
        "noise_variance_": abs(ours.noise_variance_ - ref.noise_variance_) / top,
    }
    bad = {k: f"{v:.1e}" for k, v in diffs.items() if not v <= rtol}
    assert_everywhere(not bad, f"differences {bad}")
    for name in FITTED:
        assert_same_everywhere(getattr(ours, name))
    assert_same_everywhere(ours.noise_variance_)


@pytest.mark.parametrize("n_components, whiten", [(None, False), (3, True), (0.95, False)])
def test_uneven_shards_equal_sklearn_on_the_union(n_components, whiten):
    X = rows(offset=1e5)  # a large mean: the scatter matrix is taken about the global mean
    ref = SkPCA(n_components, whiten=whiten, svd_solver="full").fit(X)
    X_local = uneven(X)
    ours = PCA(n_components, whiten=whiten).fit(X_local)
    assert_matches(ours, ref, rtol=1e-9)
    Z = ours.transform(X_local)
    assert_everywhere(np.allclose(Z, uneven(ref.transform(X)), rtol=0, atol=1e-8), "transform")
    assert_everywhere(np.allclose(ours.inverse_transform(Z), uneven(ref.inverse_transform(ref.transform(X))),
                                  rtol=1e-12), "inverse_transform")
    if n_components is not None:
        assert_everywhere(ours.score(X_local) == pytest.approx(ref.score(X), rel=1e-9), "score")


@pytest.mark.mpi_sizes(2, 4)
def test_empty_shards_on_some_ranks():
    X = rows(seed=1)
    ours = PCA(4).fit(uneven(X, shares=(0, 3, 0, 1)))
    assert_matches(ours, SkPCA(4, svd_solver="full").fit(X))


def test_two_allreduces_and_no_mpi_call_outside_the_collective_layer(monkeypatch):
    import mpinb._collective
    from support.counting import CountingComm, count_calls

    reductions = count_calls(monkeypatch, mpinb._collective, "reduce_in_place")
    base = COMM.Dup()
    comm = CountingComm(base)
    PCA(2, comm=comm).fit(uneven(rows()))
    assert_everywhere(len(reductions) == 2, f"{len(reductions)} reductions")
    assert_everywhere(comm.outside() == [], f"MPI calls outside mpinb._collective: {comm.outside()}")
    base.Free()


def test_scaler_pca_kmeans_pipeline():
    X = rows(seed=2)
    ref_steps = make_pipeline(mpinb.StandardScaler(comm=MPI.COMM_SELF), SkPCA(2, svd_solver="full"))
    init = ref_steps.fit_transform(X)[:3]
    ref = make_pipeline(mpinb.StandardScaler(comm=MPI.COMM_SELF), SkPCA(2, svd_solver="full"),
                        SkKMeans(3, init=init, n_init=1, algorithm="lloyd")).fit(X)
    X_local = uneven(X)
    ours = make_pipeline(mpinb.StandardScaler(), PCA(2), mpinb.KMeans(3, init=init)).fit(X_local)
    assert_everywhere(np.array_equal(ours.predict(X_local), uneven(ref.predict(X))), "labels")
    assert_everywhere(np.abs(ours[-1].cluster_centers_ - ref[-1].cluster_centers_).max() <= 1e-9, "centres")


# ---------------------------------------------------------------------------------------------
# Bad input on one rank: one error on every rank


def last_rank_gets(bad, good):
    return bad if RANK == SIZE - 1 else good


def test_nan_on_one_rank():
    X = uneven(rows()).copy()
    X = last_rank_gets(np.vstack([X, np.full((1, X.shape[1]), np.inf)]), X)
    with raises_everywhere(ValueError, match=r"X_local contains infinity \(first at local row \d+\)"):
        PCA(2).fit(X)


@pytest.mark.mpi_sizes(2, 4)
def test_different_n_features_and_parameters():
    X = uneven(rows())
    with raises_everywhere(
        CollectiveMismatchError, match=r"the number of features \(columns of X_local\) must"
    ):
        PCA(2).fit(last_rank_gets(X[:, :5], X))
    with raises_everywhere(CollectiveMismatchError, match="the PCA configuration must be the same on every"):
        PCA(last_rank_gets(3, 2)).fit(X)


def test_n_components_above_the_samples_or_features():
    X = uneven(rows())
    with raises_everywhere(ValueError, match=rf"n_components must be <= min\(n_samples, n_features\) = "
                                             rf"min\({250 * SIZE:,}, 6\) = 6; got 7"):
        PCA(7).fit(X)
    few = np.random.default_rng(RANK).normal(size=(2, 12))  # two rows per rank, 12 features
    with raises_everywhere(ValueError, match=rf"= min\({2 * SIZE}, 12\) = {2 * SIZE}; got {2 * SIZE + 1}"):
        PCA(2 * SIZE + 1).fit(few)
    assert_everywhere(PCA(2 * SIZE).fit(few).n_components_ == 2 * SIZE, "as many components as samples")
    with raises_everywhere(ValueError, match="PCA.fit got 0 rows on every rank"):
        PCA(2).fit(np.ones((0, 6)))


def test_score_of_a_model_that_differs_on_one_rank():
    X = uneven(rows())
    pca = PCA(2).fit(X)
    if SIZE > 1 and RANK == 1:
        pca.mean_ = pca.mean_ + 1.0  # as if refitted alone
    expect = CollectiveMismatchError if SIZE > 1 else None
    if expect is None:
        assert_everywhere(np.isfinite(pca.score(X)), "score")
        return
    with raises_everywhere(CollectiveMismatchError, match="the PCA's fitted model"):
        pca.score(X)
