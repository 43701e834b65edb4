"""Sharding under mpiexec: each rank its slice, a length mismatch raised everywhere."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpinb
from support.mpitools import raises_everywhere

RANK = MPI.COMM_WORLD.Get_rank()
SIZE = MPI.COMM_WORLD.Get_size()


def test_shard_gives_each_rank_its_slice(any_comm) -> None:
    X = np.arange(22).reshape(11, 2)
    y = np.arange(11)
    Xs, ys = mpinb.shard(X, y, comm=any_comm)
    lo, hi = mpinb.shard_bounds(11, rank=any_comm.Get_rank(), size=any_comm.Get_size())
    np.testing.assert_array_equal(Xs, X[lo:hi])
    np.testing.assert_array_equal(mpinb.gather_rows(ys, root=None, comm=any_comm), y)


@pytest.mark.mpi_sizes(2, 3, 4)
def test_shard_length_mismatch_across_ranks_raises_everywhere(comm) -> None:
    with raises_everywhere(mpinb.CollectiveMismatchError, match="length of the arrays passed to shard"):
        mpinb.shard(np.zeros(10 + (RANK == 0)), comm=comm)
