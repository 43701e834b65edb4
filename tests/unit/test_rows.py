"""mpinb._rows, rows spread over ranks, on one process: which rank holds a global row or a point
of a cumulative total, gathering rows by index, and k-means's summary of a shard."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from mpinb._rows import RowMap, Shard, Totals, owners, spans
from mpinb.kmeans._kernels import NUMPY
from mpinb.kmeans._shard import KMeansShard

SELF = MPI.COMM_SELF


class FakeComm:
    """Rank ``rank`` of ``size``, for what a RowMap computes locally."""

    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.size = rank, size

    def Get_rank(self) -> int:  # noqa: N802 - mpi4py's name
        return self.rank

    def Get_size(self) -> int:  # noqa: N802 - mpi4py's name
        return self.size


def test_owner_is_the_rank_whose_rows_hold_the_index() -> None:
    counts = np.array([3, 0, 2, 0, 4])  # ranks without rows own nothing
    by_row = np.repeat(np.arange(counts.size), counts)
    for rank in range(counts.size):
        layout = RowMap(counts, FakeComm(rank, counts.size))
        assert layout.n_total == 9 and layout.offset == int(counts[:rank].sum())
        np.testing.assert_array_equal(layout.owner(np.arange(9)), by_row)
    # Past the end is past the last rank; a point on a boundary belongs to the next span.
    np.testing.assert_array_equal(spans(np.array([1.0, 3.0]), np.array([0.0, 1.0, 2.9, 3.0])), [0, 1, 1, 2])


def test_mine_is_this_ranks_positions_and_local_rows() -> None:
    counts = np.array([3, 0, 2, 4])
    index = np.array([8, 0, 3, 4, 2, 5, 3])
    by_rank = np.repeat(np.arange(counts.size), counts)
    for rank in range(counts.size):
        layout = RowMap(counts, FakeComm(rank, counts.size))
        at, local = layout.mine(index)
        np.testing.assert_array_equal(at, np.flatnonzero(by_rank[index] == rank))
        np.testing.assert_array_equal(local, index[at] - layout.offset)


@pytest.mark.parametrize("side", ["left", "right"])
def test_owners_of_points_on_cumulative_totals(side: str) -> None:
    totals = np.array([2.0, 0.0, 3.0, 1.0, 0.0])
    ends = np.cumsum(totals)  # [2, 2, 5, 6, 6]
    points = np.array([0.0, 1.9, 2.0, 4.99, 5.0, 5.5, 6.0, 7.0])
    eligible = totals > 0
    got = owners(ends, points, eligible, side)
    # The first eligible rank whose end is past the point (>= for "left"); past the end, the last.
    for p, r in zip(points, got, strict=True):
        past = [q for q in np.flatnonzero(eligible) if (ends[q] >= p if side == "left" else ends[q] > p)]
        assert r == (past[0] if past else 3), (p, r)
    # Ranks with rows but no weight are eligible when the caller says so (k-means++'s draws).
    assert owners(ends, np.array([2.0]), np.array([True, True, True, True, False]), "left")[0] == 0
    assert owners(ends, np.array([2.0]), np.array([False, True, True, True, False]), "left")[0] == 1


def test_rows_by_index_in_order_with_repeats() -> None:
    X = np.arange(20.0).reshape(10, 2)
    w = np.linspace(0.5, 5.0, 10)
    index = np.array([7, 0, 7, 3])
    rows, weights = RowMap(np.array([10]), SELF).rows(X, w, index, np.float32, name="test rows")
    assert rows.dtype == np.float32
    np.testing.assert_array_equal(rows, X[index])
    np.testing.assert_array_equal(weights, w[index])


@pytest.mark.parametrize("weighted", [False, True])
def test_shard_summary_is_numpys(weighted: bool) -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(3.0, 2.0, size=(500, 4))
    w = rng.uniform(0, 2, 500) if weighted else None
    totals = Totals.collect(X, w, comm=SELF, name="test summary")
    data = KMeansShard.build(X, w, X.sum(axis=0), totals, passes=NUMPY, comm=SELF, name="Test.fit")
    assert isinstance(data, Shard)
    assert data.n_total == data.n_local == 500 and data.rank == 0 and data.offset == 0
    assert data.weight_sums[0] == pytest.approx(500.0 if w is None else w.sum())
    np.testing.assert_allclose(data.mean, X.mean(axis=0), rtol=1e-13)
    np.testing.assert_allclose(data.variance, X.var(axis=0), rtol=1e-12)
    sq = ((X - X.mean(axis=0)) ** 2).sum(axis=1)
    assert data.max_sq_norm == pytest.approx(sq.max(), rel=1e-12)
    assert data.sq_norm_total == pytest.approx(sq @ (np.ones(500) if w is None else w), rel=1e-12)
    assert data.out_dtype == np.float64 and data.name == "Test.fit"
