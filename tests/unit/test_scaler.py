"""mpinb.StandardScaler on one process (COMM_SELF): the estimator contract, error messages, and
agreement with scikit-learn's StandardScaler (fit, partial_fit, weights, transforms, a Pipeline)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from mpi4py import MPI
from sklearn.base import clone
from sklearn.cluster import KMeans as SkKMeans
from sklearn.exceptions import NotFittedError
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler as SkScaler

import mpinb
from mpinb import StandardScaler

SELF = MPI.COMM_SELF
ATTRIBUTES = ("mean_", "var_", "scale_")


def rows(n: int = 400, seed: int = 0) -> np.ndarray:
    """Features of very different means and spreads, one of them constant."""
    rng = np.random.default_rng(seed)
    X = rng.normal([3.0, -200.0, 0.0, 7.0], [1.0, 40.0, 1e-3, 1.0], size=(n, 4))
    X[:, 3] = 7.0
    return X


def assert_same_as(ours: StandardScaler, theirs: SkScaler, rtol: float = 1e-12) -> None:
    for name in ATTRIBUTES:
        mine, ref = getattr(ours, name), getattr(theirs, name)
        if ref is None:
            assert mine is None, name
        else:
            # A constant feature's variance is round-off (about 1e-31 here) in both.
            np.testing.assert_allclose(mine, ref, rtol=rtol, atol=1e-28, err_msg=name)
    assert ours.n_samples_seen_ == pytest.approx(theirs.n_samples_seen_, rel=1e-12)
    assert ours.n_features_in_ == theirs.n_features_in_


@pytest.mark.parametrize("with_mean", [True, False])
@pytest.mark.parametrize("with_std", [True, False])
@pytest.mark.parametrize("weighted", [False, True])
def test_matches_sklearn(with_mean: bool, with_std: bool, weighted: bool) -> None:
    X = rows()
    w = np.random.default_rng(1).uniform(0, 2, len(X)) if weighted else None
    ref = SkScaler(with_mean=with_mean, with_std=with_std).fit(X, sample_weight=w)
    ours = StandardScaler(with_mean=with_mean, with_std=with_std, comm=SELF).fit(X, sample_weight=w)
    assert_same_as(ours, ref)
    np.testing.assert_allclose(ours.transform(X), ref.transform(X), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ours.inverse_transform(X), ref.inverse_transform(X), rtol=1e-12, atol=1e-9)


def test_counts_are_integers_without_weights_and_floats_with() -> None:
    X = rows()
    assert StandardScaler(comm=SELF).fit(X).n_samples_seen_ == 400
    assert isinstance(StandardScaler(comm=SELF).fit(X).n_samples_seen_, int)
    weighted = StandardScaler(comm=SELF).fit(X, sample_weight=np.full(400, 0.5))
    assert weighted.n_samples_seen_ == 200.0 and isinstance(weighted.n_samples_seen_, float)


def test_a_large_mean_keeps_the_variance() -> None:
    """Second moments about the global mean: a sum of raw squares would keep no digit here."""
    rng = np.random.default_rng(2)
    X = rng.normal(1e8, 1.0, size=(2000, 3))
    ours = StandardScaler(comm=SELF).fit(X)
    exact = ((X - X.mean(axis=0)) ** 2).mean(axis=0)
    np.testing.assert_allclose(ours.var_, exact, rtol=1e-10)
    np.testing.assert_allclose(ours.var_, SkScaler().fit(X).var_, rtol=1e-10)


def test_constant_features_keep_a_scale_of_one() -> None:
    X = rows()
    ours = StandardScaler(comm=SELF).fit(X)
    assert ours.scale_[3] == 1.0 and ours.var_[3] == 0.0
    np.testing.assert_array_equal(ours.transform(X)[:, 3], 0.0)


@pytest.mark.parametrize("weighted", [False, True])
def test_partial_fit_in_batches_equals_sklearns_and_one_fit(weighted: bool) -> None:
    X = rows(600, seed=3)
    w = np.random.default_rng(4).uniform(0.1, 2, len(X)) if weighted else None
    ours, ref = StandardScaler(comm=SELF), SkScaler()
    for lo, hi in ((0, 50), (50, 51), (51, 400), (400, 600)):
        part = None if w is None else w[lo:hi]
        ours.partial_fit(X[lo:hi], sample_weight=part)
        ref.partial_fit(X[lo:hi], sample_weight=part)
    assert_same_as(ours, ref)
    assert_same_as(ours, SkScaler().fit(X, sample_weight=w))
    # fit starts afresh.
    ours.fit(X[:10])
    assert ours.n_samples_seen_ == 10


def test_float32_rows_keep_their_dtype_and_statistics_are_float64() -> None:
    X = rows().astype(np.float32)
    ours, ref = StandardScaler(comm=SELF).fit(X), SkScaler().fit(X)
    assert ours.mean_.dtype == np.float64 and ours.scale_.dtype == np.float64
    np.testing.assert_allclose(ours.mean_, ref.mean_, rtol=1e-6)
    out = ours.transform(X)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, ref.transform(X), rtol=1e-5, atol=1e-5)
    assert ours.transform(X.astype(np.int64)).dtype == np.float64


def test_copy_false_scales_in_place_and_copy_true_does_not() -> None:
    X = rows()
    scaler = StandardScaler(comm=SELF).fit(X)
    original = X.copy()
    out = scaler.transform(X)
    assert out is not X
    np.testing.assert_array_equal(X, original)
    in_place = scaler.transform(X, copy=False)
    assert in_place is X
    back = StandardScaler(copy=False, comm=SELF).fit(original).inverse_transform(X)
    assert back is X
    np.testing.assert_allclose(X, original, rtol=1e-12, atol=1e-9)


def test_in_a_pipeline_ahead_of_kmeans_equals_sklearns_pipeline() -> None:
    X = rows(500, seed=5)[:, :3]
    init = SkScaler().fit_transform(X)[:4]
    ref = make_pipeline(SkScaler(), SkKMeans(4, init=init, n_init=1, algorithm="lloyd")).fit(X)
    ours = make_pipeline(StandardScaler(comm=SELF), mpinb.KMeans(4, init=init, comm=SELF)).fit(X)
    np.testing.assert_array_equal(ours.predict(X), ref.predict(X))
    np.testing.assert_allclose(ours[-1].cluster_centers_, ref[-1].cluster_centers_, rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# Estimator contract and errors


def test_init_only_stores_parameters_and_clone_and_pickle_drop_the_communicator() -> None:
    scaler = StandardScaler(with_mean=False, comm=SELF)
    assert scaler.get_params() == {"copy": True, "with_mean": False, "with_std": True, "comm": SELF}
    assert clone(scaler).get_params()["with_mean"] is False
    restored = pickle.loads(pickle.dumps(scaler.fit(rows())))
    assert restored.comm is None
    np.testing.assert_array_equal(restored.scale_, scaler.scale_)
    assert list(scaler.get_feature_names_out()) == ["x0", "x1", "x2", "x3"]


@pytest.mark.parametrize("method", ["transform", "inverse_transform"])
def test_not_fitted_error(method: str) -> None:
    with pytest.raises(NotFittedError, match="This StandardScaler instance is not fitted yet"):
        getattr(StandardScaler(comm=SELF), method)(rows())


def test_wrong_number_of_features() -> None:
    scaler = StandardScaler(comm=SELF).fit(rows())
    with pytest.raises(ValueError, match="X has 3 features, but StandardScaler was fitted with 4 features"):
        scaler.transform(rows()[:, :3])
    with pytest.raises(ValueError, match="X_local has 3 features, but StandardScaler was fitted with 4"):
        scaler.partial_fit(rows()[:, :3])


@pytest.mark.parametrize(
    "X, exc, message",
    [
        (np.array([[1.0, np.nan], [2.0, 3.0]]), ValueError, r"X_local contains NaN \(first at local row 0\)"),
        (np.array([[1.0, 2.0], [np.inf, 3.0]]), ValueError,
         r"X_local contains infinity \(first at local row 1\)"),
        (np.ones((0, 3)), ValueError, "StandardScaler.fit got 0 rows on every rank"),
        (np.ones(5), ValueError, "X_local must be a 2-D array"),
        (np.array([["a", "b"]]), TypeError, "X_local must hold real numbers"),
    ],
)
def test_bad_rows(X: np.ndarray, exc: type[Exception], message: str) -> None:
    with pytest.raises(exc, match=message):
        StandardScaler(comm=SELF).fit(X)


def test_bad_weights_and_parameters() -> None:
    X = rows()
    with pytest.raises(ValueError, match=r"sample_weight has shape \(3,\), but X_local has 400 rows"):
        StandardScaler(comm=SELF).fit(X, sample_weight=np.ones(3))
    with pytest.raises(ValueError, match="sample_weight sums to 0 over all ranks"):
        StandardScaler(comm=SELF).fit(X, sample_weight=np.zeros(400))
    with pytest.raises(TypeError, match=r"^with_mean must be True or False; got 'yes'\."):
        StandardScaler(with_mean="yes", comm=SELF).fit(X)
