"""Mini-batch k-means over rows spread across ranks: scikit-learn's estimator, one Allreduce per batch."""

from __future__ import annotations

import functools
import math
import numbers
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from sklearn.base import BaseEstimator, ClusterMixin, TransformerMixin

from mpinb import _collective
from mpinb.errors import _check_int, _digest, _resolve, check_same, raise_together
from mpinb.interrupt import StopFlag
from mpinb.kmeans._estimator import _describe_params, check_params, checked_rows
from mpinb.kmeans._fitted import FittedCentres
from mpinb.kmeans._kernels import kernels
from mpinb.kmeans._lloyd import Shard, local_inertia, nearest
from mpinb.live import Progress

__all__ = ["MiniBatchKMeans"]

# Published inertia points per fit at most (mpinb.live sends the whole series in each message).
_PROGRESS_POINTS = 1000
# The weights argument of an unweighted pass (the compiled passes need an array of one type).
_NO_WEIGHTS = np.empty(0)


class MiniBatchKMeans(FittedCentres, ClusterMixin, TransformerMixin, BaseEstimator):
    """Mini-batch k-means of data spread over MPI ranks, each rank keeping its own rows.

    Collective: every rank of ``comm`` constructs it with the same parameters and calls
    :meth:`fit`, :meth:`partial_fit` (and :meth:`score`) together, each passing only its own
    shard ``X_local``. It is scikit-learn's ``MiniBatchKMeans`` -- the same sampling, per-centre
    learning rate, random reassignment of small clusters, early stopping on the smoothed batch
    inertia and ``tol`` -- with the rows left where they are:

    - Every random number is drawn, in scikit-learn's order, from one generator that is in the
      same state on every rank, and it picks a *global* row index. Each rank takes the drawn
      rows that it holds, so a mini-batch costs one local pass over about
      ``batch_size / n_ranks`` rows and one ``Allreduce`` of the packed per-cluster sums,
      weights, batch inertia and stop flag. The update, the reassignment and the stopping
      decisions then run on identical numbers on every rank.
    - The rows that every rank needs -- the ``init_size`` sample the initial centres are
      chosen from, and the few rows that replace reassigned centres -- are gathered (only those
      rows) in one collective each.

    So the result does not depend on the number of ranks beyond float round-off, and on one
    rank it is scikit-learn's from the same integer seed (see Notes). Ctrl-C (SIGINT) on any
    rank stops every rank at the same mini-batch with ``KeyboardInterrupt``.

    Parameters
    ----------
    n_clusters : int, default 8
        Number of clusters, at most the total number of samples over all ranks.
    init : {"k-means++", "k-means||", "random"}, callable or array of shape (n_clusters, n_features)
        How the initial centres are chosen from the ``init_size`` sample (every row when
        ``init_size`` is at least the number of rows), which every rank holds in full:
        ``"k-means++"`` is scikit-learn's greedy k-means++ and ``"random"`` scikit-learn's
        weighted choice of distinct rows, drawing the same random numbers; ``"k-means||"`` is
        mpinb's scalable variant run on the sample. A callable is called as scikit-learn calls
        it, ``init(X_sample, n_clusters, random_state=random_state)``, on every rank with the
        same sample and generator; it must return the same centres everywhere (checked: a
        difference raises :class:`mpinb.CollectiveMismatchError` on every rank). An array gives
        the centres.
    max_iter : int, default 100
        Upper bound on the passes over the data: at most ``max_iter * n_samples // batch_size``
        mini-batches.
    batch_size : int, default 1024
        Rows per mini-batch over **all** ranks (drawn with replacement by global row index, so
        each rank processes about ``batch_size / n_ranks`` of them); at most the number of rows.
    verbose : int, default 0
        Accepted for scikit-learn's API and ignored: rank 0 publishes the inertia to the
        notebook through :mod:`mpinb.live` instead.
    compute_labels : bool, default True
        After the mini-batches, assign every row and compute the exact inertia (one more pass and
        one ``Allreduce``); otherwise ``inertia_`` is the smoothed batch estimate.
    random_state : int, numpy.random.RandomState or None
        Seed of every random choice. ``None`` draws a seed on rank 0 and shares it.
    tol : float, default 0.0
        Stop when the squared movement of the centres in one mini-batch is at most ``tol``
        times the mean variance of the features (over all rows); 0 disables it.
    max_no_improvement : int or None, default 10
        Stop after this many consecutive mini-batches without improvement of the smoothed
        (exponentially weighted) batch inertia; ``None`` disables it.
    init_size : int or None, default None
        Rows sampled (with replacement, by global index) to choose the initial centres from,
        and to compare the ``n_init`` candidates on; ``3 * batch_size`` by default (at least
        ``3 * n_clusters``). These rows are gathered on every rank.
    n_init : "auto" or int, default "auto"
        Number of initialisations, each from a fresh sample; the one with the lowest inertia on
        the validation sample is kept. ``"auto"`` means 3 for ``init="random"`` and a callable
        and 1 otherwise, as in scikit-learn. :meth:`partial_fit` initialises once.
    reassignment_ratio : float, default 0.01
        Centres whose accumulated weight falls below this fraction of the heaviest one's are
        moved to randomly chosen rows of the current mini-batch.
    comm : mpi4py.MPI.Comm, optional
        The ranks that hold the data; ``MPI.COMM_WORLD`` when omitted (resolved at call time).
        It is not pickled with the estimator.

    Attributes
    ----------
    cluster_centers_ : ndarray of shape (n_clusters, n_features)
        Centres, identical on every rank (float32 only when every rank passed float32 data).
    labels_ : ndarray of shape (n_local_samples,), int32
        The cluster of each row of *this rank's* shard (of this rank's rows of the last call in
        :meth:`partial_fit`); set only with ``compute_labels=True``.
    inertia_ : float
        With ``compute_labels``, the weighted sum of squared distances of all samples (of the
        last mini-batch in :meth:`partial_fit`) to their centres, over all ranks; otherwise the
        smoothed batch inertia scaled to the total weight.
    n_iter_ : int
        Passes over the data, ``ceil(n_steps_ * batch_size / n_samples)`` (set by :meth:`fit`).
    n_steps_ : int
        Mini-batches processed.
    n_features_in_ : int
        Number of features seen during :meth:`fit`.

    Notes
    -----
    Sampling: scikit-learn draws each mini-batch as ``random_state.choice(n, batch_size,
    p=w / w.sum())``: one uniform number per row, looked up in the cumulative weights. mpinb
    draws the same uniform numbers and maps them to global rows: ``floor(u * n)`` for unit
    weights (exact, the same at any number of ranks) and the rank, then row, of the cumulative
    weights otherwise. scikit-learn's cumulative sum of ``n`` equal weights carries a round-off
    of order ``n`` times the machine epsilon, so on very large data some of its draws land on a
    neighbouring row: measured 0 of 200,000 draws differ at up to 100,003 rows, 38 of 20,000 at
    20,000,000 rows. Below that, one rank draws exactly scikit-learn's rows, and the centres equal
    scikit-learn's to round-off (the per-cluster sums are added in another order). With
    ``sample_weight`` the rows a draw selects depend on how the rows are split over the ranks
    only when the draw falls within round-off of a boundary of the cumulative weights.

    A mini-batch may hold the same row more than once; it counts once per draw, as in
    scikit-learn. In :meth:`partial_fit` the mini-batch is the union of every rank's
    ``X_local`` in rank order, with its ``sample_weight``: the first call chooses the initial
    centres from it, as scikit-learn does from its first batch, and every call is one update.
    The model (centres, accumulated weights, generator) is the same on every rank, so
    :meth:`partial_fit` can carry on at another number of ranks after pickling.

    Cost: scikit-learn's early stopping smooths the batch inertia over about
    ``n_samples / (2 * batch_size)`` mini-batches, so a fit draws roughly one to two passes'
    worth of rows whatever the data size (25,000-30,000 mini-batches of 1,024 for 20,000,000
    rows in ``benchmarks/minibatch.py``). Each mini-batch costs a fixed few tens of microseconds
    (Python, and the Allreduce's round trip) besides its rows -- with the compiled pass, which
    reads the drawn rows where they lie, about 0.12 ms in all for 1,024 rows of 16 features on one
    rank -- so a larger ``batch_size`` spreads that cost over more rows.

    Examples
    --------
    >>> lo, hi = mpinb.shard_bounds(len(X), rank=comm.rank, size=comm.size)
    >>> mbk = mpinb.MiniBatchKMeans(n_clusters=3, batch_size=256, random_state=0).fit(X[lo:hi])
    >>> mbk.cluster_centers_.shape, mbk.labels_.shape == (hi - lo,)
    ((3, 4), True)
    """

    # Hook point for tests and live progress: called on every rank after each mini-batch's
    # reduction with a dict of that step's reduced values. Not a constructor parameter, so
    # sklearn's clone() drops it.
    _on_iteration: Callable[[dict[str, Any]], None] | None = None

    def __init__(
        self,
        n_clusters: int = 8,
        *,
        init: Any = "k-means++",
        max_iter: int = 100,
        batch_size: int = 1024,
        verbose: int = 0,
        compute_labels: bool = True,
        random_state: Any = None,
        tol: float = 0.0,
        max_no_improvement: int | None = 10,
        init_size: int | None = None,
        n_init: int | str = "auto",
        reassignment_ratio: float = 0.01,
        comm: Any = None,
    ) -> None:
        self.n_clusters = n_clusters
        self.init = init
        self.max_iter = max_iter
        self.batch_size = batch_size
        self.verbose = verbose
        self.compute_labels = compute_labels
        self.random_state = random_state
        self.tol = tol
        self.max_no_improvement = max_no_improvement
        self.init_size = init_size
        self.n_init = n_init
        self.reassignment_ratio = reassignment_ratio
        self.comm = comm

    def fit(self, X_local: Any, y: Any = None, sample_weight: Any = None) -> MiniBatchKMeans:
        """Compute the centres from mini-batches drawn from the rows held by all ranks.

        Collective. Every rank passes its own shard (possibly with zero rows). Invalid input on
        any rank -- NaN or infinity, a different number of features or different parameters on
        another rank, fewer samples than clusters, a bad ``init`` or ``sample_weight`` -- raises
        the same exception on every rank before any mini-batch.

        Parameters
        ----------
        X_local : array_like of shape (n_local_samples, n_features)
            This rank's rows; float32 data are accumulated in float64.
        y : None
            Ignored; present for scikit-learn's API.
        sample_weight : array_like of shape (n_local_samples,), optional
            Non-negative weight of each local row; ones when omitted. Rows are drawn with
            probability proportional to their weight (as in scikit-learn, the weights are not
            used by an array or callable ``init``).

        Returns
        -------
        MiniBatchKMeans
            ``self``, fitted.
        """
        # From the first line: a Ctrl-C during validation or set-up only sets the flag, which the
        # first mini-batch's reduction carries to every rank.
        with StopFlag() as stop:
            comm = _resolve(self.comm)
            with raise_together(comm=comm):
                params = self._validated_params()
                X, weights, local_sum = checked_rows(X_local, sample_weight, params)
            check_same(_describe(params), "the MiniBatchKMeans configuration", comm=comm)
            check_same(X.shape[1], "the number of features (columns of X_local)", comm=comm)
            k = params["n_clusters"]
            data = Shard.build(
                X, weights, local_sum, n_clusters=k, init=params["init"], tol=params["tol"], comm=comm,
                name="MiniBatchKMeans.fit",
            )
            rng = _random_state(self.random_state, comm)
            batch, init_size = _sizes(params, data.n_total)
            sampler = _Sampler(data, _weighted(weights, comm))
            state = _State(np.zeros(k), 0, batch)
            centers = _best_start(data, params, rng, init_size)
            run = _minibatches(data, sampler, centers, state, params, rng, stop, self._on_iteration)
            labels = None
            if params["compute_labels"]:
                labels, inertia = _labels_inertia(X, weights, run.centers, comm, "MiniBatchKMeans.fit")
            else:
                inertia = run.ewa_inertia * float(data.weight_sums.sum())
        self._counts, self._n_since_last_reassign = state.counts, state.since
        self._batch_size, self._init_size = batch, init_size
        self.cluster_centers_ = run.centers.astype(data.out_dtype, copy=False)
        if labels is not None:
            self.labels_ = labels
        self.inertia_ = float(inertia)
        self.n_steps_ = run.n_steps
        self.n_iter_ = -(-run.n_steps * batch // data.n_total)  # ceil
        self.n_features_in_ = int(X.shape[1])
        return self

    def partial_fit(self, X_local: Any, y: Any = None, sample_weight: Any = None) -> MiniBatchKMeans:
        """Update the centres with one mini-batch: the rows every rank passes in this call.

        Collective. The mini-batch is the union of all ranks' ``X_local`` (in rank order; a rank
        may pass zero rows); the first call (or the first after constructing or cloning the
        estimator) chooses the initial centres from it, as scikit-learn does from its first batch.
        Each call costs one local pass and one ``Allreduce`` (plus one for ``compute_labels``
        and a few small checks). Bad input on any rank, or a number of features that differs
        from the first call's, raises the same exception on every rank.

        Parameters
        ----------
        X_local : array_like of shape (n_local_samples, n_features)
            This rank's rows of the mini-batch.
        y : None
            Ignored.
        sample_weight : array_like of shape (n_local_samples,), optional
            Weight of each local row in the update; ones when omitted.

        Returns
        -------
        MiniBatchKMeans
            ``self``, updated.
        """
        with StopFlag() as stop:
            comm = _resolve(self.comm)
            fitted = hasattr(self, "cluster_centers_")
            with raise_together(comm=comm):
                params = self._validated_params()
                X, weights, local_sum = checked_rows(X_local, sample_weight, None if fitted else params)
                if fitted and X.shape[1] != self.n_features_in_:
                    raise ValueError(
                        f"X_local has {X.shape[1]} features, but MiniBatchKMeans was fitted with "
                        f"{self.n_features_in_} features."
                    )
            check_same(_describe(params), "the MiniBatchKMeans configuration", comm=comm)
            k = params["n_clusters"]
            if fitted:
                layout = _Layout(_rows_per_rank(X, comm), comm)
                out_dtype = self.cluster_centers_.dtype
            else:
                check_same(X.shape[1], "the number of features (columns of X_local)", comm=comm)
                data = Shard.build(
                    X, weights, local_sum, n_clusters=k, init=params["init"], tol=0.0, comm=comm,
                    name="MiniBatchKMeans.partial_fit",
                )
                layout, out_dtype = _Layout(data.counts, comm), data.out_dtype
            n = layout.n_total
            rng = getattr(self, "_random_state", None)
            if rng is None:
                rng = _random_state(self.random_state, comm)
            if fitted:
                centers = np.asarray(self.cluster_centers_, dtype=np.float64)
                counts = np.array(self._counts, dtype=np.float64)
                state = _State(counts, self._n_since_last_reassign, self._batch_size)
                init_size = self._init_size
            else:
                # As scikit-learn: the first batch sets the batch and init sample sizes, and the
                # initial centres come from (a sample of) it.
                batch, init_size = _sizes(params, n)
                idx = rng.randint(0, n, init_size) if init_size < n else None
                centers = _initial_centers(data, idx, params, rng)
                state = _State(np.zeros(k), 0, batch)
            done = getattr(self, "n_steps_", 0)
            # The executor from the global batch, so every rank takes the same one.
            step = _Step(k, X.shape[1], comm, "mpinb.MiniBatchKMeans.partial_fit", kernels(n * k), done)
            fetch = functools.partial(layout.rows_only, X)
            ratio = params["reassignment_ratio"]
            rows = np.arange(X.shape[0])
            centers, _ = _one_step(step, X, rows, weights, centers, state, ratio, n, rng, stop, fetch)
            labels = None
            if params["compute_labels"]:
                labels, inertia = _labels_inertia(X, weights, centers, comm, "MiniBatchKMeans.partial_fit")
        self._random_state = rng
        self._counts, self._n_since_last_reassign = state.counts, state.since
        self._batch_size, self._init_size = state.batch, init_size
        self.cluster_centers_ = centers.astype(out_dtype, copy=False)
        if labels is not None:
            self.labels_, self.inertia_ = labels, float(inertia)
        self.n_steps_ = done + 1
        self.n_features_in_ = int(X.shape[1])
        return self

    def _validated_params(self) -> dict[str, Any]:
        """Local checks of the hyper-parameters, with the messages users see on every rank."""
        shared = check_params(self, auto_runs=3)  # KMeans's rules: the same values, the same words
        batch_size = _check_int(
            self.batch_size, "batch_size", minimum=1, unit="number of rows over all ranks"
        )
        if not isinstance(self.compute_labels, (bool, np.bool_)):
            raise TypeError(f"compute_labels must be True or False; got {self.compute_labels!r}.")
        patience = self.max_no_improvement
        if patience is not None:
            patience = _check_int(patience, "max_no_improvement", minimum=0, alternative="None")
        init_size = self.init_size
        if init_size is not None:
            init_size = _check_int(init_size, "init_size", minimum=1, alternative="None")
        ratio = self.reassignment_ratio
        if not isinstance(ratio, numbers.Real) or isinstance(ratio, bool) or not 0 <= ratio < math.inf:
            raise ValueError(f"reassignment_ratio must be a finite number >= 0; got {ratio!r}.")
        return {
            **shared,
            "batch_size": batch_size,
            "compute_labels": bool(self.compute_labels),
            "max_no_improvement": patience,
            "init_size": init_size,
            "reassignment_ratio": float(ratio),
        }


# ----------------------------------------------------------------------------------------------
# Input, sizes and set-up


def _describe(params: dict[str, Any]) -> tuple[Any, ...]:
    extra = ("batch_size", "compute_labels", "max_no_improvement", "init_size", "reassignment_ratio")
    return _describe_params(params) + tuple((name, params[name]) for name in extra)


def _random_state(random_state: Any, comm: Any) -> np.random.RandomState:
    from mpinb.kmeans._init import resolve_random_state

    return resolve_random_state(random_state, comm)


def _sizes(params: dict[str, Any], n: int) -> tuple[int, int]:
    """scikit-learn's effective batch and init sample sizes for ``n`` rows in all."""
    k = params["n_clusters"]
    batch = min(params["batch_size"], n)
    init_size = params["init_size"]
    if init_size is None:
        init_size = 3 * batch
        if init_size < k:
            init_size = 3 * k
    elif init_size < k:
        warnings.warn(
            f"init_size={init_size} should be larger than n_clusters={k}. Setting it to "
            "min(3*n_clusters, n_samples)",
            RuntimeWarning,
            stacklevel=3,
        )
        init_size = 3 * k
    return batch, min(init_size, n)


def _weighted(weights: np.ndarray | None, comm: Any) -> bool:
    """Whether any rank has weights other than ones (one small collective): with unit weights
    everywhere a draw maps to a row by ``floor(u * n)``, exactly, at any number of ranks."""
    vote = int(weights is not None and bool(np.any(weights != 1.0)))
    with _collective.collective(comm, "MiniBatchKMeans.fit's weights vote", votes=(vote, 0)) as op:
        return bool(op.votes[0])


def _rows_per_rank(X: np.ndarray, comm: Any) -> np.ndarray:
    """Rows per rank of a ``partial_fit`` call (one small collective); an empty union raises."""
    counts = np.array(
        _collective.allgather(X.shape[0], comm=comm, name="MiniBatchKMeans.partial_fit's batch size"),
        dtype=np.int64,
    )
    if counts.sum() == 0:
        raise ValueError("partial_fit got 0 rows on every rank; pass at least one row on some rank.")
    return counts


# ----------------------------------------------------------------------------------------------
# Where the drawn rows are


@dataclass
class _Draws:
    where: np.ndarray  # global row of each draw (unit weights) or its point on the cumulative weights
    mine: np.ndarray  # positions in the mini-batch of this rank's draws
    local: np.ndarray  # their local row indices


class _Layout:
    """Global row index -> (rank, local row), and gathering chosen rows to every rank."""

    def __init__(self, counts: np.ndarray, comm: Any) -> None:
        self.ends = np.cumsum(counts)
        self.n_total = int(self.ends[-1])
        self.rank = comm.Get_rank()
        self.offset = int(self.ends[self.rank] - counts[self.rank])
        self.comm = comm

    def rows(
        self, X: np.ndarray, weights: np.ndarray | None, index: np.ndarray, dtype: Any
    ) -> tuple[np.ndarray, np.ndarray]:
        """Rows ``index`` (global, in that order, repeats allowed) and their weights, on every
        rank. Collective: one allgather of only those rows."""
        owner = np.searchsorted(self.ends, index, side="right")
        mine = np.flatnonzero(owner == self.rank)
        return _gather(X, weights, mine, index[mine] - self.offset, index.size, dtype, self.comm)

    def rows_only(self, X: np.ndarray, index: np.ndarray) -> np.ndarray:
        """Rows ``index`` in float64 on every rank (the new centres of a reassignment). Collective."""
        return self.rows(X, None, index, np.float64)[0]


class _Sampler:
    """Maps the uniform numbers of a mini-batch to global rows, and those to ranks (``fit``).

    Unit weights: row ``floor(u * n)``. Weighted: the row where ``u * W`` falls in the
    cumulative weights in rank order (first the rank, from the per-rank totals every rank
    knows, then the row, in this rank's cumulative weights), so a zero-weight row is never drawn.
    """

    def __init__(self, data: Shard, weighted: bool) -> None:
        self.data = data
        self.weighted = weighted
        self.layout = _Layout(data.counts, data.comm)
        self.n = data.n_total
        self.lo, self.hi = data.offset, data.offset + data.n_local
        self.everything: np.ndarray | None = None  # positions 0..batch-1, when this rank holds every row
        if weighted:
            w = data.weights if data.weights is not None else np.ones(data.n_local)
            self.w_ends = np.cumsum(data.weight_sums)
            self.total = float(self.w_ends[-1])
            self.last_rank = int(np.flatnonzero(data.weight_sums > 0)[-1])
            start = float(self.w_ends[data.rank] - data.weight_sums[data.rank])
            self.cum = start + np.cumsum(w)
            positive = np.flatnonzero(w > 0)
            self.last_row = int(positive[-1]) if positive.size else 0

    def draw(self, u: np.ndarray) -> _Draws:
        if not self.weighted:
            g = (u * self.n).astype(np.int64)
            np.minimum(g, self.n - 1, out=g)
            if self.hi - self.lo == self.n:
                if self.everything is None or self.everything.size != g.size:
                    self.everything = np.arange(g.size)
                return _Draws(g, self.everything, g)
            # lo <= g < hi as one unsigned comparison: a row below lo wraps to a huge offset.
            off = g - self.lo
            mine = np.flatnonzero(off.view(np.uint64) < self.hi - self.lo)
            return _Draws(g, mine, off[mine])
        t = u * self.total
        mine = np.flatnonzero(self._owner(t) == self.data.rank)
        local = np.searchsorted(self.cum, t[mine], side="right")
        np.minimum(local, self.last_row, out=local)
        return _Draws(t, mine, local)

    def rows(self, X: np.ndarray, draws: _Draws, chosen: np.ndarray) -> np.ndarray:
        """Rows at positions ``chosen`` of the mini-batch ``draws``, on every rank. Collective."""
        where = draws.where[chosen]
        if self.weighted:
            owner = self._owner(where)
        else:
            owner = np.searchsorted(self.layout.ends, where, side="right")
        local_at = np.full(draws.where.size, -1, dtype=np.int64)
        local_at[draws.mine] = draws.local
        mine = np.flatnonzero(owner == self.data.rank)
        return _gather(X, None, mine, local_at[chosen[mine]], chosen.size, np.float64, self.data.comm)[0]

    def _owner(self, t: np.ndarray) -> np.ndarray:
        """The rank whose span of the cumulative weights holds each point (never a rank of zero
        weight; round-off past the end goes to the last rank with weight)."""
        owner = np.searchsorted(self.w_ends, t, side="right")
        return np.minimum(owner, self.last_rank, out=owner)


def _gather(
    X: np.ndarray, weights: np.ndarray | None, mine: np.ndarray, local: np.ndarray, m: int, dtype: Any,
    comm: Any,
) -> tuple[np.ndarray, np.ndarray]:
    """Assemble ``m`` requested rows on every rank: this rank holds those at positions ``mine``
    (local rows ``local``). Collective: one allgather."""
    payload = (mine, X[local], None if weights is None else weights[local])
    parts = _collective.allgather(payload, comm=comm, name="MiniBatchKMeans's gathered rows")
    rows = np.empty((m, X.shape[1]), dtype=dtype)
    w = np.ones(m)
    for pos, got, got_w in parts:
        rows[pos] = got
        if got_w is not None:
            w[pos] = got_w
    return rows, w


# ----------------------------------------------------------------------------------------------
# Initial centres


def _best_start(
    data: Shard, params: dict[str, Any], rng: np.random.RandomState, init_size: int
) -> np.ndarray:
    """scikit-learn's initialisation of ``fit``: a validation sample, then ``n_init`` starts,
    each from its own ``init_size`` sample, compared by their inertia on the validation sample
    (one Allreduce for all of them)."""
    n = data.n_total
    validation = rng.randint(0, n, init_size)
    starts = []
    for _ in range(params["n_init"]):
        idx = rng.randint(0, n, init_size) if init_size < n else None
        starts.append(_initial_centers(data, idx, params, rng))
    if len(starts) == 1:
        return starts[0]
    owner = np.searchsorted(np.cumsum(data.counts), validation, side="right")
    local = validation[owner == data.rank] - data.offset
    rows = data.X[local]
    w = None if data.weights is None else data.weights[local]
    inertias = np.array([local_inertia(rows, w, c, nearest(rows, c)) for c in starts])
    _collective.reduce_in_place([inertias], comm=data.comm, name="MiniBatchKMeans.fit's validation inertia")
    return starts[int(np.argmin(inertias))]  # the first of equal inertias, as scikit-learn


def _initial_centers(
    data: Shard, idx: np.ndarray | None, params: dict[str, Any], rng: np.random.RandomState
) -> np.ndarray:
    """Initial centres (float64, raw coordinates) chosen from the global rows ``idx`` (all rows
    when ``None``), which are gathered to every rank; identical on every rank. Collective."""
    init, k = params["init"], params["n_clusters"]
    d = data.X.shape[1]
    if isinstance(init, np.ndarray):
        return init.astype(data.out_dtype).astype(np.float64)
    layout = _Layout(data.counts, data.comm)
    index = np.arange(data.n_total) if idx is None else idx
    sample, w = layout.rows(data.X, data.weights, index, data.out_dtype)
    w = w.astype(data.out_dtype)
    # Every rank chooses from the same rows with the same generator; an error on one (memory,
    # a callable that fails) must still be raised on all.
    with raise_together(comm=data.comm):
        if callable(init):
            from mpinb.kmeans._init import _callable_result

            centers = _callable_result(init(sample, k, random_state=rng), k, d).astype(data.out_dtype)
        elif init == "k-means++":
            from sklearn.cluster import kmeans_plusplus

            centers, _ = kmeans_plusplus(sample, k, sample_weight=w, random_state=rng)
        elif init == "random":
            centers = sample[rng.choice(sample.shape[0], size=k, replace=False, p=w / w.sum())]
        else:
            centers = _kmeans_parallel_on(sample, w, k, rng)
    centers = np.asarray(centers, dtype=np.float64)
    if callable(init):
        check_same((_digest(centers), _digest(rng)), "what init(X_sample, n_clusters, random_state) returned and left random_state in "
                   "(it gets the same sample and generator on every rank)", comm=data.comm)
    return centers


def _kmeans_parallel_on(sample: np.ndarray, w: np.ndarray, k: int, rng: np.random.RandomState) -> np.ndarray:
    """mpinb's k-means|| over the sample, on this process alone."""
    from mpi4py import MPI

    from mpinb.kmeans._init import initial_centers

    sub = Shard.build(sample, w.astype(np.float64), sample.sum(axis=0, dtype=np.float64), n_clusters=k,
                      init="k-means||", tol=0.0, comm=MPI.COMM_SELF, name="MiniBatchKMeans's k-means|| init")
    return initial_centers(sub, "k-means||", k, rng, None) + sub.mean


# ----------------------------------------------------------------------------------------------
# One mini-batch


@dataclass
class _State:
    """What the mini-batches accumulate: each centre's weight, and the rows seen since the last
    reassignment check (per ``batch`` rows, scikit-learn's ``_batch_size``)."""

    counts: np.ndarray
    since: int
    batch: int

    def due(self) -> bool:
        """scikit-learn's ``_random_reassign``: every ``10 * n_clusters`` rows seen, or whenever a
        centre has absorbed nothing yet."""
        self.since += self.batch
        if self.since >= 10 * self.counts.size or self.counts.min() == 0:  # weights are >= 0
            self.since = 0
            return True
        return False


@dataclass
class _Run:
    centers: np.ndarray
    n_steps: int
    ewa_inertia: float  # smoothed mean batch inertia (the last batch's when there was only one)


def _minibatches(
    data: Shard, sampler: _Sampler, centers: np.ndarray, state: _State, params: dict[str, Any],
    rng: np.random.RandomState, stop: StopFlag, hook: Callable[[dict[str, Any]], None] | None,
) -> _Run:
    """scikit-learn's loop of ``MiniBatchKMeans.fit`` over distributed rows, one Allreduce per
    mini-batch (and one gather in the rare mini-batches that move a centre). Collective."""
    k, d = centers.shape
    n, batch = data.n_total, state.batch
    monitor = _Monitor(batch, n, data.tol, params["max_no_improvement"])
    n_steps = (params["max_iter"] * n) // batch
    total_weight = float(data.weight_sums.sum())
    # The executor from the global size, so every rank takes the same one.
    step = _Step(k, d, data.comm, "mpinb.MiniBatchKMeans.fit", kernels(n * k))
    stride = max(1, n_steps // _PROGRESS_POINTS)
    X, ratio = data.X, params["reassignment_ratio"]
    i = 0
    # Rank 0 publishes the inertia curve to the notebook (mpinb.live.watch).
    with Progress("inertia", total=n_steps, comm=data.comm) as progress:
        for i in range(n_steps):
            draws = sampler.draw(rng.random_sample(batch))
            # The pass reads the drawn rows in place: no gathered copy of the mini-batch.
            new, batch_inertia = _one_step(step, X, draws.local, None, centers, state, ratio, batch, rng,
                                           stop, functools.partial(sampler.rows, X, draws))
            shift = float(np.sum((new - centers) ** 2)) if data.tol > 0 else 0.0
            centers = new
            done = monitor.done(i, shift, batch_inertia)
            if i % stride == 0 or done:
                progress.update(i + 1, inertia=batch_inertia * total_weight / batch)
            if hook is not None:
                hook({"step": i + 1, "batch_inertia": batch_inertia, "ewa_inertia": monitor.ewa,
                      "centers": centers.copy(), "stop": stop})
            if done:
                break
    return _Run(centers, i + 1, monitor.ewa if monitor.ewa is not None else monitor.last)


def _one_step(
    step: _Step, X: np.ndarray, rows: np.ndarray, weights: np.ndarray | None, centers: np.ndarray,
    state: _State, ratio: float, batch_rows: int, rng: np.random.RandomState, stop: StopFlag,
    fetch: Callable[[np.ndarray], np.ndarray],
) -> tuple[np.ndarray, float]:
    """scikit-learn's ``_mini_batch_step`` on a mini-batch of ``batch_rows`` rows over all ranks,
    of which this rank holds ``X[rows]`` (``weights`` indexed like ``X``): the new centres and the
    batch inertia. Collective."""
    due = state.due()  # decided before the update, from the weights accumulated so far
    sums, wsum, inertia = step.sums_of(X, rows, weights, centers, stop)
    new = _update(centers, state.counts, sums, wsum)
    if due and ratio > 0:
        _reassign(new, state.counts, ratio, batch_rows, rng, fetch)
    return new, inertia


class _Step:
    """The local sums of one mini-batch and their one Allreduce: ``[sums | weights | inertia | stop]``."""

    def __init__(self, k: int, d: int, comm: Any, where: str, run_on: Any, done: int = 0) -> None:
        self.comm, self.where, self.run_on = comm, where, run_on
        self.name = f"{where}'s mini-batch"
        self.packed = np.empty(k * d + k + 2)
        self.sums = self.packed[: k * d].reshape(k, d)
        self.wsum = self.packed[k * d : k * d + k]
        self.calls = done  # mini-batches before this one, for the interrupt's message

    def sums_of(
        self, X: np.ndarray, rows: np.ndarray, weights: np.ndarray | None, centers: np.ndarray, stop: StopFlag
    ) -> tuple[np.ndarray, np.ndarray, float]:
        """Global per-cluster weighted sums (k, d), weights (k) and the batch inertia against
        ``centers`` of the rows ``X[rows]`` every rank passes (each rank its own; repeats count
        once per occurrence). Collective; a stop requested on any rank raises
        ``KeyboardInterrupt`` on every rank here."""
        packed = self.packed
        packed[:] = 0.0
        if rows.size:
            w = _NO_WEIGHTS if weights is None else weights
            packed[-2] = self.run_on.batch_sums(X, rows, w, weights is not None, centers, self.sums, self.wsum)
        packed[-1] = stop.value
        self.calls += 1
        _collective.reduce_in_place([packed], comm=self.comm, name=self.name)
        if packed[-1] > 0:
            stop.raise_interrupt(f"{self.where} (mini-batch {self.calls})")
        return self.sums.copy(), self.wsum.copy(), float(packed[-2])


def _update(centers: np.ndarray, counts: np.ndarray, sums: np.ndarray, wsum: np.ndarray) -> np.ndarray:
    """New centres: each one the weighted mean of everything it has absorbed (scikit-learn's
    per-centre learning rate ``w_batch / W``); ``counts`` accumulate in place. Local."""
    new = centers * counts[:, None]
    new += sums
    counts += wsum
    if wsum.min() > 0:  # the usual case, without the errstate context's cost
        new *= (1.0 / counts)[:, None]
        return new
    with np.errstate(invalid="ignore", divide="ignore"):  # 0 / 0 where nothing arrived: replaced below
        new *= (1.0 / counts)[:, None]
    missed = wsum <= 0
    new[missed] = centers[missed]  # untouched, not rescaled by W / W
    return new


def _reassign(
    centers: np.ndarray, counts: np.ndarray, ratio: float, batch: int, rng: np.random.RandomState,
    fetch: Callable[[np.ndarray], np.ndarray],
) -> None:
    """Move centres with little accumulated weight to random rows of the mini-batch, in place.

    The decision uses the global ``counts`` (identical everywhere); the positions are drawn
    within the mini-batch as scikit-learn draws them, and ``fetch`` gathers those rows
    (collective, only when some centre moves).
    """
    threshold = ratio * counts.max()
    if counts.min() >= threshold:
        return
    low = counts < threshold
    if low.sum() > 0.5 * batch:
        # At most half a batch of centres: the heaviest of the light ones stay.
        low[np.argsort(counts)[int(0.5 * batch) :]] = False
    n_moved = int(low.sum())
    if n_moved:
        chosen = rng.choice(batch, replace=False, size=n_moved)
        centers[low] = fetch(chosen)
    # Not reset to zero (that would make them due again at once): to the lightest remaining one.
    counts[low] = np.min(counts[~low])


class _Monitor:
    """scikit-learn's early stopping: ``tol`` on the centres' movement, and
    ``max_no_improvement`` on an exponentially weighted average of the batch inertia."""

    def __init__(self, batch: int, n: int, tol: float, patience: int | None) -> None:
        self.batch, self.tol, self.patience = batch, tol, patience
        self.alpha = min(batch * 2.0 / (n + 1), 1.0)
        self.ewa: float | None = None
        self.best: float | None = None
        self.no_improvement = 0
        self.last = 0.0

    def done(self, step: int, shift: float, batch_inertia: float) -> bool:
        mean = batch_inertia / self.batch
        self.last = mean
        if step == 0:
            return False  # the first batch's inertia is the initialisation's
        self.ewa = mean if self.ewa is None else self.ewa * (1 - self.alpha) + mean * self.alpha
        if self.tol > 0.0 and shift <= self.tol:
            return True
        if self.best is None or self.ewa < self.best:
            self.no_improvement = 0
            self.best = self.ewa
        else:
            self.no_improvement += 1
        return self.patience is not None and self.no_improvement >= self.patience


def _labels_inertia(
    X: np.ndarray, weights: np.ndarray | None, centers: np.ndarray, comm: Any, name: str
) -> tuple[np.ndarray, float]:
    """This rank's labels and the inertia over all ranks. Collective (one Allreduce)."""
    labels = nearest(X, centers)
    total = np.array([local_inertia(X, weights, centers, labels)])
    _collective.reduce_in_place([total], comm=comm, name=f"{name}'s inertia")
    return labels, float(total[0])
