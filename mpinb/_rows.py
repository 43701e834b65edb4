"""Rows spread over ranks, for any estimator that leaves each rank its own rows.

The rows of a data set are held in rank order, ``counts[r]`` of them on rank ``r``: a global row
index names one row wherever it is, and every rank can tell which rank holds it from the counts
alone (:class:`RowMap`), as it can tell which rank holds a point of any cumulative per-rank total,
such as the weights (:func:`owners`). A :class:`Shard` is this rank's rows with the global facts
every estimator may need -- rows, weight and rows of positive weight per rank, the output dtype --
identical on every rank; an estimator extends it with its own summary (k-means:
:class:`mpinb.kmeans._shard.KMeansShard`). Random choices made by global row index, and rows
gathered by index (:meth:`RowMap.rows`), make an estimator's result independent of the number of
ranks.

Private; collective unless a function says local.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from mpinb import _collective

__all__ = ["RowMap", "Shard", "Totals", "gather_chosen_rows", "owners", "spans"]


def spans(ends: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Which span of a cumulative sum holds each point: ``i`` for ``ends[i-1] <= p < ends[i]``
    (``len(ends)`` past the end). Local. With ``ends = cumsum(rows per rank)`` it is the rank
    that holds each global row; with cumulative weights, the rank or row a weighted draw lands on."""
    return np.searchsorted(ends, points, side="right")


def owners(ends: np.ndarray, points: np.ndarray, eligible: np.ndarray,
           side: Literal["left", "right"] = "right") -> np.ndarray:
    """The rank that holds each point of a cumulative per-rank total (``ends``, in rank order).
    Local.

    Only ``eligible`` ranks (a mask: those with rows, or with weight) hold points: each point goes
    to the first eligible rank whose end is past it (``side`` as in ``np.searchsorted``: "right"
    for ``end > point``, "left" for ``end >= point``), and a point past the end -- round-off of a
    draw on the total -- to the last eligible rank.
    """
    ranks = np.flatnonzero(eligible)
    at = np.searchsorted(ends[ranks], points, side=side)
    return ranks[np.minimum(at, ranks.size - 1)]


class RowMap:
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

    def mine(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Which global rows of ``index`` this rank holds: their positions in ``index`` and their
        local row indices."""
        # offset <= g < offset + n_local as one unsigned comparison: a row below wraps to a huge value.
        off = np.asarray(index, dtype=np.int64) - self.offset
        at = np.flatnonzero(off.view(np.uint64) < np.uint64(self.counts[self.rank]))
        return at, off[at]

    def rows(
        self, X: np.ndarray, weights: np.ndarray | None, index: np.ndarray, dtype: Any, *, name: str
    ) -> tuple[np.ndarray, np.ndarray]:
        """Rows ``index`` (global, in that order, repeats allowed) and their weights, on every
        rank. Collective: one allgather of only those rows, named ``name``."""
        mine, local = self.mine(index)
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
    """This rank's rows and the global facts about all ranks' rows (identical on all ranks)."""

    X: np.ndarray
    weights: np.ndarray | None  # None means unit weights, without an n-row array of ones
    layout: RowMap
    weight_sums: np.ndarray  # weight per rank
    positive: np.ndarray  # rows with positive weight per rank
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

    @staticmethod
    def facts(
        X: np.ndarray, weights: np.ndarray | None, totals: Totals, *, comm: Any, name: str
    ) -> dict[str, Any]:
        """The fields of a :class:`Shard` (or of an estimator's subclass) from ``totals``. Local."""
        return dict(
            X=X,
            weights=weights,
            layout=RowMap(totals.counts, comm),
            weight_sums=totals.weight_sums,
            positive=totals.positive,
            out_dtype=np.dtype(np.float32) if totals.all_float32 else np.dtype(np.float64),
            name=name,
        )
