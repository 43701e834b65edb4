"""The mini-batches of a distributed ``MiniBatchKMeans``: scikit-learn's loop, step, centre
update, reassignment and early stopping, with one Allreduce per mini-batch.

Private to :mod:`mpinb.kmeans`; collective unless a function says local.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from mpinb import _collective
from mpinb.interrupt import StopFlag
from mpinb.kmeans._distances import NO_WEIGHTS, local_inertia, nearest
from mpinb.kmeans._kernels import kernels
from mpinb.kmeans._sampling import Sampler
from mpinb.kmeans._shard import KMeansShard
from mpinb.live import Progress

__all__ = ["BatchRun", "State", "Step", "labels_inertia", "minibatches", "one_step"]

# Published inertia points per fit at most (mpinb.live sends the whole series in each message).
_PROGRESS_POINTS = 1000


@dataclass
class State:
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
class BatchRun:
    centers: np.ndarray
    n_steps: int
    ewa_inertia: float  # smoothed mean batch inertia (the last batch's when there was only one)


def minibatches(
    data: KMeansShard, sampler: Sampler, centers: np.ndarray, state: State, params: Any, tol: float,
    rng: np.random.RandomState, stop: StopFlag, hook: Callable[[dict[str, Any]], None] | None,
    begin: Callable[[int], None] | None = None,
) -> BatchRun:
    """scikit-learn's loop of ``MiniBatchKMeans.fit`` over distributed rows, one Allreduce per
    mini-batch (and one gather in the rare mini-batches that move a centre); ``tol`` is absolute.
    ``hook`` gets each mini-batch's reduced values, ``begin`` its number before its draw; both must
    be local. Collective."""
    k, d = centers.shape
    n, batch = data.n_total, state.batch
    n_steps = (params.max_iter * n) // batch
    report = bool(params.verbose) and data.rank == 0
    monitor = _Monitor(batch, n, tol, params.max_no_improvement, n_steps, report)
    total_weight = float(data.weight_sums.sum())
    # The executor from the global size, so every rank takes the same one.
    step = Step(k, d, data.comm, f"mpinb.{data.name}", kernels(n * k), report=report)
    stride = max(1, n_steps // _PROGRESS_POINTS)
    X, ratio = data.X, params.reassignment_ratio
    i = 0
    # Rank 0 publishes the inertia curve to the notebook (mpinb.live.watch).
    with Progress("inertia", total=n_steps, comm=data.comm) as progress:
        for i in range(n_steps):
            if begin is not None:
                begin(i + 1)
            draws = sampler.draw(rng.random_sample(batch))
            # The pass reads the drawn rows in place: no gathered copy of the mini-batch.
            new, batch_inertia = one_step(step, X, draws.local, None, centers, state, ratio, batch, rng,
                                          stop, functools.partial(sampler.rows, X, draws))
            shift = float(np.sum((new - centers) ** 2)) if tol > 0 else 0.0
            centers = new
            done = monitor.done(i, shift, batch_inertia)
            if i % stride == 0 or done:
                progress.update(i + 1, inertia=batch_inertia * total_weight / batch)
            if hook is not None:
                hook({"step": i + 1, "batch_inertia": batch_inertia, "ewa_inertia": monitor.ewa,
                      "centers": centers.copy(), "stop": stop, "last": done or i + 1 == n_steps})
            if done:
                break
    return BatchRun(centers, i + 1, monitor.ewa if monitor.ewa is not None else monitor.last)


def one_step(
    step: Step, X: np.ndarray, rows: np.ndarray, weights: np.ndarray | None, centers: np.ndarray,
    state: State, ratio: float, batch_rows: int, rng: np.random.RandomState, stop: StopFlag,
    fetch: Callable[[np.ndarray], np.ndarray],
) -> tuple[np.ndarray, float]:
    """scikit-learn's ``_mini_batch_step`` on a mini-batch of ``batch_rows`` rows over all ranks,
    of which this rank holds ``X[rows]`` (``weights`` indexed like ``X``): the new centres and the
    batch inertia. Collective."""
    due = state.due()  # decided before the update, from the weights accumulated so far
    sums, wsum, inertia = step.sums_of(X, rows, weights, centers, stop)
    new = _update(centers, state.counts, sums, wsum)
    if due and ratio > 0:
        _reassign(new, state.counts, ratio, batch_rows, rng, fetch, step.report)
    return new, inertia


class Step:
    """The local sums of one mini-batch and their one Allreduce: ``[sums | weights | inertia | stop]``;
    ``where`` names the method in messages, ``report`` prints ``verbose`` lines on this rank."""

    def __init__(
        self, k: int, d: int, comm: Any, where: str, run_on: Any, done: int = 0, *, report: bool
    ) -> None:
        self.comm, self.where, self.run_on, self.report = comm, where, run_on, report
        self.name = f"{where}'s mini-batch"
        self.packed = np.empty(k * d + k + 1)  # [sums | weights | batch inertia]; a stop rides in the arrival
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
            w = NO_WEIGHTS if weights is None else weights
            packed[-1] = self.run_on.batch_sums(X, rows, w, weights is not None, centers, self.sums, self.wsum)
        self.calls += 1
        _collective.reduce_in_place([packed], comm=self.comm, name=self.name, stop=stop,
                                    where=f"{self.where} (mini-batch {self.calls})")
        return self.sums.copy(), self.wsum.copy(), float(packed[-1])


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
    fetch: Callable[[np.ndarray], np.ndarray], report: bool,
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
        if report:
            print(f"[MiniBatchKMeans] Reassigning {n_moved} cluster centers.")
        centers[low] = fetch(chosen)
    # Not reset to zero (that would make them due again at once): to the lightest remaining one.
    counts[low] = np.min(counts[~low])


class _Monitor:
    """scikit-learn's early stopping: ``tol`` on the centres' movement, and
    ``max_no_improvement`` on an exponentially weighted average of the batch inertia; with
    ``report``, scikit-learn's ``verbose`` lines."""

    def __init__(
        self, batch: int, n: int, tol: float, patience: int | None, n_steps: int, report: bool
    ) -> None:
        self.batch, self.tol, self.patience = batch, tol, patience
        self.n_steps, self.report = n_steps, report
        self.alpha = min(batch * 2.0 / (n + 1), 1.0)
        self.ewa: float | None = None
        self.best: float | None = None
        self.no_improvement = 0
        self.last = 0.0

    def done(self, step: int, shift: float, batch_inertia: float) -> bool:
        mean = batch_inertia / self.batch
        self.last = mean
        if step == 0:
            if self.report:
                print(f"Minibatch step 1/{self.n_steps}: mean batch inertia: {mean}")
            return False  # the first batch's inertia is the initialisation's
        self.ewa = mean if self.ewa is None else self.ewa * (1 - self.alpha) + mean * self.alpha
        at = f"step {step + 1}/{self.n_steps}" if self.report else ""
        if self.report:
            print(f"Minibatch {at}: mean batch inertia: {mean}, ewa inertia: {self.ewa}")
        if self.tol > 0.0 and shift <= self.tol:
            if self.report:
                print(f"Converged (small centers change) at {at}")
            return True
        if self.best is None or self.ewa < self.best:
            self.no_improvement = 0
            self.best = self.ewa
        else:
            self.no_improvement += 1
        if self.patience is not None and self.no_improvement >= self.patience:
            if self.report:
                print(f"Converged (lack of improvement in inertia) at {at}")
            return True
        return False


def labels_inertia(
    X: np.ndarray, weights: np.ndarray | None, centers: np.ndarray, comm: Any, name: str
) -> tuple[np.ndarray, float]:
    """This rank's labels and the inertia over all ranks. Collective (one Allreduce)."""
    labels = nearest(X, centers)
    total = np.array([local_inertia(X, weights, centers, labels)])
    _collective.reduce_in_place([total], comm=comm, name=f"{name}'s inertia")
    return labels, float(total[0])
