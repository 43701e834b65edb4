"""The deadline of mpinb's collectives: a local setting, never part of what goes over the wire."""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

__all__ = ["get_collective_timeout", "set_collective_timeout"]

ENV_VAR = "MPINB_COLLECTIVE_TIMEOUT"


class _Default:
    """The ``timeout`` default: use :func:`get_collective_timeout` (like ``socket``'s global default)."""

    def __repr__(self) -> str:
        return "<the global default>"


#: Passed as ``timeout=DEFAULT`` (the default), a collective uses the global default deadline.
DEFAULT: Any = _Default()
_UNSET: Any = object()
_setting: Any = _UNSET
_env_cache: tuple[str | None, float | None] = (None, None)



def set_collective_timeout(seconds: float | None) -> None:
    """Set the deadline, in seconds, that mpinb's collectives use when not given ``timeout=``.

    Local: it sets this process's default only, so call it on every rank (in a ``%%px`` cell, or at
    the top of the script). It takes precedence over the ``MPINB_COLLECTIVE_TIMEOUT`` environment
    variable; ``None`` turns the default deadline off (collectives block, as plain MPI does).

    Parameters
    ----------
    seconds : float or None
        A positive number of seconds, or ``None`` for no deadline.

    Examples
    --------
    >>> mpinb.set_collective_timeout(60)   # a rank missing for a minute raises CollectiveTimeout
    """
    global _setting
    _setting = _check_seconds(seconds, "seconds")


def get_collective_timeout() -> float | None:
    """The deadline mpinb's collectives use when not given ``timeout=``, in seconds (``None``: none).

    Local. It is the value given to :func:`set_collective_timeout`, or else the environment variable
    ``MPINB_COLLECTIVE_TIMEOUT`` (read at call time, so ``%env`` in a notebook works), or else ``None``.
    """
    if _setting is not _UNSET:
        return _setting
    global _env_cache
    raw = os.environ.get(ENV_VAR)
    if raw == _env_cache[0]:
        return _env_cache[1]
    text = (raw or "").strip().lower()
    if text in ("", "none", "off"):
        value = None
    else:
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not value > 0:
            raise ValueError(
                f"{ENV_VAR} must be a positive number of seconds (or empty or 'none' for no deadline); got {raw!r}."
            )
        value = None if math.isinf(value) else value
    _env_cache = (raw, value)
    return value


def resolve(timeout: Any = DEFAULT) -> float | None:
    """The seconds one collective may wait: ``timeout`` itself, or the global default for ``DEFAULT``."""
    return get_collective_timeout() if timeout is DEFAULT else _check_seconds(timeout, "timeout")


def _check_seconds(seconds: Any, what: str) -> float | None:
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float, np.integer, np.floating)) or not seconds > 0:
        raise ValueError(f"{what} must be a positive number of seconds or None (no deadline); got {seconds!r}.")
    return None if math.isinf(seconds) else float(seconds)
