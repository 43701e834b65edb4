"""numba for mpinb's compiled kernels, and the ``MPINB_NUMBA`` switch that rules it in or out. Local.

numba is a dependency of mpinb (``pyproject.toml`` and ``environment.yml``); the switch exists to
test the NumPy executors on any data size and to rule compiled code out when hunting a bug.
"""

from __future__ import annotations

import functools
import os
import warnings
from typing import Any

__all__ = ["load", "mode", "unavailable_on_demand"]

_OFF = ("0", "false", "no", "off")
_ON = ("1", "true", "yes", "on")


def mode() -> str:
    """``"off"``, ``"on"`` or ``"auto"`` (the default: each caller decides by the size of its work),
    from ``MPINB_NUMBA``, read at each call."""
    value = os.environ.get("MPINB_NUMBA", "auto").strip().lower()
    if value in _OFF:
        return "off"
    if value in _ON:
        return "on"
    if value in ("", "auto"):
        return "auto"
    raise ValueError(f"MPINB_NUMBA must be 0/off, 1/on or auto; got {value!r}.")


def load() -> Any:
    """The ``numba`` module, or ``None`` when ``MPINB_NUMBA=0`` turns it off or it is missing (an
    environment made without mpinb's requirements: the NumPy executors still work)."""
    if mode() == "off":
        return None
    return _imported()


@functools.cache
def _imported() -> Any:
    try:
        import numba
    except ImportError as exc:
        _why_not.append(f"{type(exc).__name__}: {exc}")
        return None
    return numba


_why_not: list[str] = []


@functools.cache
def unavailable_on_demand() -> None:
    """Warn (once per process) that ``MPINB_NUMBA=on`` asked for compiled passes that cannot run
    because numba does not import; the NumPy passes run instead."""
    why = _why_not[0] if _why_not else "numba did not load"
    warnings.warn(f"MPINB_NUMBA=on asks for mpinb's compiled passes, but numba cannot be imported here ({why}); "
                  "the NumPy passes run instead. Install numba (it is one of mpinb's requirements) or unset "
                  "MPINB_NUMBA.", RuntimeWarning, stacklevel=4)
