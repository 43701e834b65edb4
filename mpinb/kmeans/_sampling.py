"""Where a mini-batch's rows are: scikit-learn's uniform draws mapped to global rows, and those
to the ranks that hold them.

Private to :mod:`mpinb.kmeans`; local unless a function says collective.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mpinb import _collective, _rows
from mpinb._rows import Shard, owners, spans

__all__ = ["Draws", "Sampler", "any_weighted"]


def any_weighted(data: Shard) -> bool:
    """Whether any rank has weights other than ones (one small collective): with unit weights
    everywhere a draw maps to a row by ``floor(u * n)``, exactly, at any number of ranks."""
    weights = data.weights
    vote = int(weights is not None and bool(np.any(weights != 1.0)))
    return bool(_collective.vote(vote, comm=data.comm, name=f"{data.name}'s weights vote"))


@dataclass
class Draws:
    where: np.ndarray  # global row of each draw (unit weights) or its point on the cumulative weights
    mine: np.ndarray  # positions in the mini-batch of this rank's draws
    local: np.ndarray  # their local row indices


class Sampler:
    """Maps the uniform numbers of a mini-batch to global rows, and those to ranks (``fit``).

    Unit weights: row ``floor(u * n)``. Weighted: the row where ``u * W`` falls in the
    cumulative weights in rank order (first the rank, from the per-rank totals every rank
    knows, then the row, in this rank's cumulative weights), so a zero-weight row is never drawn.
    """

    def __init__(self, data: Shard, weighted: bool) -> None:
        self.data = data
        self.weighted = weighted
        self.n = data.n_total
        self.lo, self.hi = data.offset, data.offset + data.n_local
        self.everything: np.ndarray | None = None  # positions 0..batch-1, when this rank holds every row
        if weighted:
            w = data.weights if data.weights is not None else np.ones(data.n_local)
            self.w_ends = np.cumsum(data.weight_sums)
            self.total = float(self.w_ends[-1])
            self.has_weight = data.weight_sums > 0
            start = float(self.w_ends[data.rank] - data.weight_sums[data.rank])
            self.cum = start + np.cumsum(w)
            positive = np.flatnonzero(w > 0)
            self.last_row = int(positive[-1]) if positive.size else 0

    def draw(self, u: np.ndarray) -> Draws:
        if not self.weighted:
            g = (u * self.n).astype(np.int64)
            np.minimum(g, self.n - 1, out=g)
            if self.hi - self.lo == self.n:
                if self.everything is None or self.everything.size != g.size:
                    self.everything = np.arange(g.size)
                return Draws(g, self.everything, g)
            mine, local = self.data.layout.mine(g)
            return Draws(g, mine, local)
        t = u * self.total
        mine = np.flatnonzero(self._owner(t) == self.data.rank)
        local = spans(self.cum, t[mine])
        np.minimum(local, self.last_row, out=local)
        return Draws(t, mine, local)

    def rows(self, X: np.ndarray, draws: Draws, chosen: np.ndarray) -> np.ndarray:
        """Rows at positions ``chosen`` of the mini-batch ``draws``, on every rank. Collective."""
        where = draws.where[chosen]
        owner = self._owner(where) if self.weighted else self.data.layout.owner(where)
        local_at = np.full(draws.where.size, -1, dtype=np.int64)
        local_at[draws.mine] = draws.local
        mine = np.flatnonzero(owner == self.data.rank)
        return _rows.gather_chosen_rows(X, None, mine, local_at[chosen[mine]], chosen.size, np.float64,
                                        self.data.comm, f"{self.data.name}'s reassigned centres")[0]

    def _owner(self, t: np.ndarray) -> np.ndarray:
        """The rank whose span of the cumulative weights holds each point (never a rank of zero
        weight; round-off past the end goes to the last rank with weight)."""
        return owners(self.w_ends, t, self.has_weight)
