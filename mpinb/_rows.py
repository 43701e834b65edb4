"""Rows spread over ranks, for any estimator that leaves each rank its own rows.

The rows of a data set are held in rank order, ``counts[r]`` of them on rank ``r``: a global row
index names one row wherever it is, and every rank can tell which rank holds it from the counts
alone (:class:`Layout`). A :class:`Shard` is this rank's rows with the global facts every step of
a fit needs -- rows and weight per rank, the mean and per-feature variance, the largest squared
norm -- identical on every rank. Random choices made by global row index, and rows gathered by
index (:meth:`Layout.rows`), make an estimator's result independent of the number of ranks.

Private: estimators build on it (:mod:`mpinb.kmeans`); collective unless a function says local.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mpinb import _collective

__all__ = ["Layout", "Shard", "Totals", "gather_chosen_rows", "spans"]


def spans(ends: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Which span of a cumulative sum holds each point: ``i`` for ``ends[i-1] <= p < ends[i]``
    (``len(ends)`` past the end). Local. With ``ends = cumsum(rows per rank)`` it is the rank
    that holds each global row; with cumulative weights, the rank or row a weighted draw lands on."""
    return np.searchsorted(ends, points, side="right")


class Layout:
    """Global row index -> (rank, local row) for rows held in rank order. Local, except
    :meth:`rows`."""

    def __init__(self, counts: np.ndarray, comm: Any) -> None:
        self.counts = counts
        self.ends = np.cumsum(counts)
        self.n_total = int(self.ends[-1])
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.offset = int(self.ends[self.rank] - counts[self.rank])  # global index of this rank's first row

    def owner(self, index: np.ndarray) -> np.ndarray:
        """The rank that holds each global row of ``index``."""
        return spans(self.ends, index)

    def rows(
        self, X: np.ndarray, weights: np.ndarray | None, index: np.ndarray, dtype: Any, *, name: str
    ) -> tuple[np.ndarray, np.ndarray]:
        """Rows ``index`` (global, in that order, repeats allowed) and their weights, on every
        rank. Collective: one allgather of only those rows, named ``name``."""
        mine = np.flatnonzero(self.owner(index) == self.rank)
        local = index[mine] - self.offset
        return gather_chosen_rows(X, weights, mine, local, index.size, dtype, self.comm, name)


def gather_chosen_rows(
    X: np.ndarray, weights: np.ndarray | None, mine: np.ndarray, local: np.ndarray, m: int, dtype: Any,
    comm: Any, name: str,
) -> tuple[np.ndarray, np.ndarray]:
    """Assemble ``m`` requested rows on every rank: this rank holds those at positions ``mine``
    (local rows ``local``). Collective: one allgather."""
    payload = (mine, X[local], None if weights is None else weights[local])
    parts = _collective.allgather(payload, comm=comm, name=name)
    rows = np.empty((m, X.shape[1]), dtype=dtype)
    w = np.ones(m)
    for pos, got, got_w in parts:
        rows[pos] = got
        if got_w is not None:
            w[pos] = got_w
    return rows, w


@dataclass(frozen=True)
class Totals:
    """Rows, total weight and rows of positive weight per rank, from one allgather (so an
    estimator can check them -- enough rows, some weight -- identically on every rank before it
    summarises the shard)."""

    counts: np.ndarray
    weight_sums: np.ndarray
    positive: np.ndarray
    all_float32: bool  # every rank passed float32 rows

    @property
    def n_total(self) -> int:
        return int(self.counts.sum())

    @classmethod
    def collect(cls, X: np.ndarray, weights: np.ndarray | None, *, comm: Any, name: str) -> Totals:
        """Collective: one allgather, named ``name``."""
        n = X.shape[0]
        wsum = float(n) if weights is None else float(weights.sum())
        npos = n if weights is None else int(np.count_nonzero(weights > 0))
        table = np.array(_collective.allgather((n, wsum, npos, X.dtype == np.float32), comm=comm, name=name),
                         dtype=np.float64)
        counts, positive = table[:, 0].astype(np.int64), table[:, 2].astype(np.int64)
        return cls(counts, table[:, 1], positive, bool(table[:, 3].all()))


def _from_layout(name: str) -> Any:
    return property(lambda self: getattr(self.layout, name), doc=f"``layout.{name}``")


@dataclass
class Shard:
    """This rank's rows and the global facts every step needs (identical on all ranks)."""

    X: np.ndarray
    weights: np.ndarray | None  # None means unit weights, without an n-row array of ones
    layout: Layout
    weight_sums: np.ndarray  # weight per rank
    positive: np.ndarray  # rows with positive weight per rank
    mean: np.ndarray  # global unweighted mean, the centring point
    variance: np.ndarray  # global unweighted variance of each feature
    max_sq_norm: float  # max over all rows of |x - mean|^2
    sq_norm_total: float  # sum over all rows of weight * |x - mean|^2
    out_dtype: np.dtype  # float32 only when every rank passed float32 rows
    name: str  # the estimator's method, which names the collectives in errors and timeouts

    # What the layout knows, under the names the estimators' steps use.
    comm = _from_layout("comm")
    rank = _from_layout("rank")
    size = _from_layout("size")
    counts = _from_layout("counts")  # rows per rank
    offset = _from_layout("offset")  # global index of this rank's first row
    n_total = _from_layout("n_total")

    @property
    def n_local(self) -> int:
        return int(self.X.shape[0])

    def weight_slice(self, s: int, e: int) -> np.ndarray:
        if self.weights is None:
            return np.ones(e - s)
        return self.weights[s:e]

    @classmethod
    def build(
        cls, X: np.ndarray, weights: np.ndarray | None, local_sum: np.ndarray, totals: Totals, *, passes: Any,
        comm: Any, name: str,
    ) -> Shard:
        """The summary of the rows ``totals`` counted: a pass over the shard and two small
        collectives (mean, then variance and norms). ``local_sum`` holds this rank's float64 column
        sums; ``passes`` is the executor of the row passes (its ``centred_stats``), chosen from
        global sizes so every rank takes the same one."""
        d = X.shape[1]
        total = totals.n_total
        sums = local_sum.copy()
        _collective.reduce_in_place([sums], comm=comm, name=f"{name}'s mean")
        mean = sums / total
        # Second pass, centred: per-feature variance, the largest squared norm (an overflow guard)
        # and the weighted total (from which an iteration's inertia follows without another pass).
        stats = np.zeros(d + 1)
        biggest = np.zeros(1)
        unit = weights is None
        biggest[0] = passes.centred_stats(X, mean, _NO_WEIGHTS if unit else weights, not unit, stats)
        _collective.reduce_in_place([stats, biggest], ["sum", "max"], comm=comm, name=f"{name}'s variance")
        return cls(
            X=X,
            weights=weights,
            layout=Layout(totals.counts, comm),
            weight_sums=totals.weight_sums,
            positive=totals.positive,
            mean=mean,
            variance=stats[:d] / total,
            max_sq_norm=float(biggest[0]),
            sq_norm_total=float(stats[d]),
            out_dtype=np.dtype(np.float32) if totals.all_float32 else np.dtype(np.float64),
            name=name,
        )


# Stands in for unit weights in the executors' passes (which take a flag instead of None).
_NO_WEIGHTS = np.empty(0)
