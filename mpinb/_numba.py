"""numba, when it is installed and not switched off: mpinb's compiled kernels are all optional."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["load"]


def load() -> Any:
    """The ``numba`` module, or ``None`` when it is missing or ``MPINB_NUMBA=0`` turns it off.

    Local. Callers keep a NumPy path for ``None``; the switch exists to test that path and to rule
    compiled code out when hunting a bug.
    """
    if os.environ.get("MPINB_NUMBA", "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    try:
        import numba
    except ImportError:
        return None
    return numba
