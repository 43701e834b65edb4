"""Argument checks every module shares: one rule for an integer, a real number and the default
communicator.

Local and deterministic, so a bad argument fails the same way on every rank, before any message.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

__all__ = ["check_int", "check_real", "default_comm", "is_int"]


def is_int(value: Any) -> bool:
    """An integer argument (Python or NumPy), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


_BOUNDS = {None: "an integer", 0: "a non-negative integer", 1: "a positive integer"}


def check_int(value: Any, name: str, *, minimum: int | None = None, unit: str = "", alternative: str = "") -> int:
    """``value`` as an ``int``, or an error naming the argument.

    Not an integer (bools are not) is a ``TypeError``; one below ``minimum`` a ``ValueError``; both
    say what was expected, e.g. "every must be a positive integer number of epochs; got 0.";
    ``alternative`` names what else the argument accepts ("'auto'").
    """
    bound = _BOUNDS.get(minimum, f"an integer >= {minimum}")
    message = f"{name} must be {alternative + ' or ' if alternative else ''}{bound}{' ' + unit if unit else ''}; got {value!r}."
    if not is_int(value):
        raise TypeError(message)
    if minimum is not None and value < minimum:
        raise ValueError(message)
    return int(value)


def check_real(value: Any, name: str, *, minimum: float = -math.inf, below: float = math.inf,
               message: str | None = None) -> float:
    """``value`` as a finite ``float`` with ``minimum <= value < below``, or an error naming it.

    Not a real number (bools are not) is a ``TypeError``; NaN, infinity or out of range a
    ``ValueError``. ``message`` replaces the default text ("tol must be a finite number >= 0; got
    -1.").
    """
    if message is None:
        bounds = [f">= {minimum:g}"] if minimum > -math.inf else []
        bounds += [f"< {below:g}"] if below < math.inf else []
        message = f"{name} must be a finite number{' ' + ' and '.join(bounds) if bounds else ''}; got {value!r}."
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(message)
    if not (math.isfinite(value) and minimum <= value < below):
        raise ValueError(message)
    return float(value)


def default_comm(comm: Any) -> Any:
    """``comm``, or ``MPI.COMM_WORLD`` when it is ``None`` (importing MPI only then)."""
    if comm is None:
        from mpi4py import MPI

        return MPI.COMM_WORLD
    return comm
