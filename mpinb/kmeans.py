"""Distributed k-means: a scikit-learn shaped estimator whose ranks each keep their own rows."""

from __future__ import annotations

import hashlib
import math
import numbers
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from sklearn.base import BaseEstimator, ClusterMixin, TransformerMixin
from sklearn.exceptions import ConvergenceWarning, NotFittedError

from mpinb._kmeans_kernels import kernels
from mpinb.errors import _is_int, _resolve, check_same, raise_together
from mpinb.interrupt import StopFlag
from mpinb.live import Progress

__all__ = ["KMeans"]

_INITS = ("k-means++", "k-means||", "random")
# The assignment step packs each cluster index into the low bits of its (shifted, non-negative)
# squared distance and takes a pairwise minimum tree over the clusters; beyond this many clusters
# the truncated bits would cost too much precision, so it falls back to ``argmin``.
_PACKED_MAX_K = 4096
# Rows per chunk of the assignment step: the (k, rows) distance block stays at about 512 KiB.
_BLOCK_ELEMENTS = 1 << 16
# Rows per slice when summing rows per cluster through a sparse indicator (bounds the float64 copy
# SciPy makes of a float32 slice).
_SUM_ELEMENTS = 1 << 16
# Rows per chunk of the compiled assignment step: the (rows, k) GEMM output stays at about 128 KiB,
# which measured faster than larger blocks (it is scanned again by the argmin kernel while cached).
_JIT_BLOCK_ELEMENTS = 1 << 14
# Below this fraction of changed labels, the cluster sums are updated from the changed rows only.
_INCREMENTAL_FRACTION = 0.2
# Stands in for unit weights in the compiled kernels (which take a flag instead of None).
_NO_WEIGHTS = np.empty(0)


class KMeans(ClusterMixin, TransformerMixin, BaseEstimator):
    """K-means clustering of data spread over MPI ranks, each rank keeping its own rows.

    Collective: every rank of ``comm`` constructs it with the same parameters and calls
    :meth:`fit` (and :meth:`score`) together, each passing only its own shard ``X_local``; rows
    never move between ranks. It follows scikit-learn's Lloyd algorithm: the data are centred,
    ``tol`` is relative to the mean feature variance, iterations stop when no label changes,
    empty clusters are relocated to the points farthest from their centres (across all ranks),
    and ``n_init`` runs keep the one with the lowest inertia. Each iteration is one local pass
    over the shard in bounded chunks plus one ``Allreduce`` of the packed cluster sums, weights,
    changed-label count and stop flag. Ctrl-C (SIGINT) on any rank stops every rank at the same
    iteration with ``KeyboardInterrupt``.

    Parameters
    ----------
    n_clusters : int, default 8
        Number of clusters, at most the total number of samples over all ranks.
    init : {"k-means++", "k-means||", "random"} or array of shape (n_clusters, n_features)
        ``"k-means++"`` is scikit-learn's greedy k-means++ run exactly over the distributed
        data (one pass per centre and candidate set). ``"k-means||"`` is the scalable variant:
        about ``2 * n_clusters`` candidates per round for 5 rounds, weighted by the points they
        attract and reclustered on rank 0. ``"random"`` picks ``n_clusters`` distinct rows with
        probability proportional to their weight. Random choices depend on global row indices
        only, so a fixed ``random_state`` gives the same centres at any number of ranks (up to
        float round-off); on one rank ``"k-means++"`` and ``"random"`` draw the same centres as
        scikit-learn with the same integer seed.
    n_init : "auto" or int, default "auto"
        Number of initialisations; the run with the lowest inertia wins. ``"auto"`` means 10 for
        ``init="random"`` and 1 otherwise; an array ``init`` always runs once.
    max_iter : int, default 300
        Maximum number of Lloyd iterations per run.
    tol : float, default 1e-4
        Stop when the summed squared centre shift is at most ``tol`` times the mean variance of
        the features.
    random_state : int, numpy.random.RandomState or None
        Seed of the initialisation. ``None`` draws a seed on rank 0 and shares it.
    comm : mpi4py.MPI.Comm, optional
        The ranks that hold the data; ``MPI.COMM_WORLD`` when omitted (resolved at call time).
        It is not pickled with the estimator.

    Attributes
    ----------
    cluster_centers_ : ndarray of shape (n_clusters, n_features)
        Centres, identical on every rank (float32 only when every rank passed float32 data).
    labels_ : ndarray of shape (n_local_samples,), int32
        The cluster of each row of *this rank's* shard.
    inertia_ : float
        Weighted sum of squared distances of all samples to their centres, over all ranks.
    n_iter_ : int
        Lloyd iterations of the best run.
    inertia_history_ : ndarray of shape (n_iter_,)
        Inertia after the assignment step of each iteration of the best run (from the reduced
        cluster sums, so it costs no extra pass), for convergence plots.
    n_features_in_ : int
        Number of features seen during :meth:`fit`.

    Examples
    --------
    >>> lo, hi = mpinb.shard_bounds(len(X), rank=comm.rank, size=comm.size)
    >>> km = mpinb.KMeans(n_clusters=3, random_state=0).fit(X[lo:hi])
    >>> km.cluster_centers_.shape, km.labels_.shape == (hi - lo,)
    ((3, 4), True)
    """

    # Hook point for live progress (mpinb.live): called on every rank after each iteration's
    # reduction with a dict of that iteration's reduced values. Not a constructor parameter, so
    # sklearn's clone() drops it.
    _on_iteration: Callable[[dict[str, Any]], None] | None = None

    def __init__(
        self,
        n_clusters: int = 8,
        *,
        init: Any = "k-means++",
        n_init: int | str = "auto",
        max_iter: int = 300,
        tol: float = 1e-4,
        random_state: Any = None,
        comm: Any = None,
    ) -> None:
        self.n_clusters = n_clusters
        self.init = init
        self.n_init = n_init
        self.max_iter = max_iter
        self.tol = tol
        self.random_state = random_state
        self.comm = comm

    def fit(self, X_local: Any, y: Any = None, sample_weight: Any = None) -> KMeans:
        """Compute the clustering of the rows held by all ranks.

        Collective. Every rank passes its own shard (possibly with zero rows). Invalid input on
        any rank -- NaN or infinity, a different number of features or different parameters on
        another rank, fewer samples than clusters, a bad ``init`` array or ``sample_weight`` --
        raises the same exception on every rank before any iteration.

        Parameters
        ----------
        X_local : array_like of shape (n_local_samples, n_features)
            This rank's rows; float32 data are accumulated in float64.
        y : None
            Ignored; present for scikit-learn's API.
        sample_weight : array_like of shape (n_local_samples,), optional
            Non-negative weight of each local row; ones when omitted.

        Returns
        -------
        KMeans
            ``self``, fitted.
        """
        # From the first line: a Ctrl-C that lands during validation, set-up or a JIT compile only
        # sets the flag, which the first reduction of the initialisation or of Lloyd's loop carries
        # to every rank, instead of raising on this rank alone while the others enter a collective.
        with StopFlag() as stop:
            comm = _resolve(self.comm)
            with raise_together(comm=comm):
                params = self._validated_params()
                X = _as_data(X_local)
                weights = _as_weights(sample_weight, X.shape[0])
                init = params["init"]
                if not isinstance(init, str) and init.shape != (params["n_clusters"], X.shape[1]):
                    raise ValueError(
                        f"init has shape {init.shape}, but it must be (n_clusters, n_features) = "
                        f"({params['n_clusters']}, {X.shape[1]})."
                    )
                local_sum = X.sum(axis=0, dtype=np.float64)
                if not np.isfinite(local_sum).all():
                    _raise_nonfinite(X)
            check_same(_describe_params(params), "the KMeans configuration", comm=comm)
            check_same(X.shape[1], "the number of features (columns of X_local)", comm=comm)
            data = _Shard.build(
                X, weights, local_sum, n_clusters=params["n_clusters"], init=params["init"], tol=params["tol"], comm=comm
            )

            from mpinb._kmeans_init import initial_centers, resolve_random_state

            rng = resolve_random_state(self.random_state, comm)
            best: _Run | None = None
            for run in range(params["n_init"]):
                start = initial_centers(data, params["init"], params["n_clusters"], rng, stop)
                # Rank 0 publishes each run's inertia curve to the notebook (mpinb.live.watch).
                with Progress("inertia", total=params["max_iter"], comm=comm) as progress:
                    hook = _publishing_hook(progress, self._on_iteration)
                    result = _lloyd(data, start, params["max_iter"], data.tol, stop, hook, run)
                if best is None or (
                    result.inertia < best.inertia and not _same_clustering(result, best, data)
                ):
                    best = result
        assert best is not None
        distinct = int(np.count_nonzero(best.counts))
        if distinct < params["n_clusters"]:
            warnings.warn(
                f"Number of distinct clusters ({distinct}) found smaller than n_clusters "
                f"({params['n_clusters']}). Possibly due to duplicate points in X.",
                ConvergenceWarning,
                stacklevel=2,
            )
        centers = best.centers + data.mean
        self.cluster_centers_ = centers.astype(data.out_dtype, copy=False)
        self.labels_ = best.labels
        self.inertia_ = float(best.inertia)
        self.n_iter_ = int(best.n_iter)
        self.inertia_history_ = np.asarray(best.history, dtype=np.float64)
        self.n_features_in_ = int(X.shape[1])
        return self

    def fit_predict(self, X_local: Any, y: Any = None, sample_weight: Any = None) -> np.ndarray:
        """Fit and return this rank's labels.

        Collective: it calls :meth:`fit`.

        Returns
        -------
        ndarray of shape (n_local_samples,)
            ``labels_``.
        """
        return self.fit(X_local, sample_weight=sample_weight).labels_

    def predict(self, X: Any) -> np.ndarray:
        """The index of the nearest centre of each row.

        Local: no communication, so it also works on the notebook client for a pulled model.

        Parameters
        ----------
        X : array_like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples,), int32
        """
        X = self._check_input(X)
        centers = np.asarray(self.cluster_centers_, dtype=np.float64)
        mean = centers.mean(axis=0)
        labels = np.empty(X.shape[0], dtype=np.int32)
        _assign(X, centers - mean, mean, _max_sq_norm(X, mean), labels)
        return labels

    def transform(self, X: Any) -> np.ndarray:
        """Euclidean distances of each row to every centre.

        Local: no communication. The result is (n_samples, n_clusters) by nature; it is computed
        in chunks.

        Parameters
        ----------
        X : array_like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples, n_clusters)
        """
        X = self._check_input(X)
        centers = np.asarray(self.cluster_centers_, dtype=np.float64)
        mean = centers.mean(axis=0)
        out = np.empty((X.shape[0], centers.shape[0]), dtype=np.float64)
        for s, e in _chunks(X.shape[0], _rows_per_block(centers.shape[0])):
            out[s:e] = _sq_distances(np.subtract(X[s:e], mean, dtype=np.float64), centers - mean).T
        return np.sqrt(out, out=out)

    def fit_transform(self, X_local: Any, y: Any = None, sample_weight: Any = None) -> np.ndarray:
        """Fit, then return the distances of this rank's rows to every centre.

        Collective: it calls :meth:`fit`.
        """
        return self.fit(X_local, sample_weight=sample_weight).transform(X_local)

    def score(self, X_local: Any, y: Any = None, sample_weight: Any = None) -> float:
        """Opposite of the inertia of all ranks' rows with respect to the fitted centres.

        Collective: every rank passes its rows and gets the same value, summed over ranks.

        Parameters
        ----------
        X_local : array_like of shape (n_local_samples, n_features)
        y : None
            Ignored.
        sample_weight : array_like of shape (n_local_samples,), optional

        Returns
        -------
        float
            ``-sum(weight * squared distance to the nearest centre)`` over all ranks.
        """
        comm = _resolve(self.comm)
        with raise_together(comm=comm):
            X = self._check_input(X_local)
            weights = _as_weights(sample_weight, X.shape[0])
            labels = self.predict(X)
            local = _inertia(X, weights, np.asarray(self.cluster_centers_, dtype=np.float64), labels)
        from mpi4py import MPI

        total = np.array([local])
        comm.Allreduce(MPI.IN_PLACE, total, op=MPI.SUM)
        return -float(total[0])

    def __getstate__(self) -> dict[str, Any]:
        # A communicator belongs to the processes that created it; a pickled model (pulled to the
        # notebook client, say) keeps arrays and scalars only and uses COMM_WORLD if refitted.
        state = super().__getstate__()
        state["comm"] = None
        state.pop("_on_iteration", None)
        return state

    def _check_input(self, X: Any) -> np.ndarray:
        if not hasattr(self, "cluster_centers_"):
            raise NotFittedError(
                f"This {type(self).__name__} instance is not fitted yet. Call 'fit' with "
                "appropriate arguments before using this estimator."
            )
        X = _as_data(X)
        if X.shape[1] != self.n_features_in_:
            raise ValueError(
                f"X has {X.shape[1]} features, but {type(self).__name__} was fitted with "
                f"{self.n_features_in_} features."
            )
        if not np.isfinite(X.sum(axis=0, dtype=np.float64)).all():
            _raise_nonfinite(X)
        return X

    def _validated_params(self) -> dict[str, Any]:
        """Local checks of the hyper-parameters, with the messages users see on every rank."""
        k = self.n_clusters
        if not _is_int(k) or k < 1:
            raise ValueError(f"n_clusters must be a positive integer; got {k!r}.")
        init = self.init
        if isinstance(init, str):
            if init not in _INITS:
                raise ValueError(
                    f"init must be 'k-means++', 'k-means||', 'random' or an array of shape "
                    f"(n_clusters, n_features); got {init!r}."
                )
        else:
            try:
                init = np.array(init, dtype=np.float64, copy=True)
            except (TypeError, ValueError) as err:
                raise ValueError(
                    f"init must be 'k-means++', 'k-means||', 'random' or an array of shape "
                    f"(n_clusters, n_features); got {type(self.init).__name__} ({err})."
                ) from None
            if not np.isfinite(init).all():
                raise ValueError("init contains NaN or infinity; pass finite initial centres.")
        n_init = self.n_init
        if n_init == "auto":
            n_init = 10 if isinstance(init, str) and init == "random" else 1
        elif not _is_int(n_init) or n_init < 1:
            raise ValueError(f"n_init must be 'auto' or a positive integer; got {n_init!r}.")
        if not isinstance(init, str) and n_init != 1:
            warnings.warn(
                f"Explicit initial center position passed: performing only one init in KMeans "
                f"instead of n_init={n_init}.",
                RuntimeWarning,
                stacklevel=3,
            )
            n_init = 1
        if not _is_int(self.max_iter) or self.max_iter < 1:
            raise ValueError(f"max_iter must be a positive integer; got {self.max_iter!r}.")
        tol = self.tol
        if not isinstance(tol, numbers.Real) or isinstance(tol, bool) or not tol >= 0 or math.isinf(tol):
            raise ValueError(f"tol must be a finite number >= 0; got {tol!r}.")
        rs = self.random_state
        if not (rs is None or _is_int(rs) or isinstance(rs, np.random.RandomState)):
            raise ValueError(
                f"random_state must be None, an int or a numpy.random.RandomState; got {rs!r}."
            )
        if _is_int(rs) and not 0 <= rs < 2**32:
            raise ValueError(f"random_state must be between 0 and 2**32 - 1; got {rs!r}.")
        return {
            "n_clusters": int(k),
            "init": init,
            "n_init": int(n_init),
            "max_iter": int(self.max_iter),
            "tol": float(tol),
            "random_state": rs,
        }


# ----------------------------------------------------------------------------------------------
# The shard and its global summary


@dataclass
class _Shard:
    """This rank's rows and the global facts every step needs (identical on all ranks)."""

    X: np.ndarray
    weights: np.ndarray | None  # None means unit weights, without an n-row array of ones
    comm: Any
    rank: int
    size: int
    counts: np.ndarray  # rows per rank
    weight_sums: np.ndarray  # weight per rank
    positive: np.ndarray  # rows with positive weight per rank
    offset: int  # global index of this rank's first row
    mean: np.ndarray  # global unweighted mean, the centring point
    max_sq_norm: float  # max over all rows of |x - mean|^2
    sq_norm_total: float  # sum over all rows of weight * |x - mean|^2
    tol: float  # absolute tolerance on the summed squared centre shift
    out_dtype: np.dtype

    @property
    def n_local(self) -> int:
        return int(self.X.shape[0])

    @property
    def n_total(self) -> int:
        return int(self.counts.sum())

    def weight_slice(self, s: int, e: int) -> np.ndarray:
        if self.weights is None:
            return np.ones(e - s)
        return self.weights[s:e]

    @classmethod
    def build(
        cls,
        X: np.ndarray,
        weights: np.ndarray | None,
        local_sum: np.ndarray,
        *,
        n_clusters: int,
        init: Any,
        tol: float,
        comm: Any,
    ) -> _Shard:
        """Two passes over the shard and four small collectives: counts, mean, variance, norms."""
        n, d = X.shape
        wsum = float(n) if weights is None else float(weights.sum())
        npos = n if weights is None else int(np.count_nonzero(weights > 0))
        table = np.array(comm.allgather((n, wsum, npos, X.dtype == np.float32)), dtype=np.float64)
        counts, weight_sums, positive = table[:, 0].astype(np.int64), table[:, 1], table[:, 2].astype(np.int64)
        rank, size = comm.Get_rank(), comm.Get_size()
        k, total = n_clusters, int(counts.sum())
        where = f"across {size} ranks" if size > 1 else "on the only rank"
        # These decisions use allgathered values, so every rank raises the same error.
        if total < k:
            raise ValueError(
                f"n_clusters must be <= the total number of samples ({total:,} {where}); got {k:,}."
            )
        if not weight_sums.sum() > 0:
            raise ValueError(
                "sample_weight sums to 0 over all ranks; at least one sample needs a positive weight."
            )
        if isinstance(init, str) and init == "random" and positive.sum() < k:
            raise ValueError(
                f"init='random' needs at least n_clusters={k} samples with positive weight; there are "
                f"{int(positive.sum())} {where}."
            )
        from mpi4py import MPI

        sums = local_sum.copy()
        comm.Allreduce(MPI.IN_PLACE, sums, op=MPI.SUM)
        mean = sums / total
        # Second pass, centred: per-feature variance (for tol), the largest squared norm (for the
        # packed assignment) and the weighted total (for the per-iteration inertia).
        stats = np.zeros(d + 1)
        biggest = np.zeros(1)
        jit = kernels()
        if jit is not None:
            unit = weights is None
            biggest[0] = jit.centred_stats(X, mean, _NO_WEIGHTS if unit else weights, not unit, stats)
        else:
            for s, e in _chunks(n, max(256, _SUM_ELEMENTS // max(d, 1))):
                xc = np.subtract(X[s:e], mean, dtype=np.float64)
                sq = np.einsum("ij,ij->i", xc, xc)
                stats[:d] += np.einsum("ij,ij->j", xc, xc)
                stats[d] += sq.sum() if weights is None else sq @ weights[s:e]
                biggest[0] = max(biggest[0], sq.max(initial=0.0))
        comm.Allreduce(MPI.IN_PLACE, stats, op=MPI.SUM)
        comm.Allreduce(MPI.IN_PLACE, biggest, op=MPI.MAX)
        tol = float(np.mean(stats[:d] / total) * tol) if tol else 0.0
        return cls(
            X=X,
            weights=weights,
            comm=comm,
            rank=rank,
            size=size,
            counts=counts,
            weight_sums=weight_sums,
            positive=positive,
            offset=int(counts[:rank].sum()),
            mean=mean,
            max_sq_norm=float(biggest[0]),
            sq_norm_total=float(stats[d]),
            tol=tol,
            out_dtype=np.dtype(np.float32) if table[:, 3].all() else np.dtype(np.float64),
        )


# ----------------------------------------------------------------------------------------------
# Lloyd iterations


@dataclass
class _Run:
    centers: np.ndarray  # centred coordinates
    labels: np.ndarray
    inertia: float
    n_iter: int
    history: list[float]
    counts: np.ndarray  # global number of rows per cluster


def _lloyd(
    data: _Shard,
    centers: np.ndarray,
    max_iter: int,
    tol: float,
    stop: StopFlag | None,
    hook: Callable[[dict[str, Any]], None] | None = None,
    run: int = 0,
) -> _Run:
    """scikit-learn's ``_kmeans_single_lloyd`` over distributed rows, one Allreduce per iteration."""
    from mpi4py import MPI

    X, comm, mean = data.X, data.comm, data.mean
    k, d = centers.shape
    n = data.n_local
    labels = np.full(n, -1, dtype=np.int32)
    limit = int(_INCREMENTAL_FRACTION * n)
    track = (np.empty(limit, dtype=np.int32 if n < 2**31 else np.int64), np.empty(limit, dtype=np.int32))
    sums = np.zeros((k, d))  # local, raw coordinates
    weights = np.zeros(k)
    members = np.zeros(k)  # local rows with positive weight, exact in float64
    # The one buffer reduced per iteration: [sums | weights | members | changed | stop].
    packed = np.empty(k * d + 2 * k + 2)
    history: list[float] = []
    strict = False
    centers = np.array(centers, dtype=np.float64)
    i = 0
    for i in range(max_iter):  # noqa: B007 - i is the iteration count after the loop
        changes = _assign(X, centers, mean, data.max_sq_norm, labels, track=track)
        _update_sums(data, labels, changes, sums, weights, members)
        packed[: k * d] = sums.reshape(-1)
        packed[k * d : k * d + k] = weights
        packed[k * d + k : k * d + 2 * k] = members
        packed[-2] = changes.n_changed
        packed[-1] = 0.0 if stop is None else stop.value
        comm.Allreduce(MPI.IN_PLACE, packed, op=MPI.SUM)
        if packed[-1] > 0:
            assert stop is not None
            stop.raise_interrupt(f"mpinb.KMeans.fit (run {run + 1}, iteration {i + 1})")
        g_weights = packed[k * d : k * d + k].copy()
        g_members = packed[k * d + k : k * d + 2 * k]
        n_changed = int(packed[-2])
        # Centred sums: sum w (x - mean) = sum w x - W mean.
        g_sums = packed[: k * d].reshape(k, d) - g_weights[:, None] * mean
        empty = g_members == 0
        g_weights[empty] = 0.0
        g_sums[empty] = 0.0
        inertia = data.sq_norm_total - 2.0 * float(np.sum(centers * g_sums)) + float(
            g_weights @ np.einsum("ij,ij->i", centers, centers)
        )
        history.append(max(inertia, 0.0))
        if empty.any():
            _relocate_empty(data, centers, labels, g_sums, g_weights)
        new_centers = g_sums.copy()
        full = g_weights > 0
        new_centers[full] *= (1.0 / g_weights[full])[:, None]
        shift = float(np.sum((new_centers - centers) ** 2))
        centers = new_centers
        if hook is not None:
            hook(
                {
                    "run": run,
                    "iteration": i + 1,
                    "inertia": history[-1],
                    "n_changed": n_changed,
                    "center_shift": shift,
                    "centers": centers + mean,
                    "stop": stop,
                }
            )
        if n_changed == 0:
            strict = True
            break
        if shift <= tol:
            break
    if not strict:
        # Labels must match the final centres.
        _assign(X, centers, mean, data.max_sq_norm, labels)
    final = np.zeros(k + 1)
    jit = kernels()
    if jit is not None:
        unit = data.weights is None
        w = _NO_WEIGHTS if unit else data.weights
        final[k] = jit.inertia_counts(X, w, not unit, centers + mean, labels, final[:k])
    else:
        final[:k] = _count(labels, k)
        final[k] = _inertia(X, data.weights, centers + mean, labels)
    comm.Allreduce(MPI.IN_PLACE, final, op=MPI.SUM)
    return _Run(centers, labels, float(final[k]), i + 1, history, final[:k])


def _publishing_hook(
    progress: Progress, user_hook: Callable[[dict[str, Any]], None] | None
) -> Callable[[dict[str, Any]], None]:
    def hook(info: dict[str, Any]) -> None:
        progress.update(info["iteration"], inertia=info["inertia"])
        if user_hook is not None:
            user_hook(info)

    return hook


def _same_clustering(a: _Run, b: _Run, data: _Shard) -> bool:
    """scikit-learn's ``_is_same_clustering`` (a's labels map onto b's), decided over all ranks."""
    k = a.centers.shape[0]
    mapping = np.full(k, -1, dtype=np.int64)
    ok = True
    for s, e in _chunks(a.labels.size, _SUM_ELEMENTS):
        la, lb = a.labels[s:e], b.labels[s:e]
        seen, first = np.unique(la, return_index=True)
        unset = mapping[seen] < 0
        mapping[seen[unset]] = lb[first[unset]]
        if not np.array_equal(mapping[la], lb):
            ok = False
            break
    verdicts = data.comm.allgather((ok, mapping))
    if not all(flag for flag, _ in verdicts):
        return False
    merged = np.full(k, -1, dtype=np.int64)
    for _, m in verdicts:
        both = (merged >= 0) & (m >= 0)
        if np.any(merged[both] != m[both]):
            return False
        merged[m >= 0] = m[m >= 0]
    return True


@dataclass
class _Changes:
    n_changed: int
    rows: np.ndarray | None  # local indices of changed rows, or None when too many to track
    old: np.ndarray | None


def _assign(
    X: np.ndarray,
    centers: np.ndarray,
    mean: np.ndarray,
    max_sq_norm: float,
    labels: np.ndarray,
    track: tuple[np.ndarray, np.ndarray] | None = None,
) -> _Changes:
    """Nearest centre of every row, in chunks, writing ``labels`` in place.

    ``centers`` are centred (``c - mean``). The distance block of a chunk is computed as
    ``S + |c'|^2 + 2 mean.c' - 2 x.c'`` = ``S + |x' - c'|^2 - |x'|^2``, which is non-negative for
    ``S >= max |x'|^2``; a non-negative double orders like its bit pattern as an integer, so the
    cluster index fits in the low bits and a pairwise ``minimum`` tree over the clusters yields
    the argmin (lowest index on ties) far faster than ``argmin`` along a short axis.
    With ``track=(rows, old)`` buffers, the changed rows and their old labels are recorded there
    (for an incremental update of the sums) until the buffers are full.
    """
    n = X.shape[0]
    k, d = centers.shape
    single = X.dtype == np.float32
    gemm_dtype = np.float32 if single else np.float64
    c2 = (-2.0 * centers).astype(gemm_dtype)
    # Per-cluster constant: |c'|^2 + 2 mean.c' (because x is used uncentred in the product).
    q = np.einsum("ij,ij->i", centers, centers) + 2.0 * (centers @ mean)
    jit = kernels()
    if jit is not None:
        return _assign_compiled(jit, X, c2, q, labels, track)
    packed = k <= _PACKED_MAX_K
    n_changed = 0
    recorded = 0  # -1 once the changes no longer fit the buffers
    block = _rows_per_block(k)
    if packed:
        bits = (k - 1).bit_length()
        mask = np.int64((1 << bits) - 1)
        eps = np.finfo(gemm_dtype).eps
        cmax = float(np.sqrt(np.max(np.einsum("ij,ij->i", centers, centers))))
        xmax = float(np.linalg.norm(mean)) + math.sqrt(max_sq_norm)
        # Shift making every entry non-negative, with a margin for the GEMM's round-off.
        shift = max_sq_norm * (1 + 1e-6) + 8 * (d + 2) * eps * (xmax * cmax + cmax * cmax) + 1e-300
        template = np.repeat((q + shift)[:, None], min(block, max(n, 1)), axis=1)
        index = np.repeat(np.arange(k, dtype=np.int64)[:, None], template.shape[1], axis=1)
    else:
        template = np.repeat(q[None, :], min(block, max(n, 1)), axis=0)
    full_block = None
    for s, e in _chunks(n, block):
        m = e - s
        if packed:
            if full_block is None or full_block.shape[1] != m:
                full_block = np.empty((k, m))
                low = np.empty((k, m), dtype=np.float32) if single else None
            out = full_block
            if single:
                np.dot(c2, X[s:e].T, out=low)
                np.add(low, template[:, :m], out=out)
            else:
                np.dot(c2, X[s:e].T, out=out)
                np.add(out, template[:, :m], out=out)
            keys = out.view(np.int64)
            np.bitwise_and(keys, ~mask, out=keys)
            np.bitwise_or(keys, index[:, :m], out=keys)
            width = k
            while width > 1:
                half = width // 2
                if width % 2:
                    np.minimum(keys[0], keys[width - 1], out=keys[0])
                np.minimum(keys[:half], keys[half : 2 * half], out=keys[:half])
                width = half
            new = keys[0] & mask
        else:
            dist = np.dot(X[s:e], c2.T).astype(np.float64, copy=False)
            dist += template[:m]
            new = dist.argmin(axis=1)
        old = labels[s:e]
        if track is not None:
            differ = new != old
            count = int(np.count_nonzero(differ))
            n_changed += count
            if count and recorded >= 0:
                if recorded + count <= track[0].size:
                    where = np.flatnonzero(differ)
                    np.add(where, s, out=track[0][recorded : recorded + count], casting="unsafe")
                    track[1][recorded : recorded + count] = old[where]
                    recorded += count
                else:
                    recorded = -1
        old[:] = new
    if track is None or recorded < 0:
        return _Changes(n_changed, None, None)
    return _Changes(n_changed, track[0][:recorded], track[1][:recorded])


def _assign_compiled(
    jit: Any, X: np.ndarray, c2: np.ndarray, q: np.ndarray, labels: np.ndarray,
    track: tuple[np.ndarray, np.ndarray] | None,
) -> _Changes:
    """``_assign`` with the argmin and change tracking in one compiled pass per GEMM chunk.

    The same distances as the NumPy path (``q - 2 x.c'``, the GEMM in the data's precision and
    the sum in float64), but an exact argmin: no index bits packed into the distances.
    """
    n = X.shape[0]
    k = c2.shape[0]
    block = int(min(8192, max(256, _JIT_BLOCK_ELEMENTS // max(k, 1))))
    c2t = np.ascontiguousarray(c2.T)
    buf = np.empty((min(block, max(n, 1)), k), dtype=c2.dtype)
    if track is None:
        rows, old = np.empty(0, dtype=np.int32), np.empty(0, dtype=np.int32)
        recorded = -1
    else:
        (rows, old), recorded = track, 0
    q = np.ascontiguousarray(q, dtype=np.float64)
    n_changed = 0
    for s, e in _chunks(n, block):
        out = buf[: e - s]
        np.dot(X[s:e], c2t, out=out)
        changed, recorded = jit.argmin_rows(out, q, labels[s:e], s, rows, old, recorded)
        n_changed += changed
    if track is None or recorded < 0:
        return _Changes(n_changed, None, None)
    return _Changes(n_changed, rows[:recorded], old[:recorded])


def _update_sums(
    data: _Shard, labels: np.ndarray, changes: _Changes, sums: np.ndarray, weights: np.ndarray, members: np.ndarray
) -> None:
    """Local per-cluster sums (raw coordinates, float64), weights and positive-weight members.

    After the first iterations only a few labels change, so the sums are updated from the changed
    rows alone (added to the new cluster, removed from the old); with many changes they are
    recomputed. A cluster left without members is reset to exact zeros so round-off cannot
    accumulate there.
    """
    X, w = data.X, data.weights
    k, d = sums.shape
    jit = kernels()
    if jit is not None:
        wv = _NO_WEIGHTS if w is None else w
        if changes.rows is None:
            sums[:] = 0.0
            weights[:] = 0.0
            members[:] = 0.0
            jit.sums_full(X, wv, w is not None, labels, sums, weights, members)
            return
        jit.sums_delta(X, wv, w is not None, changes.rows, changes.old, labels, sums, weights, members)
        gone = members == 0
        sums[gone] = 0.0
        weights[gone] = 0.0
        return
    import scipy.sparse as sp

    if changes.rows is None:
        sums[:] = 0.0
        weights[:] = 0.0
        members[:] = 0.0
        step = max(1024, _SUM_ELEMENTS // max(d, 1))
        for s, e in _chunks(data.n_local, step):
            m = e - s
            ws = data.weight_slice(s, e)
            lab = labels[s:e]
            indicator = sp.csc_matrix((ws, lab, np.arange(m + 1)), shape=(k, m))
            sums += indicator @ X[s:e]
            weights += np.bincount(lab, weights=ws, minlength=k)
            members += np.bincount(lab, minlength=k) if w is None else np.bincount(lab[ws > 0], minlength=k)
        return
    rows, old = changes.rows, changes.old
    step = max(1024, _SUM_ELEMENTS // max(d, 1))
    for s, e in _chunks(rows.size, step):
        idx = rows[s:e]
        m = e - s
        new_l, old_l = labels[idx], old[s:e]
        ws = np.ones(m) if w is None else w[idx]
        # One column per changed row: +w in its new cluster, -w in its old one.
        values = np.stack([ws, -ws], axis=1).reshape(-1)
        index = np.stack([new_l, old_l], axis=1).reshape(-1)
        indicator = sp.csc_matrix((values, index, np.arange(0, 2 * m + 1, 2)), shape=(k, m))
        sums += indicator @ X[idx]
        weights += np.bincount(new_l, weights=ws, minlength=k) - np.bincount(old_l, weights=ws, minlength=k)
        positive = ws > 0
        members += np.bincount(new_l[positive], minlength=k) - np.bincount(old_l[positive], minlength=k)
    gone = members == 0
    sums[gone] = 0.0
    weights[gone] = 0.0


def _relocate_empty(
    data: _Shard, centers: np.ndarray, labels: np.ndarray, sums: np.ndarray, weights: np.ndarray
) -> None:
    """Move each empty cluster to one of the points farthest from their centre, over all ranks.

    Collective (one allgather, only in iterations that found an empty cluster). Mirrors
    scikit-learn's ``_relocate_empty_clusters_dense`` on the centred sums; the farthest points are
    taken in decreasing distance, ties by global row index.
    """
    empty = np.flatnonzero(weights == 0)
    n_empty = empty.size
    X, mean = data.X, data.mean
    d = X.shape[1]
    n = data.n_local
    # Local candidates: the n_empty farthest rows from their assigned (old) centre.
    best_dist = np.empty(0)
    best_rows = np.empty(0, dtype=np.int64)
    for s, e in _chunks(n, max(256, _SUM_ELEMENTS // max(d, 1))):
        diff = np.subtract(X[s:e], mean, dtype=np.float64)
        diff -= centers[labels[s:e]]
        dist = np.einsum("ij,ij->i", diff, diff)
        best_dist = np.concatenate([best_dist, dist])
        best_rows = np.concatenate([best_rows, np.arange(s, e)])
        if best_dist.size > n_empty:
            keep = np.argpartition(-best_dist, n_empty - 1)[:n_empty]
            best_dist, best_rows = best_dist[keep], best_rows[keep]
    rows = np.subtract(X[best_rows], mean, dtype=np.float64).reshape(-1, d)
    local_w = np.ones(best_rows.size) if data.weights is None else data.weights[best_rows]
    mine = (best_dist, best_rows + data.offset, local_w, labels[best_rows].astype(np.int64), rows)
    gathered = data.comm.allgather(mine)
    dist = np.concatenate([g[0] for g in gathered])
    if dist.size == 0 or dist.max() == 0:
        # More clusters than distinct points: relocating is pointless (as in scikit-learn).
        return
    gidx = np.concatenate([g[1] for g in gathered])
    w = np.concatenate([g[2] for g in gathered])
    old = np.concatenate([g[3] for g in gathered])
    xs = np.concatenate([g[4] for g in gathered])
    order = np.lexsort((gidx, -dist))[:n_empty]
    for new_id, far in zip(empty, order):
        sums[old[far]] -= xs[far] * w[far]
        sums[new_id] = xs[far] * w[far]
        weights[new_id] = w[far]
        weights[old[far]] -= w[far]


def _inertia(X: np.ndarray, weights: np.ndarray | None, centers: np.ndarray, labels: np.ndarray) -> float:
    """Local weighted sum of squared distances to the assigned centres (raw coordinates)."""
    total = 0.0
    d = X.shape[1]
    for s, e in _chunks(X.shape[0], max(256, _SUM_ELEMENTS // max(d, 1))):
        diff = np.subtract(X[s:e], centers[labels[s:e]], dtype=np.float64)
        sq = np.einsum("ij,ij->i", diff, diff)
        total += float(sq.sum() if weights is None else sq @ weights[s:e])
    return total


# ----------------------------------------------------------------------------------------------
# Small helpers


def _sq_distances(xc: np.ndarray, cc: np.ndarray) -> np.ndarray:
    """Squared distances (len(cc), len(xc)) of centred rows to centred points, as scikit-learn's
    ``euclidean_distances``: ``-2 c.x + |c|^2 + |x|^2``, clipped at zero."""
    dist = -2.0 * (cc @ xc.T)
    dist += np.einsum("ij,ij->i", cc, cc)[:, None]
    dist += np.einsum("ij,ij->i", xc, xc)[None, :]
    return np.maximum(dist, 0.0, out=dist)


def _max_sq_norm(X: np.ndarray, mean: np.ndarray) -> float:
    biggest = 0.0
    for s, e in _chunks(X.shape[0], max(256, _SUM_ELEMENTS // max(X.shape[1], 1))):
        xc = np.subtract(X[s:e], mean, dtype=np.float64)
        biggest = max(biggest, float(np.einsum("ij,ij->i", xc, xc).max(initial=0.0)))
    return biggest


def _count(labels: np.ndarray, k: int) -> np.ndarray:
    """Rows per label, in chunks (``np.bincount`` would copy int32 labels to int64 at once)."""
    counts = np.zeros(k)
    for s, e in _chunks(labels.size, _SUM_ELEMENTS):
        counts += np.bincount(labels[s:e], minlength=k)
    return counts


def _rows_per_block(k: int) -> int:
    return int(min(8192, max(256, _BLOCK_ELEMENTS // max(k, 1))))


def _chunks(n: int, step: int):
    for s in range(0, n, step):
        yield s, min(s + step, n)


def _as_data(X: Any) -> np.ndarray:
    if hasattr(X, "tocsr") or hasattr(X, "toarray"):
        raise TypeError("KMeans needs a dense array; sparse input is not supported.")
    arr = np.asarray(X)
    if arr.ndim != 2:
        raise ValueError(
            f"X_local must be a 2-D array of shape (n_local_samples, n_features); got shape "
            f"{arr.shape}. A rank without rows passes an array of shape (0, n_features)."
        )
    if arr.shape[1] == 0:
        raise ValueError("X_local has 0 features; KMeans needs at least one column.")
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"X_local must hold real numbers; got dtype {arr.dtype}.")
    if arr.dtype not in (np.float32, np.float64):
        arr = arr.astype(np.float64)
    return arr


def _as_weights(sample_weight: Any, n: int) -> np.ndarray | None:
    if sample_weight is None:
        return None
    w = np.asarray(sample_weight)
    if w.dtype.kind not in "biuf":
        raise TypeError(f"sample_weight must hold real numbers; got dtype {w.dtype}.")
    w = w.astype(np.float64).reshape(-1) if w.ndim <= 1 else w
    if w.ndim != 1 or w.shape[0] != n:
        raise ValueError(
            f"sample_weight has shape {np.shape(sample_weight)}, but X_local has {n} rows; pass one "
            "weight per local row."
        )
    if n and not np.isfinite(w).all():
        raise ValueError("sample_weight must be finite and non-negative; it contains NaN or infinity.")
    if n and w.min() < 0:
        raise ValueError(f"sample_weight must be finite and non-negative; got a minimum of {w.min()}.")
    return w


def _raise_nonfinite(X: np.ndarray) -> None:
    for s, e in _chunks(X.shape[0], max(256, _SUM_ELEMENTS // max(X.shape[1], 1))):
        bad = ~np.isfinite(X[s:e])
        if bad.any():
            row = s + int(np.flatnonzero(bad.any(axis=1))[0])
            kind = "NaN" if np.isnan(X[s:e]).any() else "infinity"
            raise ValueError(
                f"X_local contains {kind} (first at local row {row}); remove or impute non-finite "
                "values before fitting."
            )
    # The sum overflowed although every value is finite.
    raise ValueError(
        "X_local's column sums overflow float64; rescale the data (for example divide by its "
        "largest absolute value) before fitting."
    )


def _describe_params(params: dict[str, Any]) -> tuple[Any, ...]:
    init = params["init"]
    if not isinstance(init, str):
        init = ("array", init.shape, hashlib.blake2b(np.ascontiguousarray(init).tobytes(), digest_size=8).hexdigest())
    rs = params["random_state"]
    if isinstance(rs, np.random.RandomState):
        state = rs.get_state()
        rs = ("RandomState", hashlib.blake2b(state[1].tobytes() + repr(state[2:]).encode(), digest_size=8).hexdigest())
    return (
        ("n_clusters", params["n_clusters"]),
        ("init", init),
        ("n_init", params["n_init"]),
        ("max_iter", params["max_iter"]),
        ("tol", params["tol"]),
        ("random_state", rs),
    )
