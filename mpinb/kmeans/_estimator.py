"""Distributed k-means: a scikit-learn shaped estimator whose ranks each keep their own rows."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
from sklearn.exceptions import ConvergenceWarning

from mpinb._estimator import set_feature_names
from mpinb._fit_callbacks import FitCallbacks, fit_callbacks, with_callbacks
from mpinb.interrupt import StopFlag
from mpinb.kmeans._base import KMeansBase
from mpinb.kmeans._init import initial_centers
from mpinb.kmeans._lloyd import Run, lloyd, same_clustering
from mpinb.kmeans._shard import relative_tol
from mpinb.live import Progress

__all__ = ["KMeans"]


class KMeans(KMeansBase):
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
    init : {"k-means++", "k-means||", "random"}, callable or array of shape (n_clusters, n_features)
        ``"k-means++"`` is scikit-learn's greedy k-means++ run exactly over the distributed
        data (one pass per centre and candidate set). ``"k-means||"`` is the scalable variant:
        about ``2 * n_clusters`` candidates per round for 5 rounds, weighted by the points they
        attract and reclustered on rank 0. ``"random"`` picks ``n_clusters`` distinct rows with
        probability proportional to their weight. Random choices depend on global row indices
        only, so a fixed ``random_state`` gives the same centres at any number of ranks (up to
        float round-off); on one rank ``"k-means++"`` and ``"random"`` draw the same centres as
        scikit-learn with the same integer seed.

        A callable is called as scikit-learn calls it, ``init(X, n_clusters,
        random_state=random_state)`` with a ``numpy.random.RandomState``, once per run, on
        **every rank**: ``X`` is a read-only view of that rank's own ``X_local`` (as given, not
        centred), and ``random_state`` is in the same state on every rank. It must return an
        array of shape (n_clusters, n_features), in the coordinates of ``X``, that is **the same
        on every rank** -- fixed centres, or centres drawn from ``random_state`` alone -- and
        draw the same random numbers everywhere. mpinb checks this (two small collectives per
        run): centres or generator states that differ between ranks, as from a callable that
        picks rows of its ``X``, raise :class:`mpinb.CollectiveMismatchError` on every rank,
        rather than starting from a rank's shard, which need not represent the data and would
        make the result depend on the number of ranks. An exception or a result of the wrong
        shape on any rank is raised on every rank. To start from data-dependent centres,
        compute them first (``"k-means++"`` over all ranks, say) and pass them as an array.
        Unlike scikit-learn, which passes the mean-centred data and reads the returned centres
        as centred, the centres are read in the coordinates of the data passed to :meth:`fit`,
        so fixed centres start exactly where they are.
    n_init : "auto" or int, default "auto"
        Number of initialisations; the run with the lowest inertia wins. ``"auto"`` means 10 for
        ``init="random"`` and a callable ``init`` and 1 otherwise, as in scikit-learn; an array
        ``init`` always runs once.
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

    Notes
    -----
    Empty clusters: a cluster left without points is relocated to the farthest point (over all
    ranks) as in scikit-learn; when no point is farther than 0 from its centre (more clusters
    than distinct points) it is placed on the heaviest cluster's centre, as scikit-learn does,
    so such a fit stops after one iteration with a ``ConvergenceWarning`` about the number of
    distinct clusters.

    Speed: every pass over the rows runs in bounded chunks, the distances as one BLAS GEMM per
    chunk. The other row passes run on one of two executors, chosen from the fit's total rows x
    clusters (so the same on every rank): below 2**20, NumPy, so a first small fit in a fresh
    process needs no compiled code (measured 30 ms in an engine on 6,000 x 5, k=8, against
    24 ms for scikit-learn's first fit); above, numba-compiled passes, which make an iteration
    faster than scikit-learn's and cost about 0.4-0.5 s the first time a process uses them
    (loaded from numba's disk cache; about 2.5 s once, when the cache is empty). ``MPINB_NUMBA=0`` or
    ``1`` forces one executor; their labels can differ only for rows equally near two centres
    within round-off.

    Ties: a row equidistant from several centres goes to the lowest centre index only up to
    the float round-off of the distance computation (``|c'|^2 - 2 x.c'`` from one GEMM per
    chunk, in centred coordinates), like scikit-learn, whose ties are also decided by its own
    round-off. Exact ties arise on integer-valued data when the centres are data rows, that is
    in the first assignment after ``init`` picked rows. Measured on the digits (1,797 x 64,
    integers 0-16, 10 clusters) from 10 starts (``X[:10]``, ``X[100:110]`` and 8 k-means++
    draws): 0-4 rows tied exactly in the first assignment (12 in all) and none in any later
    one (checked in exact arithmetic). mpinb broke 4 of the 12 differently from scikit-learn,
    yet the final labels equalled scikit-learn's in all 10 starts. So on integer data with exact
    ties, intermediate (and possibly final) results may differ from scikit-learn's. Both
    executors of the row passes (NumPy for small data, compiled for large) take the argmin of
    the same distance block with the same rule, so they break ties alike, and the same ties were
    broken the same way at 1, 2, 3 and 4 ranks.

    Callbacks: with scikit-learn 1.9 or later, ``set_callbacks(...)`` takes its experimental
    callbacks (``sklearn.callback.ProgressBar``, ``ScoringMonitor``, or any object with its hooks),
    set on every rank as any parameter. Only rank 0 of ``comm`` calls them, between the fit's own
    collectives; on the other ranks they do nothing. Their tasks are the global ones: the fit, of
    ``max_iter`` iterations (with ``n_init > 1``, of ``n_init`` runs of ``max_iter`` iterations
    each), so a ``ProgressBar`` counts the iterations every rank makes. At an iteration's end the
    hooks' ``fitted_estimator`` holds the centres after it and, as ``inertia_``, its inertia over all
    ranks (``inertia_history_``'s entry); at the fit's end, the fitted model. That model is a copy on
    ``MPI.COMM_SELF``, and the hooks' ``X`` is rank 0's own rows, so nothing a hook does can start a
    collective: its ``score(X)`` is rank 0's share. A hook's request to stop is ignored (as in
    scikit-learn 1.9's estimators); a hook that raises ends the fit on every rank (rank 0 raises its
    error, the others :class:`mpinb.CollectiveAbandoned` naming it). Before 1.9 there is no
    ``set_callbacks``.

    Examples
    --------
    >>> lo, hi = mpinb.shard_bounds(len(X), rank=comm.rank, size=comm.size)
    >>> km = mpinb.KMeans(n_clusters=3, random_state=0).fit(X[lo:hi])
    >>> km.cluster_centers_.shape, km.labels_.shape == (hi - lo,)
    ((3, 4), True)
    """

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
        super().__init__(
            n_clusters, init=init, n_init=n_init, max_iter=max_iter, tol=tol, random_state=random_state,
            comm=comm,
        )

    @with_callbacks
    def fit(self, X_local: Any, y: Any = None, sample_weight: Any = None) -> KMeans:
        """Compute the clustering of the rows held by all ranks.

        Collective. Every rank passes its own shard (possibly with zero rows). Invalid input on
        any rank -- NaN or infinity, a different number of features or different parameters on
        another rank, fewer samples than clusters, a bad ``init`` array, a callable ``init`` that
        fails or disagrees across ranks, a bad ``sample_weight`` -- raises the same exception on
        every rank before any iteration.

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
            ``self``, fitted, with the same centres on every rank.
        """
        # From the first line: a Ctrl-C that lands during validation, set-up or a JIT compile only
        # sets the flag, which the first reduction of the initialisation or of Lloyd's loop carries
        # to every rank, instead of raising on this rank alone while the others enter a collective.
        with StopFlag() as stop:
            start = self._prologue(X_local, sample_weight, "KMeans.fit")
            params, data = start.params, start.shard
            tol = relative_tol(data, params.tol)
            # scikit-learn's callbacks, on rank 0: a task per run when there are several, one per
            # iteration within it.
            runs = params.n_init > 1
            calls = fit_callbacks(self, data.rank, params.n_init if runs else params.max_iter, data.X, data.weights)
            best: Run | None = None
            for run in range(params.n_init):
                centers = initial_centers(data, params.init, params.n_clusters, start.rng, stop)
                tasks = _Iterations(calls, calls.subtask("run", max_subtasks=params.max_iter) if runs else None,
                                    data.out_dtype, data.X.shape[1])
                # Rank 0 publishes each run's inertia curve to the notebook (mpinb.live.watch).
                with Progress("inertia", total=params.max_iter, comm=start.comm) as progress:
                    hook = _publishing_hook(progress, self._on_iteration, tasks.end if calls.active else None)
                    result = lloyd(data, centers, params.max_iter, tol, stop, hook, run,
                                   begin=tasks.begin if calls.active else None)
                if runs and calls.active:
                    calls.end(tasks.parent, tasks.attributes(result.centers + data.mean, result.inertia, result.n_iter))
                if best is None or (
                    result.inertia < best.inertia and not same_clustering(result, best, data)
                ):
                    best = result
        assert best is not None
        distinct = int(np.count_nonzero(best.counts))
        if distinct < params.n_clusters:
            warnings.warn(
                f"Number of distinct clusters ({distinct}) found smaller than n_clusters "
                f"({params.n_clusters}). Possibly due to duplicate points in X.",
                ConvergenceWarning,
                stacklevel=2,
            )
        centers = best.centers + data.mean
        self.cluster_centers_ = centers.astype(data.out_dtype, copy=False)
        self.labels_ = best.labels
        self.inertia_ = float(best.inertia)
        self.n_iter_ = int(best.n_iter)
        self.inertia_history_ = np.asarray(best.history, dtype=np.float64)
        self.n_features_in_ = int(data.X.shape[1])
        set_feature_names(self, start.names)
        calls.end(calls.root)
        return self


def _publishing_hook(
    progress: Progress, user_hook: Callable[[dict[str, Any]], None] | None,
    task_end: Callable[[dict[str, Any]], None] | None = None,
) -> Callable[[dict[str, Any]], None]:
    def hook(info: dict[str, Any]) -> None:
        progress.update(info["iteration"], inertia=info["inertia"])
        if task_end is not None:
            task_end(info)
        if user_hook is not None:
            user_hook(info)

    return hook


class _Iterations:
    """Each Lloyd iteration of a run as a task of scikit-learn's callbacks (rank 0's), under
    ``parent`` (the fit's root task when ``None``): its hooks see the global iteration and, in
    ``fitted_estimator``, the centres and inertia every rank holds. Local."""

    def __init__(self, calls: FitCallbacks, parent: Any, out_dtype: Any, n_features: int) -> None:
        self.calls, self.parent, self.out_dtype, self.n_features = calls, parent, out_dtype, n_features
        self.task: Any = None
        self.inertia: float | None = None  # the last iteration's

    def begin(self, info: dict[str, Any]) -> None:
        # Before the iteration's pass: the centres it starts from, the previous one's inertia.
        self.task = self.calls.subtask("iteration", self.parent,
                                       attributes=self.attributes(info["centers"], self.inertia, info["iteration"] - 1))

    def end(self, info: dict[str, Any]) -> None:
        self.inertia = info["inertia"]
        self.calls.end(self.task, self.attributes(info["centers"], info["inertia"], info["iteration"]))

    def attributes(self, centers: np.ndarray, inertia: float | None, n_iter: int) -> Callable[[], dict[str, Any]]:
        """The model after ``n_iter`` iterations (``inertia``: the last one's assignment), built
        only if a hook asks for a ``fitted_estimator``."""

        def build() -> dict[str, Any]:
            return {"cluster_centers_": centers.astype(self.out_dtype), "inertia_": inertia, "n_iter_": int(n_iter),
                    "n_features_in_": self.n_features}

        return build
