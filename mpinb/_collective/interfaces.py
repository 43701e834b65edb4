"""What the layer's modules need of a channel and of an operation, as typing protocols.

An operation (:mod:`.ops`) drives its channel; the error texts (:mod:`.texts`) and the waiting
policy (:mod:`.wait`) read both. They name these protocols instead of importing
:class:`~mpinb._collective.channels.Channel` and :class:`~mpinb._collective.ops.Op`, which import
them: no import circle, and each protocol is the whole of what one side may use of the other (the
protocol model's simulator drives the same surface). Type-only: nothing here runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from mpinb._collective.board import Board, CellRecord
from mpinb._collective.cells import Cell
from mpinb._collective.generation import Gen
from mpinb._collective.protocol import CellLedger, Phase
from mpinb._collective.runtime import InterruptSource, Pace, Runtime

__all__ = ["ChannelPort", "OpView"]


class ChannelPort(Protocol):
    """A rank's channel, as its operations, texts and waits see it."""

    # Its runtime's members, bound once (:class:`~mpinb._collective.channels.Channel`).
    runtime: Runtime
    mpi: Any
    mpi_ops: dict[str, Any]
    monotonic: Callable[[], float]
    wall: Callable[[], float]
    time_ns: Callable[[], int]
    sleep: Callable[[float], None]
    sched_yield: Callable[[], None]
    pace: Pace
    spin: float
    interrupts: InterruptSource
    current_cell: Callable[[], Cell]
    observer: Callable[[Any, Any, str, Any], None] | None

    rank: int
    size: int
    hosts: list[str]
    board: Board | None
    gens: list[Gen]
    active: int
    crowded: bool
    ledger: CellLedger
    scope: tuple[str, int] | None

    @property
    def host(self) -> str: ...

    def notices(self) -> None: ...

    def departed(self, op: Any) -> tuple[int, str] | None: ...

    def cell_record(self, rank: int) -> CellRecord | None: ...

    def release(self) -> None: ...

    def retire(self, op: Any, why: str) -> None: ...

    def await_revocation(self, gen: Gen, seconds: float = 5.0) -> dict[str, Any] | None: ...

    def abandon(self, op: Any, requests: list[Any], keep: Any, why: str | None,
                missing: dict[int, str] | None = None, departed: int | None = None, *,
                revoke: bool = True) -> None: ...


class OpView(Protocol):
    """An operation in progress, as the texts and the waiting policy read it."""

    chan: ChannelPort
    gen: Gen | None
    name: str
    index: int
    cell: int
    timeout: float | None
    phase: Phase

    def notice_due(self, now: float) -> bool: ...

    def tell_waiting(self) -> None: ...
