"""A generation of a channel's data communicator: the unit a revocation ends and a fresh
communicator replaces. Data only, so that every module of the layer can name it without importing
the channel."""

from __future__ import annotations

from typing import Any

__all__ = ["Gen"]


class Gen:
    """One generation of the data communicator."""

    __slots__ = ("number", "comm", "request", "index", "revoked", "abandoned_here", "pending", "left", "freed")

    def __init__(self, number: int, comm: Any, request: Any) -> None:
        self.number, self.comm, self.request = number, comm, request
        self.index = 0  # operations begun on it
        self.revoked: dict[str, Any] | None = None  # the notice that ended it
        self.abandoned_here = False
        self.pending: list[tuple[Any, Any]] = []  # (requests, buffers) MPI may still use
        self.left = False
        self.freed = False
