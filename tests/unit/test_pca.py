"""mpinb.PCA on one process (COMM_SELF): the estimator contract, error messages, and agreement with
scikit-learn's exact PCA (``svd_solver="full"``): components with scikit-learn's signs, variances,
transforms, the probabilistic model's score."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from mpi4py import MPI
from sklearn.base import clone
from sklearn.cluster import KMeans as SkKMeans
from sklearn.decomposition import PCA as SkPCA
from sklearn.exceptions import NotFittedError
from sklearn.pipeline import make_pipeline

import mpinb
from mpinb import PCA

SELF = MPI.COMM_SELF
SPECTRUM = ("explained_variance_", "explained_variance_ratio_", "singular_values_")


def rows(n: int = 500, d: int = 6, offset: float = 10.0, seed: int = 0) -> np.ndarray:
    """Correlated features with well-separated variances (so each component is well defined)."""
    rng = np.random.default_rng(seed)
    mix = np.linalg.qr(rng.normal(size=(d, d)))[0]
    spread = np.geomspace(5.0, 0.1, d)
    return rng.normal(size=(n, d)) * spread @ mix + offset


def assert_same_as(ours: PCA, ref: SkPCA, rtol: float = 1e-10) -> None:
    assert ours.n_components_ == ref.n_components_ and ours.n_samples_ == ref.n_samples_
    top = ref.explained_variance_[0] if ref.n_components_ else 1.0
    np.testing.assert_allclose(ours.components_, ref.components_, rtol=0, atol=rtol)
    np.testing.assert_allclose(ours.explained_variance_, ref.explained_variance_, rtol=0, atol=rtol * top)
    np.testing.assert_allclose(ours.explained_variance_ratio_, ref.explained_variance_ratio_, rtol=0,
                               atol=rtol)
    np.testing.assert_allclose(ours.singular_values_, ref.singular_values_, rtol=rtol)
    np.testing.assert_allclose(ours.mean_, ref.mean_, rtol=1e-13)
    assert ours.noise_variance_ == pytest.approx(ref.noise_variance_, rel=rtol, abs=rtol * top)


@pytest.mark.parametrize("n_components", [None, 3, 0.9, 1, 0])
@pytest.mark.parametrize("whiten", [False, True])
def test_matches_sklearn(n_components, whiten: bool) -> None:
    X = rows()
    ref = SkPCA(n_components, whiten=whiten, svd_solver="full").fit(X)
    ours = PCA(n_components, whiten=whiten, comm=SELF).fit(X)
    assert_same_as(ours, ref)
    if ours.n_components_:
        np.testing.assert_allclose(ours.transform(X), ref.transform(X), rtol=0, atol=1e-10)
        Z = ref.transform(X)
        np.testing.assert_allclose(ours.inverse_transform(Z), ref.inverse_transform(Z), rtol=0, atol=1e-10)
    if n_components != 6 and not (whiten and n_components is None):  # (ill-conditioned: checked below)
        np.testing.assert_allclose(ours.get_covariance(), ref.get_covariance(), rtol=0, atol=1e-10)
        np.testing.assert_allclose(ours.score_samples(X), ref.score_samples(X), rtol=1e-9)
        assert ours.score(X) == pytest.approx(ref.score(X), rel=1e-10)


def test_all_components_score_through_the_inverse_covariance() -> None:
    X = rows()
    ref = SkPCA(svd_solver="full").fit(X)
    ours = PCA(comm=SELF).fit(X)
    assert ours.noise_variance_ == 0.0
    np.testing.assert_allclose(ours.get_precision(), ref.get_precision(), rtol=1e-8, atol=1e-10)
    assert ours.score(X) == pytest.approx(ref.score(X), rel=1e-10)


def test_fewer_samples_than_features() -> None:
    X = rows(n=5, d=8)
    assert_same_as(PCA(2, comm=SELF).fit(X), SkPCA(2, svd_solver="full").fit(X))
    # All 5: the centred rows have rank 4, so the fifth axis is any unit vector of the null space.
    ours, ref = PCA(comm=SELF).fit(X), SkPCA(svd_solver="full").fit(X)
    assert ours.n_components_ == ref.n_components_ == 5
    np.testing.assert_allclose(ours.components_[:4], ref.components_[:4], atol=1e-10)
    for name in SPECTRUM[:2]:
        np.testing.assert_allclose(getattr(ours, name), getattr(ref, name), rtol=0, atol=1e-13 * 25,
                                   err_msg=name)
    # A zero singular value from the covariance's eigenvalue: the square root of its round-off.
    np.testing.assert_allclose(ours.singular_values_, ref.singular_values_, rtol=0, atol=1e-7 * 8.7)


def test_a_large_mean_keeps_the_covariance() -> None:
    """The scatter matrix is taken about the global mean: from raw products (``X.T @ X - n m m'``)
    the smallest variance, 0.01 next to a squared mean of 1e12, would be lost."""
    X = rows(offset=1e6, seed=1)
    ref = SkPCA(svd_solver="full").fit(X)
    assert_same_as(PCA(comm=SELF).fit(X), ref, rtol=1e-9)


def test_float32_rows_give_float32_attributes() -> None:
    X = rows().astype(np.float32)
    ours = PCA(2, comm=SELF).fit(X)
    ref = SkPCA(2, svd_solver="full").fit(X.astype(np.float64))
    assert ours.components_.dtype == np.float32 and ours.explained_variance_.dtype == np.float32
    np.testing.assert_allclose(ours.components_, ref.components_, atol=1e-5)
    assert ours.transform(X).dtype == np.float32


def test_in_a_pipeline_ahead_of_kmeans_equals_sklearns_pipeline() -> None:
    X = rows(600, seed=2)
    Z = SkPCA(2, svd_solver="full").fit_transform(X)
    init = Z[:3]
    ref = make_pipeline(SkPCA(2, svd_solver="full"), SkKMeans(3, init=init, n_init=1, algorithm="lloyd"))
    ref.fit(X)
    ours = make_pipeline(mpinb.StandardScaler(with_std=False, comm=SELF), PCA(2, comm=SELF),
                         mpinb.KMeans(3, init=init, comm=SELF)).fit(X)
    np.testing.assert_array_equal(ours.predict(X), ref.predict(X))
    np.testing.assert_allclose(ours[-1].cluster_centers_, ref[-1].cluster_centers_, atol=1e-9)


# ---------------------------------------------------------------------------------------------
# Estimator contract and errors


def test_init_only_stores_parameters_and_clone_and_pickle_drop_the_communicator() -> None:
    pca = PCA(0.5, whiten=True, comm=SELF)
    assert pca.get_params() == {"n_components": 0.5, "copy": True, "whiten": True, "comm": SELF}
    assert clone(pca).get_params()["n_components"] == 0.5
    restored = pickle.loads(pickle.dumps(pca.fit(rows())))
    assert restored.comm is None
    np.testing.assert_array_equal(restored.components_, pca.components_)
    assert list(PCA(2, comm=SELF).fit(rows()).get_feature_names_out()) == ["pca0", "pca1"]


@pytest.mark.parametrize("method", ["transform", "inverse_transform", "score_samples", "get_covariance"])
def test_not_fitted_error(method: str) -> None:
    args = () if method == "get_covariance" else (rows(),)
    with pytest.raises(NotFittedError, match="This PCA instance is not fitted yet"):
        getattr(PCA(comm=SELF), method)(*args)


def test_wrong_number_of_features() -> None:
    pca = PCA(2, comm=SELF).fit(rows())
    with pytest.raises(ValueError, match="X has 5 features, but PCA was fitted with 6 features"):
        pca.transform(rows()[:, :5])
    with pytest.raises(ValueError, match=r"X \(projected rows\) has 3 features, but PCA was fitted with 2"):
        pca.inverse_transform(np.ones((4, 3)))


@pytest.mark.parametrize(
    "n_components, exc, message",
    [
        (7, ValueError, r"n_components must be <= min\(n_samples, n_features\) = min\(500, 6\) = 6; got 7"),
        (-1, ValueError, "n_components must be None, a non-negative integer or a number strictly between 0 "
                         "and 1; got -1"),
        (1.0, ValueError, "n_components must be None, .* strictly between 0 and 1; got 1.0"),
        ("mle", TypeError, "n_components must be None, .*; got 'mle'"),
    ],
)
def test_bad_n_components(n_components, exc: type[Exception], message: str) -> None:
    with pytest.raises(exc, match=message):
        PCA(n_components, comm=SELF).fit(rows())


@pytest.mark.parametrize(
    "X, message",
    [
        (np.array([[1.0, np.nan], [2.0, 3.0]]), r"X_local contains NaN \(first at local row 0\)"),
        (np.ones((0, 3)), "PCA.fit got 0 rows on every rank"),
        (np.ones((1, 3)), "PCA needs at least 2 samples over all ranks to estimate a variance; got 1"),
    ],
)
def test_bad_rows(X: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PCA(comm=SELF).fit(X)
