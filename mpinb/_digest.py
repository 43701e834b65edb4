"""One digest for every agreement check: process-independent, so equal on every rank. Local."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

__all__ = ["digest", "int_digest"]


def digest(*values: Any) -> str:
    """A short hex digest of arrays (dtype, shape and bytes) and ``numpy.random.RandomState`` states.

    Python's ``hash()`` is salted per process; a keyed BLAKE2 digest is identical on every rank.
    """
    h = hashlib.blake2b(digest_size=8)
    for value in values:
        if isinstance(value, np.random.RandomState):
            state: Any = value.get_state(legacy=True)
            h.update(state[1].tobytes() + repr(state[2:]).encode())
        else:
            arr = np.ascontiguousarray(value)
            h.update(repr((arr.dtype.str, arr.shape)).encode())
            h.update(arr.data if arr.size else b"")
    return h.hexdigest()


def int_digest(data: bytes, size: int = 7) -> int:
    """The digest of ``data`` as a non-negative integer of ``size`` bytes (7 keep its negation in int64)."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=size).digest(), "little")
