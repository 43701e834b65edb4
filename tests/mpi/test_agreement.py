"""The agreement decisions under mpiexec: the same exception, naming the failing ranks, on every rank."""

from __future__ import annotations


import pytest
from mpi4py import MPI
from support.mpitools import raises_everywhere

import mpinb

RANK = MPI.COMM_WORLD.Get_rank()
SIZE = MPI.COMM_WORLD.Get_size()


def test_check_all_names_failing_ranks(comm) -> None:
    mpinb.check_all(True, "never shown", comm=comm)
    bad = SIZE - 1
    with raises_everywhere(RuntimeError, match=rf"shard is empty \[on {'the only rank' if SIZE == 1 else f'rank {bad} of {SIZE}'}\]"):
        mpinb.check_all(RANK != bad, "shard is empty", comm=comm, exc=RuntimeError)


def test_check_all_combines_different_messages(comm) -> None:
    with raises_everywhere(ValueError) as info:
        mpinb.check_all(False, f"rank-specific detail {RANK}", comm=comm)
    if SIZE > 1:
        assert "rank 0: rank-specific detail 0; rank 1: rank-specific detail 1" in str(info.value)


@pytest.mark.mpi_sizes(2, 3, 4)
def test_check_same_detects_hyperparameter_mismatch(comm) -> None:
    mpinb.check_same({"k": 5}, "n_clusters", comm=comm)
    with raises_everywhere(mpinb.CollectiveMismatchError, match=r"n_clusters must be the same on every rank.*rank 1: 6"):
        mpinb.check_same(6 if RANK == 1 else 5, "n_clusters", comm=comm)


def test_raise_together_spreads_the_first_failure(comm) -> None:
    with raises_everywhere(KeyError, match="missing column"):
        with mpinb.raise_together(comm=comm):
            if RANK == SIZE - 1:
                raise KeyError("missing column")
    with mpinb.raise_together(comm=comm):
        pass  # nothing raised anywhere: nothing raised
