"""mpinb.KMeans on one process (COMM_SELF): the estimator contract, error messages, and agreement
with scikit-learn's Lloyd k-means."""

from __future__ import annotations

import pickle
import tracemalloc
import warnings

import numpy as np
import pytest
from mpi4py import MPI
from sklearn.base import clone
from sklearn.cluster import KMeans as SkKMeans
from sklearn.datasets import load_iris, make_blobs
from sklearn.exceptions import ConvergenceWarning, NotFittedError
from sklearn.metrics import pairwise_distances

import mpinb
import mpinb.kmeans._lloyd as lloyd_module
from mpinb import KMeans
from mpinb.kmeans import _kernels
from mpinb.kmeans._kernels import COMPILE_FROM, chunk_rows, kernels
from support import kmeans_cases

SELF = MPI.COMM_SELF


def blobs(n=3000, d=5, centers=6, std=3.0, seed=0):
    return kmeans_cases.blobs(n, d, centers, std, seed)


CASES = kmeans_cases.agreement_cases(3000, 2000)


@pytest.fixture(params=["compiled", "numpy"])
def kernel_path(request, monkeypatch):
    """Run a test on each executor of the row passes, whatever the size of its data."""
    monkeypatch.setenv("MPINB_NUMBA", "on" if request.param == "compiled" else "off")
    return request.param


def assert_agrees(ours, theirs, rtol=1e-10):
    scale = np.abs(theirs.cluster_centers_).max()
    np.testing.assert_allclose(ours.cluster_centers_, theirs.cluster_centers_, rtol=0, atol=rtol * scale)
    np.testing.assert_array_equal(ours.labels_, theirs.labels_)
    assert ours.n_iter_ == theirs.n_iter_
    assert ours.inertia_ == pytest.approx(theirs.inertia_, rel=rtol)


# ---------------------------------------------------------------------------------------------
# Estimator contract


def test_init_only_stores_parameters():
    init = np.zeros((2, 3))
    km = KMeans(2, init=init, n_init=1, max_iter=7, tol=0.5, random_state=4, comm=SELF)
    assert km.get_params() == {
        "n_clusters": 2, "init": init, "n_init": 1, "max_iter": 7, "tol": 0.5, "random_state": 4, "comm": SELF,
    }
    assert not [name for name in vars(km) if name.endswith("_")]
    # Invalid values are accepted by __init__ and rejected by fit, as in scikit-learn.
    KMeans(n_clusters=-1)


def test_fit_returns_self_and_sets_attributes():
    X = load_iris().data
    km = KMeans(3, random_state=0, comm=SELF)
    assert km.fit(X) is km
    assert km.cluster_centers_.shape == (3, 4)
    assert km.labels_.shape == (150,) and km.labels_.dtype == np.int32
    assert km.n_features_in_ == 4
    assert isinstance(km.inertia_, float) and isinstance(km.n_iter_, int)
    assert km.inertia_history_.shape == (km.n_iter_,)


@pytest.mark.parametrize("method", ["predict", "transform", "score"])
def test_not_fitted_error(method):
    with pytest.raises(NotFittedError, match="not fitted yet"):
        getattr(KMeans(3, comm=SELF), method)(np.zeros((4, 2)))


def test_predict_transform_score_fit_predict():
    X = blobs()
    km = KMeans(6, random_state=1, comm=SELF).fit(X)
    np.testing.assert_array_equal(km.predict(X), km.labels_)
    dist = km.transform(X)
    expected = np.sqrt(((X[:, None, :] - km.cluster_centers_[None]) ** 2).sum(-1))
    np.testing.assert_allclose(dist, expected, rtol=1e-9, atol=1e-9)
    np.testing.assert_array_equal(dist.argmin(axis=1), km.labels_)
    assert km.score(X) == pytest.approx(-km.inertia_, rel=1e-12)
    np.testing.assert_array_equal(KMeans(6, random_state=1, comm=SELF).fit_predict(X), km.labels_)
    np.testing.assert_allclose(KMeans(6, random_state=1, comm=SELF).fit_transform(X), dist)
    with pytest.raises(ValueError, match="X has 3 features, but KMeans was fitted with 5 features"):
        km.predict(X[:, :3])


def test_clone_and_pickle_drop_the_communicator():
    km = KMeans(3, random_state=0, comm=SELF).fit(load_iris().data)
    assert clone(km).get_params()["n_clusters"] == 3
    restored = pickle.loads(pickle.dumps(km))
    assert restored.comm is None
    np.testing.assert_array_equal(restored.cluster_centers_, km.cluster_centers_)
    np.testing.assert_array_equal(restored.predict(load_iris().data), km.labels_)


def test_refit_is_deterministic_with_fixed_seed():
    X = blobs()
    a = KMeans(6, random_state=5, comm=SELF).fit(X)
    b = KMeans(6, random_state=5, comm=SELF).fit(X)
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)
    np.testing.assert_array_equal(a.labels_, b.labels_)


# ---------------------------------------------------------------------------------------------
# Errors: rule, value received, fix


BAD_PARAMS = [
    ({"n_clusters": 0}, ValueError, r"^n_clusters must be a positive integer; got 0\. \[on the only rank\]$"),
    ({"n_clusters": 2.5}, TypeError, r"n_clusters must be a positive integer; got 2\.5"),
    ({"init": "kmeans++"}, ValueError,
     r"init must be 'k-means\+\+', 'k-means\|\|', 'random', an array .* or a callable; got 'kmeans\+\+'"),
    ({"init": np.zeros((2, 4))}, ValueError,
     r"init has shape \(2, 4\), but it must be \(n_clusters, n_features\) = \(3, 4\)"),
    ({"init": np.full((3, 4), np.nan)}, ValueError, r"init contains NaN or infinity"),
    ({"n_init": 0}, ValueError, r"n_init must be 'auto' or a positive integer; got 0"),
    ({"max_iter": 0}, ValueError, r"max_iter must be a positive integer; got 0"),
    ({"tol": -1.0}, ValueError, r"tol must be a finite number >= 0; got -1\.0"),
    ({"random_state": "seed"}, ValueError,
     r"random_state must be None, an int or a numpy\.random\.RandomState; got 'seed'"),
    ({"random_state": 2**32}, ValueError, r"^random_state must be between 0 and 2\*\*32 - 1; got 4294967296\."),
    ({"init": [[1.0, 2.0], [3.0]]}, ValueError,
     r"init must be 'k-means\+\+', .* or a callable; got list \(setting an array"),
    ({"n_init": "all"}, TypeError, r"n_init must be 'auto' or a positive integer; got 'all'"),
]


@pytest.mark.parametrize("params, exc, message", BAD_PARAMS)
def test_bad_parameters(params, exc, message):
    kwargs = {"n_clusters": 3, "comm": SELF, **params}
    with pytest.raises(exc, match=message):
        KMeans(**kwargs).fit(load_iris().data)


def test_bad_data():
    X = load_iris().data.copy()
    with pytest.raises(ValueError, match=r"X_local must be a 2-D array .* got shape \(150,\)"):
        KMeans(3, comm=SELF).fit(X[:, 0])
    X[7, 2] = np.nan
    with pytest.raises(ValueError, match=r"X_local contains NaN \(first at local row 7\)"):
        KMeans(3, comm=SELF).fit(X)
    X[7, 2] = np.inf
    with pytest.raises(ValueError, match=r"X_local contains infinity \(first at local row 7\)"):
        KMeans(3, comm=SELF).fit(X)
    with pytest.raises(TypeError, match="sparse input is not supported"):
        import scipy.sparse as sp

        KMeans(3, comm=SELF).fit(sp.csr_matrix(np.eye(4)))
    with pytest.raises(ValueError,
                       match=r"n_clusters must be <= the total number of samples \(150 on the only rank\); got 151"):
        KMeans(151, comm=SELF).fit(load_iris().data)


def test_bad_sample_weight():
    X = load_iris().data
    with pytest.raises(ValueError, match=r"sample_weight has shape \(149,\), but X_local has 150 rows"):
        KMeans(3, comm=SELF).fit(X, sample_weight=np.ones(149))
    w = np.ones(150)
    w[3] = -1
    with pytest.raises(ValueError, match=r"sample_weight must be finite and non-negative; got a minimum of -1\.0"):
        KMeans(3, comm=SELF).fit(X, sample_weight=w)
    with pytest.raises(ValueError, match=r"sample_weight sums to 0 over all ranks"):
        KMeans(3, comm=SELF).fit(X, sample_weight=np.zeros(150))
    w = np.zeros(150)
    w[:2] = 1
    with pytest.raises(ValueError,
                       match=r"init='random' needs at least n_clusters=3 samples with positive weight; there are 2"):
        KMeans(3, init="random", comm=SELF).fit(X, sample_weight=w)


# ---------------------------------------------------------------------------------------------
# Agreement with scikit-learn


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_sklearn_from_same_init(case, kernel_path):
    X, init = CASES[case]()
    k = init.shape[0]
    theirs = SkKMeans(k, init=init, n_init=1, algorithm="lloyd").fit(X)
    ours = KMeans(k, init=init, comm=SELF).fit(X)
    assert_agrees(ours, theirs)


def test_forced_empty_cluster_is_relocated(kernel_path):
    X, init = kmeans_cases.forced_empty(2000)
    seen = []
    km = KMeans(5, init=init, comm=SELF)
    km._on_iteration = lambda info: seen.append(info["centers"])
    km.fit(X)
    # After the first iteration the duplicate centre sits on the point farthest from its centre.
    labels0 = ((X[:, None] - init[None]) ** 2).sum(-1).argmin(1)
    assert 4 not in labels0
    far = np.argmax(((X - init[labels0]) ** 2).sum(1))
    np.testing.assert_allclose(seen[0][4], X[far], rtol=1e-12)
    assert np.bincount(km.labels_, minlength=5).min() > 0


@pytest.mark.parametrize("init", ["k-means++", "random"])
def test_same_seed_same_result_as_sklearn(init):
    """Random choices follow scikit-learn's draws, so one rank reproduces its initialisation."""
    X = blobs()
    theirs = SkKMeans(6, init=init, n_init=3, random_state=11, algorithm="lloyd").fit(X)
    ours = KMeans(6, init=init, n_init=3, random_state=11, comm=SELF).fit(X)
    assert_agrees(ours, theirs)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("weighted", [False, True])
def test_kmeans_plusplus_draws_equal_sklearn(kernel_path, dtype, weighted):
    """k-means++ on either executor picks the rows scikit-learn's ``kmeans_plusplus`` picks from
    the same seed (its distances in float64, as ours are for float32 rows too), and leaves the
    generator in the same state."""
    from sklearn.cluster import kmeans_plusplus as sk_kmeans_plusplus

    from mpinb.kmeans._init import kmeans_plusplus
    from mpinb.kmeans._shard import kmeans_shard

    X = (blobs(5000, 6, 9, 2.0, seed=4) + 40.0).astype(dtype)  # offset: the pass centres the rows
    w = np.random.default_rng(1).uniform(0, 2, len(X)) if weighted else None
    if weighted:
        w[::5] = 0.0
    k = 12
    data = kmeans_shard(X, w, X.sum(axis=0, dtype=np.float64), n_clusters=k, init="k-means++", comm=SELF, name="test")
    ours_rng, their_rng = np.random.RandomState(8), np.random.RandomState(8)
    ours = kmeans_plusplus(data, k, ours_rng, None) + data.mean
    theirs, idx = sk_kmeans_plusplus(X.astype(np.float64), k, sample_weight=w, random_state=their_rng)
    np.testing.assert_allclose(ours, X[idx].astype(np.float64), rtol=0, atol=1e-12 * np.abs(theirs).max())
    assert ours_rng.random_sample() == their_rng.random_sample()


def test_sample_weight_matches_sklearn(kernel_path):
    X = blobs()
    w = np.random.default_rng(0).uniform(0, 3, len(X))
    w[::7] = 0.0
    theirs = SkKMeans(6, init=X[:6], n_init=1, algorithm="lloyd").fit(X, sample_weight=w)
    ours = KMeans(6, init=X[:6], comm=SELF).fit(X, sample_weight=w)
    assert_agrees(ours, theirs)
    theirs = SkKMeans(6, random_state=2, algorithm="lloyd").fit(X, sample_weight=w)
    ours = KMeans(6, random_state=2, comm=SELF).fit(X, sample_weight=w)
    assert_agrees(ours, theirs)


def test_float32_is_accumulated_in_float64(kernel_path):
    X = blobs(5000, 8, 8, 2.5, seed=4)
    init = X[:8]
    exact = KMeans(8, init=init, comm=SELF).fit(X)
    single = KMeans(8, init=init, comm=SELF).fit(X.astype(np.float32))
    theirs = SkKMeans(8, init=init.astype(np.float32), n_init=1, algorithm="lloyd").fit(X.astype(np.float32))
    assert single.cluster_centers_.dtype == np.float32
    ours_err = np.abs(single.cluster_centers_ - exact.cluster_centers_).max()
    their_err = np.abs(theirs.cluster_centers_ - exact.cluster_centers_).max()
    assert ours_err < their_err
    assert (single.labels_ != exact.labels_).mean() < 1e-3


def test_inertia_history():
    X = blobs()
    km = KMeans(6, init=X[:6], comm=SELF).fit(X)
    history = km.inertia_history_
    assert len(history) == km.n_iter_
    # The first value is the inertia of the initial assignment, computed from the reduced sums.
    labels0 = ((X[:, None] - X[None, :6]) ** 2).sum(-1).argmin(1)
    assert history[0] == pytest.approx(((X - X[:6][labels0]) ** 2).sum(), rel=1e-9)
    assert np.all(np.diff(history) <= 1e-9 * history[0])  # Lloyd never increases the inertia
    # The last value is before the final centre update, which can only lower the inertia.
    assert km.inertia_ <= history[-1] * (1 + 1e-12)
    assert history[-1] == pytest.approx(km.inertia_, rel=1e-4)


def test_on_iteration_hook():
    X = blobs()
    seen = []
    km = KMeans(6, init=X[:6], comm=SELF)
    km._on_iteration = seen.append
    km.fit(X)
    assert [info["iteration"] for info in seen] == list(range(1, km.n_iter_ + 1))
    assert seen[-1]["n_changed"] == 0 or seen[-1]["center_shift"] <= 1e-4 * X.var(axis=0).mean()
    assert "_on_iteration" not in pickle.loads(pickle.dumps(km)).__dict__


def test_incremental_sums_match_recomputed_sums(monkeypatch, kernel_path):
    X = blobs(20000, 6, 12, 3.0, seed=7)
    incremental = KMeans(12, init=X[:12], tol=0, comm=SELF).fit(X)
    monkeypatch.setattr(lloyd_module, "_INCREMENTAL_FRACTION", 0.0)
    fresh = KMeans(12, init=X[:12], tol=0, comm=SELF).fit(X)
    assert incremental.n_iter_ == fresh.n_iter_ > 5
    np.testing.assert_array_equal(incremental.labels_, fresh.labels_)
    np.testing.assert_allclose(incremental.cluster_centers_, fresh.cluster_centers_, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_compiled_kernels_match_numpy_path(monkeypatch, dtype):
    X = blobs(20000, 6, 12, 3.0, seed=9).astype(dtype)
    w = np.random.default_rng(1).uniform(0, 2, len(X))
    w[::5] = 0.0
    monkeypatch.setenv("MPINB_NUMBA", "on")
    compiled = KMeans(12, init=X[:12], tol=0, comm=SELF).fit(X, sample_weight=w)
    monkeypatch.setenv("MPINB_NUMBA", "off")
    plain = KMeans(12, init=X[:12], tol=0, comm=SELF).fit(X, sample_weight=w)
    assert compiled.n_iter_ == plain.n_iter_
    np.testing.assert_array_equal(compiled.labels_, plain.labels_)
    np.testing.assert_allclose(compiled.cluster_centers_, plain.cluster_centers_, rtol=1e-12, atol=1e-12)
    assert compiled.inertia_ == pytest.approx(plain.inertia_, rel=1e-12)
    np.testing.assert_array_equal(compiled.predict(X), plain.predict(X))


def test_offset_data_stays_accurate(kernel_path):
    """Data far from the origin: the centred formulation keeps the labels exact."""
    X = blobs() + 1e6
    ours = KMeans(6, init=X[:6], comm=SELF).fit(X)
    theirs = SkKMeans(6, init=X[:6], n_init=1, algorithm="lloyd").fit(X)
    np.testing.assert_array_equal(ours.labels_, theirs.labels_)
    np.testing.assert_allclose(ours.cluster_centers_, theirs.cluster_centers_, rtol=1e-13)


def test_kmeans_parallel_quality_close_to_kmeans_plusplus():
    """Well-separated blobs, k=64: the median final inertia over seeds is within 2% of
    scikit-learn's greedy k-means++."""
    X = make_blobs(12800, 2, centers=64, cluster_std=0.5, center_box=(-60, 60), random_state=0)[0]
    theirs, ours_pp, ours_par = [], [], []
    for seed in range(10):
        theirs.append(SkKMeans(64, random_state=seed, algorithm="lloyd").fit(X).inertia_)
        ours_pp.append(KMeans(64, init="k-means++", random_state=seed, comm=SELF).fit(X).inertia_)
        ours_par.append(KMeans(64, init="k-means||", random_state=seed, comm=SELF).fit(X).inertia_)
    assert np.median(ours_pp) <= 1.02 * np.median(theirs)
    assert np.median(ours_par) <= 1.02 * np.median(theirs)


def test_memory_beyond_the_data_is_small():
    """Fitting adds little beyond X: labels, a bounded change log and fixed chunk buffers (at
    N=1M, d=16, k=64 the benchmark measures 6-8% of X). tracemalloc sees NumPy's allocations."""
    X = np.random.default_rng(0).standard_normal((200_000, 16))
    for init in ("k-means++", "k-means||", "random"):
        KMeans(3, init=init, n_init=2, comm=SELF).fit(X[:100])  # imports are traced too: warm up
    for init in (X[:64].copy(), "k-means++", "k-means||", "random"):
        tracemalloc.start()
        KMeans(64, init=init, max_iter=5, n_init=1, comm=SELF).fit(X)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak <= 0.10 * X.nbytes + 2 * 2**20, (init if isinstance(init, str) else "array", peak / X.nbytes)


# ---------------------------------------------------------------------------------------------
# A callable init


def test_callable_init_is_called_like_sklearn_on_the_shard():
    X = blobs()
    calls = []

    def init(X_local, n_clusters, random_state):
        calls.append((X_local, n_clusters, random_state))
        return X[:6] * 1.0

    km = KMeans(6, init=init, random_state=3, comm=SELF).fit(X)
    # n_init="auto" runs a callable 10 times, as scikit-learn does, with one RandomState.
    assert len(calls) == 10
    X_seen, k, rng = calls[0]
    assert k == 6 and isinstance(rng, np.random.RandomState)
    assert all(c[2] is rng for c in calls)
    # The data as given (not centred), read-only so the callable cannot corrupt the fit.
    np.testing.assert_array_equal(X_seen, X)
    assert not X_seen.flags.writeable
    # Fixed centres start exactly there: the same fit as the same array.
    assert_agrees(km, KMeans(6, init=X[:6], comm=SELF).fit(X), rtol=0)
    assert_agrees(km, SkKMeans(6, init=X[:6], n_init=1, algorithm="lloyd").fit(X))


def test_callable_init_from_rows_matches_sklearn():
    """A callable that picks rows of X is translation-equivariant, so scikit-learn's centred X
    and mpinb's raw X give the same start; the RandomState draws are the same, run after run."""
    X = blobs()

    def init(X_local, n_clusters, random_state):
        return X_local[random_state.permutation(len(X_local))[:n_clusters]]

    theirs = SkKMeans(6, init=init, n_init=4, random_state=9, algorithm="lloyd").fit(X)
    ours = KMeans(6, init=init, n_init=4, random_state=9, comm=SELF).fit(X)
    assert_agrees(ours, theirs)


def test_callable_init_float32():
    X = blobs().astype(np.float32)
    km = KMeans(6, init=kmeans_cases.fixed_centres(X, 6), comm=SELF).fit(X)
    assert km.cluster_centers_.dtype == np.float32
    assert_agrees(km, KMeans(6, init=X[:6], comm=SELF).fit(X), rtol=0)


BAD_CALLABLES = [
    (lambda X, k, random_state: np.zeros((k + 1, 5)), ValueError,
     r"^init\(X_local, n_clusters, random_state\) returned an array of shape \(7, 5\), but it must be "
     r"\(n_clusters, n_features\) = \(6, 5\)\. \[on the only rank\]$"),
    (lambda X, k, random_state: np.zeros(5), ValueError, r"returned an array of shape \(5,\)"),
    (lambda X, k, random_state: None, TypeError,
     r"init\(X_local, n_clusters, random_state\) must return an array of real numbers .* got NoneType"),
    (lambda X, k, random_state: np.full((k, 5), np.nan), ValueError, r"returned NaN or infinity"),
    (lambda X, k, random_state: X.__setitem__((0, 0), 1.0), ValueError, r"read-only"),
]


@pytest.mark.parametrize("init, exc, message", BAD_CALLABLES)
def test_bad_callable_init(init, exc, message):
    X = blobs()
    before = X.copy()
    with pytest.raises(exc, match=message):
        KMeans(6, init=init, comm=SELF).fit(X)
    np.testing.assert_array_equal(X, before)


def test_callable_init_exception_is_raised():
    def init(X, k, random_state):
        raise KeyError("no centres here")

    with pytest.raises(KeyError, match=r"no centres here.*\[on the only rank\]"):
        KMeans(6, init=init, comm=SELF).fit(blobs())


# ---------------------------------------------------------------------------------------------
# transform


def direct_distances(X, centers):
    return np.sqrt(((X[:, None, :].astype(np.float64) - centers[None].astype(np.float64)) ** 2).sum(-1))


@pytest.mark.parametrize("offset", [0.0, 1e6])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_transform_of_centres_has_zero_diagonal(offset, dtype):
    """scikit-learn's test_transform: the GEMM formula alone leaves ~1e-7 on the diagonal."""
    X = (blobs(1000, 5, 4, 1.0, seed=0) + offset).astype(dtype)
    for seed in range(5):
        km = KMeans(8, random_state=seed, comm=SELF).fit(X)
        Xt = km.transform(km.cluster_centers_)
        np.testing.assert_array_equal(Xt.diagonal(), np.zeros(8))
        # Far from the origin scikit-learn's uncentred euclidean_distances is the inaccurate one.
        reference = direct_distances(km.cluster_centers_, km.cluster_centers_)
        np.testing.assert_allclose(Xt, reference, rtol=1e-7 if offset else 1e-12)
        np.testing.assert_allclose(km.transform(X[:300]), direct_distances(X[:300], km.cluster_centers_),
                                   rtol=1e-7 if offset else 1e-10)
        if not offset:
            np.testing.assert_allclose(Xt, pairwise_distances(km.cluster_centers_.astype(np.float64)))


def test_transform_is_accurate_near_a_centre():
    X = blobs(1000, 5, 4, 1.0, seed=1)
    km = KMeans(4, random_state=0, comm=SELF).fit(X)
    steps = np.geomspace(1e-12, 1e-2, 11)
    near = km.cluster_centers_[0] + steps[:, None] * np.array([1.0, -1.0, 0.5, 0.0, 2.0])
    np.testing.assert_allclose(km.transform(near), direct_distances(near, km.cluster_centers_), rtol=1e-9)


# ---------------------------------------------------------------------------------------------
# More clusters than distinct points


@pytest.mark.parametrize("repeat", [1, 40])
def test_relocating_with_duplicates_stops_after_one_iteration(repeat, kernel_path):
    """scikit-learn issue 28055: the empty cluster cannot be relocated, so its centre joins the
    heaviest cluster's, nothing moves, and Lloyd stops after one iteration."""
    X = kmeans_cases.duplicates(repeat)
    init = kmeans_cases.duplicates(1)
    message = r"Number of distinct clusters \(4\) found smaller than n_clusters \(5\)"
    with pytest.warns(ConvergenceWarning, match=message):
        ours = KMeans(5, init=init, comm=SELF).fit(X)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        theirs = SkKMeans(5, init=init, n_init=1, algorithm="lloyd").fit(X)
    assert ours.n_iter_ == theirs.n_iter_ == 1
    assert_agrees(ours, theirs)
    np.testing.assert_array_equal(ours.cluster_centers_[2], [1.0, 1.0])


@pytest.mark.parametrize("init", ["k-means++", "random"])
def test_more_clusters_than_distinct_points_matches_sklearn(init):
    rng = np.random.default_rng(0)
    X = np.repeat(rng.normal(size=(4, 3)), 10, axis=0)[rng.permutation(40)]
    for seed in range(4):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            theirs = SkKMeans(6, init=init, n_init=2, random_state=seed, algorithm="lloyd").fit(X)
            ours = KMeans(6, init=init, n_init=2, random_state=seed, comm=SELF).fit(X)
        assert_agrees(ours, theirs, rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# scikit-learn's own tests, run on mpinb.KMeans


class SklearnShaped(KMeans):
    """mpinb.KMeans with scikit-learn's constructor for its tests: ``algorithm`` is accepted and
    ignored (mpinb runs Lloyd), and the fit runs on one process."""

    def __init__(self, n_clusters=8, *, init="k-means++", n_init="auto", max_iter=300, tol=1e-4,
                 random_state=None, algorithm="lloyd"):
        super().__init__(n_clusters, init=init, n_init=n_init, max_iter=max_iter, tol=tol,
                         random_state=random_state, comm=SELF)
        self.algorithm = algorithm


@pytest.fixture
def sklearn_tests(monkeypatch):
    module = pytest.importorskip("sklearn.cluster.tests.test_k_means")
    monkeypatch.setattr(module, "KMeans", SklearnShaped)
    return module


@pytest.mark.parametrize("init", ["random", "k-means++", "ndarray", "callable"])
def test_sklearn_all_init(sklearn_tests, init):
    # Dense data only: mpinb does not take sparse input.
    inits = {"random": "random", "k-means++": "k-means++", "ndarray": sklearn_tests.centers.copy(),
             "callable": lambda X, k, random_state: sklearn_tests.centers.copy()}
    sklearn_tests.test_all_init(SklearnShaped, sklearn_tests.X, inits[init])


@pytest.mark.parametrize("seed", [0, 1, 42])
def test_sklearn_transform(sklearn_tests, seed):
    sklearn_tests.test_transform(SklearnShaped, seed)


@pytest.mark.parametrize("algorithm", ["lloyd", "elkan"])
def test_sklearn_relocating_with_duplicates(sklearn_tests, algorithm):
    sklearn_tests.test_relocating_with_duplicates(algorithm, np.asarray)


def test_chunk_rows():
    assert chunk_rows(16) == (1 << 16) // 16
    assert chunk_rows(0) == 1 << 16
    assert chunk_rows(10**6) == 256
    assert chunk_rows(10**6, minimum=1024) == 1024
    assert chunk_rows(1, 1 << 14, maximum=8192) == 8192


def test_lazy_export():
    assert mpinb.KMeans is KMeans


# ---------------------------------------------------------------------------------------------
# The two executors of the row passes


def test_executor_is_chosen_by_size_and_switch(monkeypatch):
    monkeypatch.delenv("MPINB_NUMBA", raising=False)
    assert kernels(COMPILE_FROM - 1).name == "numpy"
    assert kernels(COMPILE_FROM).name == "compiled"
    monkeypatch.setenv("MPINB_NUMBA", "off")
    assert kernels(10 * COMPILE_FROM).name == "numpy"
    monkeypatch.setenv("MPINB_NUMBA", "on")
    assert kernels(1).name == "compiled"
    monkeypatch.setenv("MPINB_NUMBA", "sometimes")
    with pytest.raises(ValueError, match="MPINB_NUMBA must be 0/off, 1/on or auto; got 'sometimes'"):
        kernels(1)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("weighted", [False, True])
def test_executors_agree_pass_by_pass(dtype, weighted):
    """Each pass of the NumPy executor equals the compiled one (labels and counts exactly,
    sums to round-off), including ties, the change tracking and a full tracking buffer."""
    compiled = kernels(COMPILE_FROM)
    plain = _kernels.NUMPY
    assert compiled.name == "compiled"
    rng = np.random.default_rng(5)
    n, d, k = 3000, 7, 9
    X = rng.normal(size=(n, d)).astype(dtype)
    w = rng.uniform(0, 2, n) if weighted else np.empty(0)
    if weighted:
        w[::7] = 0.0
    dist = rng.integers(-3, 3, size=(n, k)).astype(dtype)  # many exact ties
    q = rng.integers(-2, 2, size=k).astype(np.float64)
    centers = rng.normal(size=(k, d))
    start = 40
    out = []
    for ex in (compiled, plain):
        labels = np.arange(n, dtype=np.int32) % k
        rows, old = np.full(n, -9, np.int64), np.full(n, -9, np.int32)
        changed, recorded = ex.argmin_rows(dist, q, labels, start, rows, old, 0)
        small_rows, small_old = np.empty(5, np.int64), np.empty(5, np.int32)
        again = np.arange(n, dtype=np.int32) % k
        _, overflow = ex.argmin_rows(dist, q, again, start, small_rows, small_old, 0)
        sums, weights, members = np.zeros((k, d)), np.zeros(k), np.zeros(k)
        ex.sums_full(X, w, weighted, labels, sums, weights, members)
        moved = rows[:recorded] - start
        ex.sums_delta(X, w, weighted, moved, old[:recorded], labels, sums, weights, members)
        stats = np.zeros(d + 1)
        biggest = ex.centred_stats(X, X.mean(axis=0, dtype=np.float64), w, weighted, stats)
        counts = np.zeros(k)
        inertia = ex.inertia_counts(X, w, weighted, centers, labels, counts)
        columns = np.ones(d)
        ex.column_sums(X, columns)
        out.append((labels, changed, recorded, rows[:recorded], old[:recorded], overflow, sums, weights,
                    members, stats, biggest, counts, inertia, columns))
    a, b = out
    expected = (dist + q).argmin(axis=1)
    np.testing.assert_array_equal(a[0], expected)
    for exact in (0, 1, 2, 3, 4, 5, 8, 11):
        np.testing.assert_array_equal(a[exact], b[exact])
    assert a[1] > 5 and a[5] == -1  # labels changed; the 5-row buffer overflowed
    np.testing.assert_allclose(a[13], 1.0 + X.sum(axis=0, dtype=np.float64), rtol=1e-12)
    for close in (6, 7, 9, 10, 12, 13):
        np.testing.assert_allclose(a[close], b[close], rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("weighted", [False, True])
def test_executors_agree_on_the_seeding_pass(dtype, weighted):
    """The k-means++ pass of both executors, in each mode, equals the distances computed directly
    (clipped at zero) to round-off, with a last chunk shorter than the others."""
    rng = np.random.default_rng(6)
    n, d, block = 1000, 7, 96
    X = (rng.normal(size=(n, d)) + 5.0).astype(dtype)
    mean = X.mean(axis=0, dtype=np.float64)
    w = rng.uniform(0, 2, n) if weighted else np.empty(0)
    points = np.subtract(X[[3, 500, 999]], mean, dtype=np.float64)
    c_sq = np.einsum("ij,ij->i", points, points)
    exact = ((np.subtract(X, mean, dtype=np.float64)[None, :, :] - points[:, None, :]) ** 2).sum(axis=2)
    scale = float(exact.max())
    for ex in (kernels(COMPILE_FROM), _kernels.NUMPY):
        closest = np.full(n, np.nan)
        unused = np.zeros(1)
        ex.seed_distances(X, mean, points[:1], c_sq[:1], closest, w, weighted, unused, 0, block)
        np.testing.assert_allclose(closest, exact[0], rtol=0, atol=1e-12 * scale)
        assert closest[3] >= 0.0  # the point itself: clipped, never negative
        pots = np.zeros(3)
        ex.seed_distances(X, mean, points, c_sq, closest, w, weighted, pots, 1, block)
        expected = np.minimum(exact, exact[0]) @ (w if weighted else np.ones(n))
        np.testing.assert_allclose(pots, expected, rtol=1e-12)
        ex.seed_distances(X, mean, points[2:], c_sq[2:], closest, w, weighted, unused, 2, block)
        np.testing.assert_allclose(closest, np.minimum(exact[0], exact[2]), rtol=0, atol=1e-12 * scale)


def test_small_fit_in_a_fresh_process_needs_no_compiled_code():
    """A first small fit takes the NumPy executor: numba is not even imported."""
    import subprocess
    import sys

    code = (
        "import sys, numpy as np; from mpi4py import MPI; import mpinb;"
        "X = np.random.default_rng(0).normal(size=(6000, 5));"
        "mpinb.KMeans(8, n_init=1, random_state=0, comm=MPI.COMM_SELF).fit(X).predict(X);"
        "print('numba' in sys.modules)"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "MPINB_NUMBA"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_compiled_passes_load_from_the_disk_cache_in_a_new_process(tmp_path):
    """A second process loads every compiled pass from numba's cache: none is compiled again
    (a pass whose closure holds a dispatcher or an intrinsic gets a new cache key in every
    process, and so recompiles for seconds each time)."""
    import os
    import subprocess
    import sys

    code = (
        "import numpy as np; from mpi4py import MPI; import mpinb;"
        "X = np.random.default_rng(0).normal(size=(3000, 4));"
        "mpinb.KMeans(3, random_state=0, comm=MPI.COMM_SELF).fit(X).predict(X);"
        "mpinb.MiniBatchKMeans(3, batch_size=256, random_state=0, comm=MPI.COMM_SELF).fit(X)"
    )
    env = dict(os.environ, MPINB_NUMBA="1", NUMBA_CACHE_DIR=str(tmp_path), NUMBA_DEBUG_CACHE="1")
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
            for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr
    saved = [line for line in runs[0].stdout.splitlines() if "data saved" in line]
    assert len(saved) >= 6, runs[0].stdout[-2000:]  # the first process compiled and saved the passes
    again = [line for line in runs[1].stdout.splitlines() if "data saved" in line]
    assert again == [], "recompiled in a second process:\n" + "\n".join(again)
