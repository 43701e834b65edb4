"""Mini-batch k-means over rows spread across ranks: scikit-learn's estimator, one Allreduce per batch.

The estimator's parameters and its two fits; the mini-batches are :mod:`._batches`, where their
rows are :mod:`._sampling`, and the initial centres :mod:`._starts`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from mpinb._constraints import Accepts, Exactly, Flag, Integer, Real
from mpinb._estimator import set_feature_names
from mpinb._fit_callbacks import FitCallbacks, fit_callbacks, with_callbacks
from mpinb.interrupt import StopFlag
from mpinb.kmeans._base import KMeansBase, KMeansParams
from mpinb.kmeans._batches import State, Step, labels_inertia, minibatches, one_step
from mpinb.kmeans._kernels import kernels
from mpinb.kmeans._sampling import Sampler, any_weighted
from mpinb.kmeans._shard import relative_tol
from mpinb.kmeans._starts import best_start, sample_sizes, start_from_sample

__all__ = ["MiniBatchKMeans"]


@dataclass(frozen=True)
class MiniBatchParams(KMeansParams):
    """The validated hyper-parameters of :class:`MiniBatchKMeans`."""

    batch_size: int
    compute_labels: bool
    max_no_improvement: int | None
    init_size: int | None
    reassignment_ratio: float
    verbose: int  # only rank 0 prints, but a verbose fit may add a collective: the ranks agree on it


class MiniBatchKMeans(KMeansBase):
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
        As scikit-learn's: when non-zero, rank 0 prints the initialisation's inertias, every
        mini-batch's inertia, reassignments and the reason for stopping (the other ranks print
        nothing). Rank 0 also publishes the inertia to the notebook through :mod:`mpinb.live`
        whatever ``verbose`` says.
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
        The ranks holding the rows, by default ``MPI.COMM_WORLD`` (resolved at call time); a
        pickled estimator leaves it behind.

    Attributes
    ----------
    cluster_centers_ : ndarray of shape (n_clusters, n_features)
        The centres, the same on every rank; float32 only if every rank passed float32 rows.
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
    Sampling: scikit-learn (1.9 and later; before, ``randint`` rows with their weights applied in
    the step, so the same seed drew other rows) draws each mini-batch as ``random_state.choice(n,
    batch_size, p=w / w.sum())``: one uniform number per row, looked up in the cumulative weights.
    mpinb draws the same uniform numbers and maps them to global rows: ``floor(u * n)`` for unit
    weights (exact, the same at any number of ranks) and the rank, then row, of the cumulative
    weights otherwise. scikit-learn's cumulative sum of ``n`` equal weights carries a round-off of
    order ``n`` times the machine epsilon, so on very large data some of its draws land on a
    neighbouring row: measured 0 of 200,000 draws differ at up to 100,003 rows, 38 of 20,000 at
    20,000,000 rows. Below that, one rank draws exactly scikit-learn's rows, and the centres equal
    scikit-learn's to round-off (the per-cluster sums are added in another order). With
    ``sample_weight`` the rows a draw selects depend on how the rows are split over the ranks only
    when the draw falls within round-off of a boundary of the cumulative weights.

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

    Callbacks: with scikit-learn 1.9 or later, ``set_callbacks(...)`` takes its experimental
    callbacks, called on rank 0 of ``comm`` only, as in :class:`mpinb.KMeans`. A fit's tasks are its
    passes over the data (``max_iter`` at most, the last one cut short by early stopping), not its
    mini-batches: scikit-learn's ``ProgressBar`` sums all finished tasks at each task's end, which
    grows quadratic over thousands of mini-batches. At a pass's end the hooks' ``fitted_estimator``
    holds the centres every rank holds, ``n_iter_`` (passes), ``n_steps_`` and, as ``inertia_``, the
    smoothed mini-batch inertia over all ranks (the ``ewa inertia`` of ``verbose``) scaled to all
    rows. Each :meth:`partial_fit` is one task, whose hooks run after its last collective.

    Examples
    --------
    >>> lo, hi = mpinb.shard_bounds(len(X), rank=comm.rank, size=comm.size)
    >>> mbk = mpinb.MiniBatchKMeans(n_clusters=3, batch_size=256, random_state=0).fit(X[lo:hi])
    >>> mbk.cluster_centers_.shape, mbk.labels_.shape == (hi - lo,)
    ((3, 4), True)
    """

    _constraints: ClassVar[dict[str, Accepts]] = {
        **KMeansBase._constraints,
        "batch_size": Accepts(Integer(minimum=1, unit="number of rows over all ranks")),
        "compute_labels": Accepts(Flag()),
        "max_no_improvement": Accepts(Exactly(None), Integer(minimum=0)),
        "init_size": Accepts(Exactly(None), Integer(minimum=1)),
        "reassignment_ratio": Accepts(Real(minimum=0), wrong_type=ValueError),
        "verbose": Accepts(Flag(), Integer(minimum=0)),
    }
    _Params = MiniBatchParams
    _auto_runs = 3

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
        super().__init__(
            n_clusters, init=init, n_init=n_init, max_iter=max_iter, tol=tol, random_state=random_state,
            comm=comm,
        )
        self.batch_size, self.verbose, self.compute_labels = batch_size, verbose, compute_labels
        self.max_no_improvement, self.init_size = max_no_improvement, init_size
        self.reassignment_ratio = reassignment_ratio

    @with_callbacks
    def fit(self, X_local: Any, y: Any = None, sample_weight: Any = None) -> MiniBatchKMeans:
        """Compute the centres from mini-batches drawn from the rows held by all ranks.

        Collective. Every rank passes its own shard (possibly with zero rows). Invalid input on
        any rank -- NaN or infinity, a different number of features or different parameters on
        another rank, fewer samples than clusters, a bad ``init`` or ``sample_weight`` -- raises
        the same exception on every rank before any mini-batch.

        Parameters
        ----------
        X_local : array_like of shape (n_local_samples, n_features)
            This rank's rows, which stay where they are; float32 rows are summed in float64.
        y : None
            Ignored (scikit-learn's API has it).
        sample_weight : array_like of shape (n_local_samples,), optional
            Non-negative weight of each local row, ones by default. Rows are drawn with
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
            start = self._prologue(X_local, sample_weight, "MiniBatchKMeans.fit")
            params, data, rng = start.params, start.shard, start.rng
            batch, init_size = sample_sizes(params, data.n_total)
            sampler = Sampler(data, any_weighted(data))
            state = State(np.zeros(params.n_clusters), 0, batch)
            # scikit-learn's callbacks, on rank 0: a task per pass over the data.
            calls = fit_callbacks(self, data.rank, params.max_iter, data.X, data.weights)
            centers = best_start(data, params, rng, init_size)
            tol = relative_tol(data, params.tol)
            hook, begin = self._on_iteration, None
            if calls.active:
                tasks = _Passes(calls, data.out_dtype, data.X.shape[1], data.n_total, batch,
                                float(data.weight_sums.sum()) / batch)
                hook, begin = tasks.hook(self._on_iteration), tasks.begin
            run = minibatches(data, sampler, centers, state, params, tol, rng, stop, hook, begin)
            labels = None
            if params.compute_labels:
                labels, inertia = labels_inertia(
                    data.X, data.weights, run.centers, start.comm, "MiniBatchKMeans.fit"
                )
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
        self.n_features_in_ = int(data.X.shape[1])
        set_feature_names(self, start.names)
        calls.end(calls.root)
        return self

    @with_callbacks
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
            start = self._prologue(X_local, sample_weight, "MiniBatchKMeans.partial_fit", resume=True)
            params, X, weights, rng, layout = start.params, start.X, start.weights, start.rng, start.layout
            k, n = params.n_clusters, layout.n_total
            if start.data is None:
                centers = np.asarray(self.cluster_centers_, dtype=np.float64)
                counts = np.array(self._counts, dtype=np.float64)
                state = State(counts, self._n_since_last_reassign, self._batch_size)
                init_size, out_dtype = self._init_size, self.cluster_centers_.dtype
            else:
                # As scikit-learn: the first batch sets the batch and init sample sizes, and the
                # initial centres come from (a sample of) it.
                batch, init_size = sample_sizes(params, n)
                idx = rng.randint(0, n, init_size) if init_size < n else None
                centers = start_from_sample(start.data, idx, params, rng)
                state = State(np.zeros(k), 0, batch)
                out_dtype = start.data.out_dtype
            done = getattr(self, "n_steps_", 0)
            # The executor from the global batch, so every rank takes the same one.
            report = bool(params.verbose) and layout.rank == 0
            step = Step(k, X.shape[1], start.comm, "mpinb.MiniBatchKMeans.partial_fit", kernels(n * k), done,
                        report=report)
            fetch = functools.partial(_fetch, layout, X)
            rows = np.arange(X.shape[0])
            ratio = params.reassignment_ratio
            centers, _ = one_step(step, X, rows, weights, centers, state, ratio, n, rng, stop, fetch)
            labels = None
            if params.compute_labels:
                labels, inertia = labels_inertia(
                    X, weights, centers, start.comm, "MiniBatchKMeans.partial_fit"
                )
        self._random_state = rng
        self._counts, self._n_since_last_reassign = state.counts, state.since
        self._batch_size, self._init_size = state.batch, init_size
        self.cluster_centers_ = centers.astype(out_dtype, copy=False)
        if labels is not None:
            self.labels_, self.inertia_ = labels, float(inertia)
        self.n_steps_ = done + 1
        self.n_features_in_ = int(X.shape[1])
        set_feature_names(self, start.names)
        # One task, its hooks on rank 0 after the call's last collective: partial_fit is not one
        # mpinb call (see mpinb._estimator.RankAware), so a hook that raised earlier would leave the
        # other ranks waiting in this call.
        calls = fit_callbacks(self, layout.rank, 0, X, weights, name="partial_fit")
        calls.end(calls.root)
        return self


class _Passes:
    """Each pass over the data of a fit (``batch`` rows over ``n`` per mini-batch; the last one cut
    short by early stopping) as a task of scikit-learn's callbacks (rank 0's): at its end the hooks'
    ``fitted_estimator`` has the centres every rank holds, ``n_iter_`` (passes), ``n_steps_`` and,
    as ``inertia_``, the smoothed mini-batch inertia over all ranks scaled to all rows (``scale``:
    total weight / batch rows; the first mini-batch's own before there is an average). Not a task
    per mini-batch: scikit-learn's ``ProgressBar`` adds up every finished task of its parent at each
    task's end, quadratic in thousands of mini-batches. Local."""

    def __init__(self, calls: FitCallbacks, out_dtype: Any, n_features: int, n: int, batch: int, scale: float) -> None:
        self.calls, self.out_dtype, self.n_features, self.scale = calls, out_dtype, n_features, scale
        self.n, self.batch = n, batch
        self.task: Any = None
        self.current = 0

    def _pass(self, step: int) -> int:
        return -(-step * self.batch // self.n)  # the pass that mini-batch ``step`` (from 1) is in: a ceil

    def begin(self, step: int) -> None:
        if self._pass(step) != self.current:
            self.current = self._pass(step)
            self.task = self.calls.subtask("pass")

    def hook(self, user_hook: Callable[[dict[str, Any]], None] | None) -> Callable[[dict[str, Any]], None]:
        def hook(info: dict[str, Any]) -> None:
            step = info["step"]
            if info["last"] or self._pass(step + 1) != self.current:
                mean = info["ewa_inertia"] if info["ewa_inertia"] is not None else info["batch_inertia"] / self.batch
                centers, inertia, passes = info["centers"], mean * self.batch * self.scale, self.current
                self.calls.end(self.task, lambda: {"cluster_centers_": centers.astype(self.out_dtype),
                                                   "inertia_": inertia, "n_iter_": passes, "n_steps_": step,
                                                   "n_features_in_": self.n_features})
            if user_hook is not None:
                user_hook(info)

        return hook


def _fetch(layout: Any, X: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Rows ``index`` of a ``partial_fit`` call in float64 on every rank (the new centres of a
    reassignment). Collective."""
    name = "MiniBatchKMeans.partial_fit's reassigned centres"
    return layout.rows(X, None, index, np.float64, name=name)[0]
