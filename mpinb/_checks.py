"""Argument checks every module shares: one rule for an integer and for the default communicator
(estimators declare the rest of their parameters in :mod:`mpinb._constraints`).

Local and deterministic, so a bad argument fails the same way on every rank, before any message.
"""

from __future__ import annotations

import numbers
from typing import Any

__all__ = ["check_int", "default_comm", "integer_bound", "is_int"]


def is_int(value: Any) -> bool:
    """An integer argument (Python or NumPy), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def integer_bound(minimum: int | None) -> str:
    """How a message names the integers from ``minimum`` on: "a positive integer", ..."""
    return _BOUNDS.get(minimum, f"an integer >= {minimum}")


_BOUNDS = {None: "an integer", 0: "a non-negative integer", 1: "a positive integer"}


def check_int(value: Any, name: str, *, minimum: int | None = None, unit: str = "", alternative: str = "") -> int:
    """``value`` as an ``int``, or an error naming the argument.

    Not an integer (bools are not) is a ``TypeError``; one below ``minimum`` a ``ValueError``; both
    say what was expected, e.g. "every must be a positive integer number of epochs; got 0.";
    ``alternative`` names what else the argument accepts ("'auto'").
    """
    bound = integer_bound(minimum)
    either = alternative + " or " if alternative else ""
    message = f"{name} must be {either}{bound}{' ' + unit if unit else ''}; got {value!r}."
    if not is_int(value):
        raise TypeError(message)
    if minimum is not None and value < minimum:
        raise ValueError(message)
    return int(value)


def default_comm(comm: Any) -> Any:
    """``comm``, or ``MPI.COMM_WORLD`` when it is ``None`` (importing MPI only then)."""
    if comm is None:
        from mpi4py import MPI

        return MPI.COMM_WORLD
    return comm
