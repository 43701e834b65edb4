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

import mpinb
from mpinb import _collective, deadline
from mpinb._collective import cells
from support.mpitools import assert_everywhere

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


# Rank 1 leaves cell A without its collective, then runs cell B at once (its collective meets the
# others' A at the same place in the sequence) or only after the others gave A up.
ORDERINGS = {"next-cell-at-once": 0.0, "next-cell-after-the-revocation": 1.5}
# How rank 1 leaves cell A: an error before the collective, or returning early.
LEAVES = {"error": "raised ZeroDivisionError: division by zero", "return": "ended normally"}


@pytest.mark.mpi_sizes(2, 3, 4)
@pytest.mark.parametrize("leaves", list(LEAVES))
@pytest.mark.parametrize("ordering", list(ORDERINGS))
def test_a_rank_that_left_its_cell_never_keeps_the_others_waiting_nor_pairs_with_them(
        dup: Any, ordering: str, leaves: str) -> None:
    """Cell A: rank 1 leaves without A's collective, which every other rank calls (with three
    ranks or more the last one late, so A's arrival cannot complete: the others must see that rank
    1 left). Cell B: every rank's collective. A's callers raise promptly, naming rank 1 and how it
    left; the late one raises as the late call of the abandoned collective; B's collective gets the
    right value everywhere. At once, rank 1's B meets the others' A at the same place: the
    revocation of A reaches it inside B's arrival, which runs again on the fresh communicator."""
    a, b = next(_ids), next(_ids)
    late = SIZE - 1 if SIZE >= 3 else None
    with cell(a) as in_a:
        if RANK == 1:
            if leaves == "error":
                raise ZeroDivisionError("division by zero")
        else:
            time.sleep(1.0 if RANK == late else 0.3)  # rank 1 is in B first when B comes at once
            began = time.monotonic()
            a_value, a_error = _attempt(lambda: _value(dup, 1.0))
            waited = time.monotonic() - began
    if RANK == 1:
        time.sleep(ORDERINGS[ordering])
    with cell(b) as in_b:
        b_value = _value(dup, 10.0)
    assert_everywhere(in_b["error"] is None and b_value == _expected(10.0),
                      f"cell B's collective: {in_b['error']!r}, {b_value if in_b['error'] is None else None}")
    if RANK == 1:
        assert (in_a["error"] is None) == (leaves == "return"), repr(in_a["error"])
        return
    assert a_value is None and a_error is not None, f"rank {RANK}: cell A's collective returned {a_value}"
    if RANK == late:
        assert "came too late" in str(a_error), str(a_error)
    elif late is not None or ordering != "next-cell-at-once":
        # (At two ranks, at once, A's arrival completes with rank 1's B: a meeting of two cells.)
        assert f"rank 1 ended its cell ({LEAVES[leaves]})" in str(a_error), str(a_error)
        assert waited < 1.0, f"rank {RANK} waited {waited:.2f} s for a rank that had left its cell"


# Issue 50: who reaches the end of the cell first, the rank that raises or the others.
RAISES_AFTER = {"the others wait": (0.3, 0.0), "it raises first": (0.0, 0.3)}


@pytest.mark.mpi_sizes(2, 3)
@pytest.mark.parametrize("first", list(RAISES_AFTER))
def test_a_rank_that_raises_after_the_cells_only_collective_fails_alone(dup: Any, first: str) -> None:
    """Every rank makes the cell's one collective; then the last rank raises. The others' cell-end
    comparison learns that it ended its cell after the same collectives, and returns: their value
    is right (they used to raise a false CollectiveMismatchError, often naming a rank that did
    nothing). Raising first, its next cell's collective meets the others' comparison, which also
    returns. The next cell works on every rank."""
    last = SIZE - 1
    raiser_sleeps, others_sleep = RAISES_AFTER[first]
    with cell(next(_ids)) as in_a:
        a_value = _value(dup, 1.0)
        if RANK == last:
            time.sleep(raiser_sleeps)
            raise ValueError("the user's code raised after the collective")
        time.sleep(others_sleep)
        _collective.cell_end_check()  # an engine's last statement of every cell
    with cell(next(_ids)) as in_b:
        b_value = _value(dup, 10.0)
    assert_everywhere(in_b["error"] is None and b_value == _expected(10.0),
                      f"cell B's collective: {in_b['error']!r}, {b_value if in_b['error'] is None else None}")
    assert_everywhere(a_value == _expected(1.0), f"cell A's collective returned {a_value}")
    mine = in_a["error"]
    assert_everywhere(isinstance(mine, ValueError) if RANK == last else mine is None, f"cell A ended with {mine!r}")
