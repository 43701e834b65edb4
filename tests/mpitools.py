"""Helpers for tests that run under ``mpiexec``: assert together, raise together, same everywhere."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np
import pytest


def world():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def all_true(ok: bool, comm: Any = None) -> bool:
    """Whether ``ok`` holds on every rank; every rank gets the same answer, so tests pass or fail
    together instead of leaving one rank in a collective."""
    comm = comm or world()
    return all(comm.allgather(bool(ok)))


def assert_everywhere(ok: bool, what: str = "", comm: Any = None) -> None:
    comm = comm or world()
    verdicts = comm.allgather(bool(ok))
    bad = [r for r, v in enumerate(verdicts) if not v]
    assert not bad, f"{what} failed on ranks {bad}"


def assert_same_everywhere(value: Any, comm: Any = None, *, rtol: float = 0.0) -> None:
    """``value`` (array or scalar) is equal on every rank (exactly, unless ``rtol``)."""
    comm = comm or world()
    values = comm.allgather(np.asarray(value))
    for r, v in enumerate(values):
        if rtol:
            np.testing.assert_allclose(v, values[0], rtol=rtol, err_msg=f"rank {r} differs from rank 0")
        else:
            np.testing.assert_array_equal(v, values[0], err_msg=f"rank {r} differs from rank 0")


@contextmanager
def raises_everywhere(exc: type[BaseException], match: str | None = None, comm: Any = None) -> Iterator[Any]:
    """Like ``pytest.raises``, and also: every rank raised the same type with the same message, and
    the communicator still works afterwards (a follow-up collective completes)."""
    comm = comm or world()
    with pytest.raises(exc, match=match) as info:
        yield info
    seen = comm.allgather((type(info.value).__name__, str(info.value)))
    assert len(set(seen)) == 1, f"ranks raised different errors: {seen}"
    # The communicator must still be usable: a buffer collective after the error completes.
    probe = np.array([1.0])
    from mpi4py import MPI

    comm.Allreduce(MPI.IN_PLACE, probe, op=MPI.SUM)
    assert probe[0] == comm.Get_size()
