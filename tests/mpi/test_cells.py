"""Cells on ``mpiexec`` ranks: the races of the cluster tier, made deterministic.

An engine tells the collective layer where its cells begin and end (IPython's execute events); here
each rank plays those events itself, so a test can order them exactly -- which rank ends its cell
when, and who is already waiting in the next cell's collective -- with no cluster and no timing luck.
The default settings throughout: no deadline.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI
from support.mpitools import assert_everywhere

import mpinb
from mpinb import _collective, deadline
from mpinb._collective import cells

RANK = MPI.COMM_WORLD.Get_rank()
SIZE = MPI.COMM_WORLD.Get_size()
_ids = itertools.count(1000)  # cell ids only grow on an engine


@pytest.fixture(autouse=True)
def _no_default_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(deadline.ENV_VAR, raising=False)
    monkeypatch.setattr(deadline, "_setting", deadline._UNSET)


@pytest.fixture
def dup(comm: Any) -> Iterator[Any]:
    """A private communicator, set up (its first collective ran outside any cell)."""
    d = comm.Dup()
    mpinb.allreduce([np.zeros(1)], comm=d)
    yield d
    comm.Barrier()
    d.Free()


@contextmanager
def cell(number: int) -> Iterator[dict[str, Any]]:
    """Run the block as cell ``number`` of every engine: its error, like IPython's, ends the cell
    and is kept (in ``outcome["error"]``), not raised."""
    outcome: dict[str, Any] = {"error": None}
    current = cells.Cell(number)
    cells._current = current
    _collective._on_cell("begin", current, None)
    try:
        yield outcome
    except Exception as err:  # noqa: BLE001 - a cell's error ends the cell
        outcome["error"] = err
    finally:
        cells._current = cells._NONE
        _collective._on_cell("end", current, outcome["error"])


def _value(dup: Any, base: float) -> float:
    return float(mpinb.allreduce([np.full(3, base + RANK)], comm=dup)[0][0])


def _expected(base: float) -> float:
    return sum(base + r for r in range(SIZE))


def _attempt(fn: Callable[[], Any]) -> tuple[Any, BaseException | None]:
    try:
        return fn(), None
    except mpinb.CollectiveAbandoned as err:
        return None, err


@pytest.mark.mpi_sizes(2, 3, 4)
def test_a_queued_cell_never_pairs_with_the_collective_its_rank_left(dup: Any) -> None:
    """Rank 1 fails in cell A before a collective and is already waiting in cell B's when the
    others reach A's. With three ranks or more the last one is late for A, so A's arrival cannot
    complete: rank 0 sees rank 1 left A and gives up on it, and its notice reaches rank 1 inside
    B's arrival, at the same place in the sequence. That notice is about A: B's collective runs again on
    the fresh communicator and gets the right value; A's raises on every rank that called it."""
    a, b = next(_ids), next(_ids)
    late = SIZE - 1 if SIZE >= 3 else None
    with cell(a) as in_a:
        if RANK == 1:
            raise ZeroDivisionError("division by zero")
        time.sleep(0.3 if RANK == 0 else 1.0 if RANK == late else 0.3)  # rank 1 waits in B first
        a_value, a_error = _attempt(lambda: _value(dup, 1.0))
    with cell(b) as in_b:
        b_value = _value(dup, 10.0)
    assert_everywhere(in_b["error"] is None and b_value == _expected(10.0),
                      f"cell B's collective: {in_b['error']!r}, {b_value if in_b['error'] is None else None}")
    if RANK == 1:
        assert isinstance(in_a["error"], ZeroDivisionError)
    else:
        assert a_value is None and a_error is not None, f"rank {RANK}: cell A's collective returned {a_value}"
        if RANK == late:
            assert "came too late" in str(a_error), str(a_error)
        elif late is not None:
            assert "rank 1 ended its cell (raised ZeroDivisionError" in str(a_error), str(a_error)
