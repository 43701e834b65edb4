"""The agreement decisions under mpiexec: the same exception, naming the failing ranks, on every rank."""

from __future__ import annotations

import pytest
from mpi4py import MPI

import mpinb
from support.mpitools import raises_everywhere

RANK = MPI.COMM_WORLD.Get_rank()
SIZE = MPI.COMM_WORLD.Get_size()


def test_check_all_names_failing_ranks(comm) -> None:
    mpinb.check_all(True, "never shown", comm=comm)
    bad = SIZE - 1
    where = "the only rank" if SIZE == 1 else f"rank {bad} of {SIZE}"
    with raises_everywhere(RuntimeError, match=rf"shard is empty \[on {where}\]"):
        mpinb.check_all(RANK != bad, "shard is empty", comm=comm, exc=RuntimeError)


def test_check_all_combines_different_messages(comm) -> None:
    with raises_everywhere(ValueError) as info:
        mpinb.check_all(False, f"rank-specific detail {RANK}", comm=comm)
    if SIZE > 1:
        assert "rank 0: rank-specific detail 0; rank 1: rank-specific detail 1" in str(info.value)


@pytest.mark.mpi_sizes(2, 3, 4)
def test_check_same_detects_hyperparameter_mismatch(comm) -> None:
    mpinb.check_same({"k": 5}, "n_clusters", comm=comm)
    with raises_everywhere(mpinb.CollectiveMismatchError,
                           match=r"n_clusters must be the same on every rank.*rank 1: 6"):
        mpinb.check_same(6 if RANK == 1 else 5, "n_clusters", comm=comm)


@pytest.mark.mpi_sizes(2, 3)
def test_check_same_names_the_first_differing_entry_of_a_long_list_in_full(comm) -> None:
    # Two models whose 26th weight differs: the message names it, with its path, on every rank,
    # instead of a window cut from the middle of two long reprs.
    shapes = [((784, 512), "float32"), ((512,), "float32")] * 20
    if RANK == SIZE - 1:
        shapes[25] = ((512, 10), "float32")
    names = [f"dense_{i // 2}/{'kernel' if i % 2 == 0 else 'bias'}" for i in range(40)]
    with raises_everywhere(mpinb.CollectiveMismatchError, match=r"first at entry 25") as info:
        mpinb.check_same(shapes, "the model's weight shapes and dtypes", comm=comm, labels=names)
    text = str(info.value)
    assert f"rank {SIZE - 1}: dense_12/bias ((512, 10), 'float32')" in text and "..." not in text, text


def test_raise_together_spreads_the_first_failure(comm) -> None:
    with raises_everywhere(KeyError, match="missing column"):
        with mpinb.raise_together(comm=comm):
            if RANK == SIZE - 1:
                raise KeyError("missing column")
    with mpinb.raise_together(comm=comm):
        pass  # nothing raised anywhere: nothing raised
