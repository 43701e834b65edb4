"""mpinb.MiniBatchKMeans on one process (COMM_SELF): the estimator contract, error messages, and
agreement with scikit-learn's MiniBatchKMeans from the same seed (fit, partial_fit, reassignment,
early stopping)."""

from __future__ import annotations

import contextlib
import io
import pickle
import re
import signal

import numpy as np
import pytest
from mpi4py import MPI
from sklearn.base import clone
from sklearn.cluster import MiniBatchKMeans as SkMiniBatchKMeans
from sklearn.exceptions import NotFittedError
from threadpoolctl import threadpool_limits

import mpinb
import mpinb._rows as rows_module
from mpinb import MiniBatchKMeans
from mpinb.kmeans import _kernels
from mpinb.kmeans._sampling import Sampler
from mpinb.kmeans._shard import kmeans_shard
from support import kmeans_cases
from support.counting import CountingComm

SELF = MPI.COMM_SELF


@pytest.fixture(autouse=True)
def one_thread():
    """scikit-learn's OpenMP loop over a small mini-batch costs milliseconds per step in thread
    hand-offs on a busy machine; one thread makes its fits 20 times faster here."""
    with threadpool_limits(limits=1):
        yield


def blobs(n=3000, d=5, centers=6, std=3.0, seed=0):
    return kmeans_cases.blobs(n, d, centers, std, seed)


def assert_agrees(ours, theirs, rtol=1e-10, labels=True):
    """Same draws, so the same trajectory: centres to round-off, the same steps and labels."""
    scale = np.abs(theirs.cluster_centers_).max()
    np.testing.assert_allclose(ours.cluster_centers_, theirs.cluster_centers_, rtol=0, atol=rtol * scale)
    assert ours.n_steps_ == theirs.n_steps_
    if hasattr(theirs, "n_iter_"):
        assert ours.n_iter_ == theirs.n_iter_
    if labels:
        np.testing.assert_array_equal(ours.labels_, theirs.labels_)
    assert ours.inertia_ == pytest.approx(theirs.inertia_, rel=rtol)


def both(X, fit_kwargs=None, **params):
    """The same parameters and seed fitted by scikit-learn and by mpinb on one rank."""
    params.setdefault("random_state", 3)
    fit_kwargs = fit_kwargs or {}
    theirs = SkMiniBatchKMeans(**params).fit(X, **fit_kwargs)
    ours = MiniBatchKMeans(comm=SELF, **params).fit(X, **fit_kwargs)
    return ours, theirs


# ---------------------------------------------------------------------------------------------
# Estimator contract


def test_init_only_stores_parameters():
    ours = MiniBatchKMeans(comm=SELF).get_params()
    assert ours.pop("comm") is SELF
    assert ours == SkMiniBatchKMeans().get_params()
    mbk = MiniBatchKMeans(n_clusters=-1, batch_size=0)  # accepted here, rejected by fit
    assert not [name for name in vars(mbk) if name.endswith("_")]


def test_fit_returns_self_and_sets_attributes():
    X = blobs()
    mbk = MiniBatchKMeans(6, batch_size=256, random_state=0, comm=SELF)
    assert mbk.fit(X) is mbk
    assert mbk.cluster_centers_.shape == (6, 5) and mbk.cluster_centers_.dtype == np.float64
    assert mbk.labels_.shape == (3000,) and mbk.labels_.dtype == np.int32
    assert mbk.n_features_in_ == 5
    assert isinstance(mbk.inertia_, float) and isinstance(mbk.n_iter_, int) and isinstance(mbk.n_steps_, int)
    assert mbk.n_iter_ == -(-mbk.n_steps_ * 256 // 3000)


@pytest.mark.parametrize("method", ["predict", "transform", "score"])
def test_not_fitted_error(method):
    with pytest.raises(NotFittedError, match="This MiniBatchKMeans instance is not fitted yet"):
        getattr(MiniBatchKMeans(3, comm=SELF), method)(np.zeros((4, 2)))


def test_predict_transform_score_fit_predict():
    X = blobs()
    mbk = MiniBatchKMeans(6, batch_size=256, random_state=1, comm=SELF).fit(X)
    np.testing.assert_array_equal(mbk.predict(X), mbk.labels_)
    dist = mbk.transform(X)
    expected = np.sqrt(((X[:, None, :] - mbk.cluster_centers_[None]) ** 2).sum(-1))
    np.testing.assert_allclose(dist, expected, rtol=1e-9, atol=1e-9)
    assert mbk.score(X) == pytest.approx(-mbk.inertia_, rel=1e-12)
    again = MiniBatchKMeans(6, batch_size=256, random_state=1, comm=SELF)
    np.testing.assert_array_equal(again.fit_predict(X), mbk.labels_)
    np.testing.assert_allclose(clone(again).fit_transform(X), dist)
    with pytest.raises(ValueError, match="X has 3 features, but MiniBatchKMeans was fitted with 5 features"):
        mbk.predict(X[:, :3])


def test_clone_and_pickle_drop_the_communicator():
    X = blobs()
    mbk = MiniBatchKMeans(6, batch_size=500, random_state=0, comm=SELF).partial_fit(X[:1000])
    assert clone(mbk).get_params()["batch_size"] == 500
    restored = pickle.loads(pickle.dumps(mbk))
    assert restored.comm is None
    np.testing.assert_array_equal(restored.predict(X), mbk.predict(X))
    # The model state (centres, accumulated weights, generator) travels: both carry on alike.
    restored.comm = SELF
    mbk.partial_fit(X[1000:2000])
    restored.partial_fit(X[1000:2000])
    np.testing.assert_array_equal(restored.cluster_centers_, mbk.cluster_centers_)


def test_refit_is_deterministic_with_fixed_seed():
    X = blobs()
    a = MiniBatchKMeans(6, batch_size=200, random_state=5, comm=SELF).fit(X)
    b = MiniBatchKMeans(6, batch_size=200, random_state=5, comm=SELF).fit(X)
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)
    assert a.n_steps_ == b.n_steps_


def test_one_rank_communicates_nothing():
    comm = CountingComm(SELF.Dup())
    X = blobs(1000, 3)
    mbk = MiniBatchKMeans(4, batch_size=100, random_state=0, comm=comm).fit(X)
    mbk.partial_fit(X[:300]).score(X)
    assert mbk.n_steps_ > 1
    assert comm.calls == []


def test_lazy_export():
    assert mpinb.MiniBatchKMeans is MiniBatchKMeans
    assert "MiniBatchKMeans" in dir(mpinb)


# ---------------------------------------------------------------------------------------------
# Errors: rule, value received, fix


ROWS = "number of rows over all ranks"
BAD_PARAMS = [
    ({"n_clusters": 0}, ValueError, r"^n_clusters must be a positive integer; got 0\. \[on the only rank\]$"),
    ({"batch_size": 0}, ValueError, rf"^batch_size must be a positive integer {ROWS}; got 0\."),
    ({"batch_size": 2.5}, TypeError, rf"batch_size must be a positive integer {ROWS}; got 2\.5"),
    ({"batch_size": True}, TypeError, r"batch_size must be a positive integer .* got True"),
    ({"max_iter": 0}, ValueError, r"max_iter must be a positive integer; got 0"),
    ({"max_no_improvement": -1}, ValueError,
     r"max_no_improvement must be None or a non-negative integer; got -1"),
    ({"init_size": 0}, ValueError, r"init_size must be None or a positive integer; got 0"),
    ({"reassignment_ratio": -0.5}, ValueError, r"reassignment_ratio must be a finite number >= 0; got -0\.5"),
    ({"compute_labels": "yes"}, TypeError, r"compute_labels must be True or False; got 'yes'"),
    ({"n_init": 0}, ValueError, r"n_init must be 'auto' or a positive integer; got 0"),
    ({"tol": -1.0}, ValueError, r"tol must be a finite number >= 0; got -1\.0"),
    ({"init": "kmeans++"}, ValueError,
     r"init must be 'k-means\+\+', 'k-means\|\|', 'random', an array .* got 'kmeans\+\+'"),
    ({"init": np.zeros((2, 4))}, ValueError,
     r"init has shape \(2, 4\), but it must be \(n_clusters, n_features\) = \(3, 4\)"),
    ({"random_state": "seed"}, ValueError,
     r"random_state must be None, an int or a numpy\.random\.RandomState"),
]


@pytest.mark.parametrize("params, exc, message", BAD_PARAMS)
def test_bad_parameters(params, exc, message):
    X = blobs(300, 4)
    kwargs = {"n_clusters": 3, "comm": SELF, **params}
    with pytest.raises(exc, match=message):
        MiniBatchKMeans(**kwargs).fit(X)
    with pytest.raises(exc, match=message):
        MiniBatchKMeans(**kwargs).partial_fit(X)


def test_bad_data():
    X = blobs(300, 4).copy()
    with pytest.raises(ValueError, match=r"X_local must be a 2-D array .* got shape \(300,\)"):
        MiniBatchKMeans(3, comm=SELF).fit(X[:, 0])
    X[7, 2] = np.nan
    with pytest.raises(ValueError, match=r"X_local contains NaN \(first at local row 7\)"):
        MiniBatchKMeans(3, comm=SELF).fit(X)
    with pytest.raises(ValueError, match=r"X_local contains NaN \(first at local row 7\)"):
        MiniBatchKMeans(3, comm=SELF).partial_fit(X)
    too_many = r"n_clusters must be <= the total number of samples \(300 on the only rank\); got 301"
    with pytest.raises(ValueError, match=too_many):
        MiniBatchKMeans(301, comm=SELF).fit(blobs(300, 4))
    with pytest.raises(ValueError, match=r"sample_weight has shape \(299,\), but X_local has 300 rows"):
        MiniBatchKMeans(3, comm=SELF).fit(blobs(300, 4), sample_weight=np.ones(299))
    with pytest.raises(ValueError, match=r"sample_weight sums to 0 over all ranks"):
        MiniBatchKMeans(3, comm=SELF).fit(blobs(300, 4), sample_weight=np.zeros(300))


def test_partial_fit_checks_the_number_of_features():
    X = blobs(300, 4)
    mbk = MiniBatchKMeans(3, random_state=0, comm=SELF).partial_fit(X)
    with pytest.raises(ValueError, match=r"X_local has 3 features, but MiniBatchKMeans was fitted with 4 "):
        mbk.partial_fit(X[:, :3])
    with pytest.raises(ValueError, match=r"partial_fit got 0 rows on every rank"):
        mbk.partial_fit(X[:0])
    mbk.partial_fit(X)  # still usable
    assert mbk.n_steps_ == 2


def test_warnings_as_sklearn():
    X = blobs(300, 4)
    with pytest.warns(RuntimeWarning, match=r"only one init in MiniBatchKMeans instead of n_init=3"):
        MiniBatchKMeans(3, init=X[:3], n_init=3, comm=SELF).fit(X)
    with pytest.warns(RuntimeWarning, match=r"init_size=2 should be larger than n_clusters=3"):
        MiniBatchKMeans(3, init_size=2, comm=SELF).fit(X)


# ---------------------------------------------------------------------------------------------
# Agreement with scikit-learn: the same random numbers, drawn in the same order


def test_draws_are_numpys_choice():
    """A mini-batch maps the uniform numbers of ``choice(n, size, p=w / w.sum())`` to the same rows."""
    for weights in (None, np.random.default_rng(1).uniform(0, 2, 5000)):
        X = blobs(5000, 2)
        if weights is not None:
            weights[::5] = 0.0
        data = kmeans_shard(X, weights, X.sum(axis=0), n_clusters=2, init="random", comm=SELF, name="draws")
        sampler = Sampler(data, weighted=weights is not None)
        p = np.full(5000, 1 / 5000) if weights is None else weights / weights.sum()
        theirs = np.random.RandomState(0).choice(5000, 100_000, p=p, replace=True)
        ours = sampler.draw(np.random.RandomState(0).random_sample(100_000))
        np.testing.assert_array_equal(ours.local, theirs)
        np.testing.assert_array_equal(ours.mine, np.arange(100_000))


CASES = {
    "default": ({}, {}),
    "small batches": ({"batch_size": 100}, {}),
    "init_size below n": ({"batch_size": 200}, {}),
    "random init, n_init=3": ({"batch_size": 256, "init": "random"}, {}),
    "sample_weight": ({"batch_size": 128}, {"weighted": True}),
    "tol": ({"batch_size": 64, "tol": 1e-3}, {}),
    "no early stop": ({"batch_size": 500, "max_no_improvement": None, "max_iter": 3}, {}),
    "compute_labels=False": ({"batch_size": 256, "compute_labels": False}, {}),
    "init_size": ({"batch_size": 256, "init_size": 700}, {}),
}


@pytest.mark.parametrize("case", sorted(CASES))
@kmeans_cases.sklearn_draws_as_mpinb
def test_matches_sklearn_from_same_seed(case):
    params, extra = CASES[case]
    X = blobs()
    fit_kwargs = {}
    if extra.get("weighted"):
        w = np.random.default_rng(2).uniform(0, 2, len(X))
        w[::9] = 0.0
        fit_kwargs = {"sample_weight": w}
    ours, theirs = both(X, fit_kwargs, n_clusters=6, **params)
    assert_agrees(ours, theirs, labels=params.get("compute_labels", True))


@kmeans_cases.sklearn_draws_as_mpinb
def test_matches_sklearn_from_array_and_callable_init():
    X = blobs(4000, 4, 8, 2.0, seed=1)
    ours, theirs = both(X, n_clusters=8, init=X[:8], batch_size=128)
    assert_agrees(ours, theirs)
    seen = []

    def pick(X_sample, k, random_state):
        seen.append((X_sample.shape, isinstance(random_state, np.random.RandomState)))
        return X_sample[random_state.permutation(len(X_sample))[:k]]

    ours, theirs = both(X, n_clusters=8, init=pick, batch_size=128)
    assert_agrees(ours, theirs)
    # n_init="auto" is 3 for a callable; it sees the init_size sample (3 * batch_size rows).
    assert seen == [((384, 4), True)] * 6  # three calls each, by scikit-learn and by mpinb


@kmeans_cases.sklearn_draws_as_mpinb
def test_float32_matches_sklearn_to_float32_round_off():
    X = blobs(4000, 4, 8, 2.0, seed=1).astype(np.float32)
    ours, theirs = both(X, n_clusters=8, batch_size=128)
    assert ours.cluster_centers_.dtype == np.float32
    assert ours.n_steps_ == theirs.n_steps_
    np.testing.assert_allclose(ours.cluster_centers_, theirs.cluster_centers_, rtol=0, atol=1e-4)
    assert (ours.labels_ != theirs.labels_).mean() < 1e-3


def test_partial_fit_sequence_matches_sklearn():
    X = blobs(5000, 4, 8, 2.0, seed=1)
    w = np.random.default_rng(1).uniform(0, 2, len(X))
    theirs = SkMiniBatchKMeans(8, random_state=2, batch_size=500)
    ours = MiniBatchKMeans(8, random_state=2, batch_size=500, comm=SELF)
    # The first batch is larger than batch_size, so both choose the start from a sample of it.
    for s, e in [(0, 1600), (1600, 2300), (2300, 2400), (2400, 5000)]:
        theirs.partial_fit(X[s:e], sample_weight=w[s:e])
        ours.partial_fit(X[s:e], sample_weight=w[s:e])
        assert_agrees(ours, theirs)


@kmeans_cases.sklearn_draws_as_mpinb
def test_partial_fit_after_fit_continues_like_sklearn():
    X = blobs()
    ours, theirs = both(X, n_clusters=6, batch_size=256)
    for s in range(0, 3000, 1000):
        theirs.partial_fit(X[s : s + 1000])
        ours.partial_fit(X[s : s + 1000])
    assert_agrees(ours, theirs)


def far_centres(X, k, n_far):
    """Initial centres of which ``n_far`` lie far from every row: they absorb nothing, so
    scikit-learn reassigns them to rows of a mini-batch."""
    init = X[:k].copy()
    init[k - n_far :] = X.max(axis=0) + 100.0 * np.arange(1, n_far + 1)[:, None]
    return init


@kmeans_cases.sklearn_draws_as_mpinb
def test_reassignment_happens_as_in_sklearn(monkeypatch):
    X = blobs(4000, 4, 8, 2.0, seed=1)
    init = far_centres(X, 8, 3)
    fetched = []
    gather = rows_module.gather_chosen_rows

    def spy(X_, weights, mine, local, m, dtype, comm, name):
        fetched.append(m)
        return gather(X_, weights, mine, local, m, dtype, comm, name)

    monkeypatch.setattr(rows_module, "gather_chosen_rows", spy)
    with contextlib.redirect_stdout(io.StringIO()) as said:
        theirs = SkMiniBatchKMeans(8, init=init, batch_size=128, random_state=4, verbose=1).fit(X)
    assert "Reassigning 3 cluster centers" in said.getvalue()
    ours = MiniBatchKMeans(8, init=init, batch_size=128, random_state=4, comm=SELF).fit(X)
    assert_agrees(ours, theirs)
    assert fetched and fetched[0] == 3  # the three far centres, moved to rows of a mini-batch
    assert np.abs(ours.cluster_centers_ - init[5:, None]).min() > 50  # none stayed far
    # partial_fit reassigns too, choosing among the rows of its call.
    theirs = SkMiniBatchKMeans(8, init=init, random_state=4)
    ours = MiniBatchKMeans(8, init=init, random_state=4, comm=SELF)
    del fetched[:]
    for s in range(0, 4000, 1000):
        theirs.partial_fit(X[s : s + 1000])
        ours.partial_fit(X[s : s + 1000])
        assert_agrees(ours, theirs)
    assert fetched[0] == 3


@kmeans_cases.sklearn_draws_as_mpinb
def test_verbose_prints_sklearns_progress_lines():
    """verbose=1 prints scikit-learn's lines -- initialisation, every mini-batch, reassignments, the
    reason for stopping -- in its order, with its numbers to round-off; verbose=0 prints nothing."""
    X = blobs(4000, 4, 8, 2.0, seed=1)
    kwargs = {"init": far_centres(X, 8, 3), "batch_size": 128, "random_state": 4, "verbose": 1}
    said = []
    for est in (SkMiniBatchKMeans(8, **kwargs), MiniBatchKMeans(8, comm=SELF, **kwargs)):
        with contextlib.redirect_stdout(io.StringIO()) as out:
            est.fit(X)
        said.append(progress_lines(out.getvalue()))
    (their_words, their_numbers), (our_words, our_numbers) = said
    assert our_words == their_words
    assert "[MiniBatchKMeans] Reassigning 3 cluster centers." in our_words
    assert our_words[-1].startswith("Converged") and len(our_words) > 10
    np.testing.assert_allclose(our_numbers, their_numbers, rtol=1e-9)
    with contextlib.redirect_stdout(io.StringIO()) as out:
        MiniBatchKMeans(8, comm=SELF, **{**kwargs, "verbose": 0}).fit(X)
    assert out.getvalue() == ""
    with pytest.raises(TypeError, match=r"verbose must be True or False or a non-negative integer; got 'yes'"):
        MiniBatchKMeans(8, comm=SELF, **{**kwargs, "verbose": "yes"}).fit(X)


def progress_lines(text):
    """The progress lines of ``verbose`` output (an array init printed only by name), with their
    floating-point numbers masked, and those numbers."""
    words, numbers = [], []
    for line in text.splitlines():
        if line.startswith("Init "):
            line = line.split(" with method")[0]
        elif not line.startswith(("Minibatch step", "Converged", "[MiniBatchKMeans]", "Inertia for init")):
            continue
        found = re.findall(r"-?\d+\.\d+(?:e[-+]?\d+)?", line)
        numbers.extend(float(x) for x in found)
        words.append(re.sub(r"-?\d+\.\d+(?:e[-+]?\d+)?", "#", line))
    return words, np.array(numbers)


@kmeans_cases.sklearn_draws_as_mpinb
def test_no_reassignment_with_ratio_zero():
    X = blobs(4000, 4, 8, 2.0, seed=1)
    init = far_centres(X, 8, 3)
    ours, theirs = both(X, n_clusters=8, init=init, batch_size=128, reassignment_ratio=0.0)
    assert_agrees(ours, theirs)
    np.testing.assert_array_equal(ours.cluster_centers_[5:], init[5:])  # never moved


@kmeans_cases.sklearn_draws_as_mpinb
def test_max_no_improvement_stops_early_as_sklearn():
    X = blobs()
    full = (100 * 3000) // 256
    ours, theirs = both(X, n_clusters=6, batch_size=256, max_no_improvement=3)
    assert_agrees(ours, theirs)
    assert ours.n_steps_ < full
    patient = MiniBatchKMeans(6, batch_size=256, random_state=3, max_no_improvement=20, comm=SELF).fit(X)
    assert ours.n_steps_ < patient.n_steps_
    never = MiniBatchKMeans(6, batch_size=256, random_state=3, max_no_improvement=None, max_iter=2, comm=SELF)
    never.fit(X)
    assert never.n_steps_ == (2 * 3000) // 256 and never.n_iter_ == 2


def test_kmeans_parallel_init_on_the_sample():
    X = blobs(4000, 4, 8, 2.0, seed=1)
    a = MiniBatchKMeans(8, init="k-means||", batch_size=256, random_state=0, comm=SELF).fit(X)
    b = MiniBatchKMeans(8, init="k-means||", batch_size=256, random_state=0, comm=SELF).fit(X)
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)
    plusplus = MiniBatchKMeans(8, batch_size=256, random_state=0, comm=SELF).fit(X)
    assert a.inertia_ <= 1.1 * plusplus.inertia_


@pytest.mark.parametrize("how", ["sigint", "request"])
def test_interrupt_stops_at_the_next_mini_batch(how):
    X = blobs()
    mbk = MiniBatchKMeans(6, batch_size=100, max_no_improvement=None, comm=SELF)
    previous = signal.getsignal(signal.SIGINT)

    def hook(info):
        if info["step"] == 3:
            if how == "sigint":
                signal.raise_signal(signal.SIGINT)
            else:
                info["stop"].request()

    mbk._on_iteration = hook
    with pytest.raises(KeyboardInterrupt, match=r"mpinb\.MiniBatchKMeans\.fit \(mini-batch 4\)"):
        mbk.fit(X)
    assert not hasattr(mbk, "cluster_centers_")
    assert signal.getsignal(signal.SIGINT) is previous
    assert "_on_iteration" not in pickle.loads(pickle.dumps(mbk)).__dict__


def _batch_sums_reference(X, rows, w, centers):
    """The mini-batch pass from its definition: exact distances (float64), lowest index on ties."""
    x = X[rows].astype(np.float64)
    sq = ((x[:, None, :] - centers[None, :, :]) ** 2).sum(axis=2)
    labels = sq.argmin(axis=1)
    ws = np.ones(rows.size) if w is None else w[rows]
    sums, wsum = np.zeros(centers.shape), np.zeros(len(centers))
    np.add.at(sums, labels, x * ws[:, None])
    np.add.at(wsum, labels, ws)
    return sums, wsum, float(sq[np.arange(rows.size), labels] @ ws)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("weighted", [False, True])
def test_executors_agree_on_the_mini_batch_pass(dtype, weighted):
    """``batch_sums`` of the NumPy and compiled executors: the nearest centre by exact distance
    (lowest index on exact ties), the weighted sums, weights and inertia of the rows ``X[rows]``
    (repeats count once each), read in place from a non-contiguous array too; nothing for no rows."""
    executors = (_kernels.kernels(_kernels.COMPILE_FROM), _kernels.NUMPY)
    assert [ex.name for ex in executors] == ["compiled", "numpy"]
    rng = np.random.default_rng(8)
    n, d, k = 2000, 7, 9
    w = rng.uniform(0, 2, n) if weighted else None
    if weighted:
        w[::7] = 0.0
    wv = np.empty(0) if w is None else w
    rows = rng.integers(0, n, 333)  # not a multiple of the compiled pass's block; repeats
    normal = rng.normal(size=(n, d)).astype(dtype)
    twin = rng.normal(size=(k, d))
    twin[6] = twin[2]  # an exact tie between distinct indices: centre 6 never wins
    # Small integers: many rows exactly equidistant from two or more distinct centres.
    grid = rng.integers(-2, 3, size=(n, 2 * d)).astype(dtype)[:, ::2]  # strided rows
    grid_centres = rng.integers(-1, 2, size=(k, d)).astype(np.float64)
    for X, centers in ((normal, twin), (grid, grid_centres)):
        want_sums, want_w, want_inertia = _batch_sums_reference(X, rows, w, centers)
        exact = X is grid and not weighted  # integer sums: no round-off at all
        for ex in executors:
            sums, wsum = np.zeros((k, d)), np.zeros(k)
            inertia = ex.batch_sums(X, rows, wv, weighted, centers, sums, wsum)
            if exact:
                np.testing.assert_array_equal(sums, want_sums, err_msg=ex.name)
                np.testing.assert_array_equal(wsum, want_w, err_msg=ex.name)
                assert inertia == want_inertia, ex.name
            np.testing.assert_allclose(sums, want_sums, rtol=1e-12, atol=1e-12, err_msg=ex.name)
            np.testing.assert_allclose(wsum, want_w, rtol=1e-12, atol=1e-12, err_msg=ex.name)
            assert inertia == pytest.approx(want_inertia, rel=1e-12), ex.name
            if X is normal:
                assert wsum[6] == 0.0, ex.name
        if X is grid:
            ties = ((X[rows][:, None, :] - centers[None]) ** 2).sum(axis=2)
            assert ((ties == ties.min(axis=1, keepdims=True)).sum(axis=1) > 1).mean() > 0.1
    for ex in executors:
        sums, wsum = np.zeros((k, d)), np.zeros(k)
        assert ex.batch_sums(normal, np.empty(0, np.int64), wv, weighted, twin, sums, wsum) == 0.0
        assert not sums.any() and not wsum.any()
