"""What the collective layer takes from the process it runs in: one object, passed in.

A :class:`Runtime` holds MPI (``mpi4py.MPI`` or a stand-in), the monotonic and wall clocks, the
two ways a waiting rank gives up its core (``sched_yield``, ``sleep``), the signals it sends and
installs, the host and cores it runs on, which notebook cell runs (:mod:`.cells`), the Ctrl-C
that a :class:`~mpinb.interrupt.StopFlag` holds back (:class:`~mpinb.interrupt.Interrupts`), how
patiently it waits (:class:`Pace`), and an observer of the protocol's steps. The layer's modules
(``mpinb/_collective/*``, ``mpinb/interrupt.py``) reach none of these any other way -- a unit test
reads their imports -- so the protocol model (``tests/model``) runs the real layer over simulated
ranks by giving each rank a Runtime of its own, and a new use of a clock, MPI or a signal cannot
slip past the model.

A channel binds what its waits and operations call to its own attributes once
(``chan.monotonic``, ``chan.mpi``), so the seam costs no lookup per call. Local; nothing here
imports ``mpi4py.MPI`` before the first channel asks for it.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from mpinb._collective import cells
from mpinb._collective.fused import _plans

__all__ = ["PACE", "PROCESS", "InterruptSource", "Pace", "Runtime"]


class InterruptSource(Protocol):
    """The Ctrl-C held back in a process (:class:`mpinb.interrupt.Interrupts`), as the waits read it."""

    def pending_since(self) -> float | None: ...

    def consume(self) -> None: ...

    def instead_if_pending(self, error: BaseException) -> BaseException: ...


class Pace(NamedTuple):
    """How a wait spends its time (:func:`mpinb._collective.wait.poll` says why each is what it is)."""

    spin: float = 1e-3  # busy-poll this long while ranks arrive: arrival skew on an idle machine stays below it
    yield_for: float = 2e-2  # then test and yield the core this long: a sleeping rank delays the next message
    first_pause: float = 2e-5  # then sleep between tests, the pause doubling ...
    max_pause: float = 1e-3  # ... up to this
    data_spin: float = 2e-2  # with every rank present, test without yielding for this long
    check: float = 5e-5  # seconds between looks at notices and the deadline while ranks arrive
    check_data: float = 1e-3  # the same while data move
    watch: float = 0.05  # seconds between looks at whether a missing rank has left the cell (a board read)


PACE = Pace()  # a real machine's

_NOTICE_ENV = "MPINB_WAIT_NOTICE"  # seconds of waiting before a rank says whom it waits for
_notice_cache: tuple[str | None, float | None] = ("", 10.0)


def notice_after() -> float | None:
    """Seconds of waiting before a rank says whom it waits for (``MPINB_WAIT_NOTICE``; ``off``: never)."""
    global _notice_cache
    raw = os.environ.get(_NOTICE_ENV)
    if raw == _notice_cache[0]:
        return _notice_cache[1]
    text = (raw or "").strip().lower()
    if text in ("", "default"):
        value: float | None = 10.0
    elif text in ("none", "off", "0"):
        value = None
    else:
        try:
            value = max(float(text), 0.1)
        except ValueError:
            value = 10.0
    _notice_cache = (raw, value)
    return value


def affinity() -> frozenset[int]:
    """The cores this process may run on."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity API
        return frozenset(range(os.cpu_count() or 1))


# Windows has no sched_yield: a zero sleep gives up the rest of the time slice there.
_sched_yield: Callable[[], None] = getattr(os, "sched_yield", lambda: time.sleep(0))


class Runtime:
    """The process (or a simulated rank) the layer runs in. Every argument defaults to this process's own.

    ``observer(op, phase, event, rule)`` is called at every step of the protocol table (``rule``
    ``None`` where the table has none, just before the step raises
    :class:`~mpinb._collective.protocol.ProtocolError`); ``None``: nobody watches.
    """

    def __init__(self, *, mpi: Any = None, monotonic: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, time_ns: Callable[[], int] = time.time_ns,
                 sleep: Callable[[float], None] = time.sleep, sched_yield: Callable[[], None] = _sched_yield,
                 signals: Any = signal, kill: Callable[[int, int], None] = os.kill,
                 hostname: Callable[[], str] = socket.gethostname, affinity: Callable[[], frozenset[int]] = affinity,
                 cell: Callable[[], cells.Cell] = cells.current, interrupts: InterruptSource | None = None,
                 notice_after: Callable[[], float | None] = notice_after,
                 observer: Callable[[Any, Any, str, Any], None] | None = None, pace: Pace = PACE,
                 plans: dict[tuple, Any] | None = None) -> None:
        self._mpi, self._interrupts = mpi, interrupts
        self.monotonic, self.wall, self.time_ns = monotonic, wall, time_ns
        self.sleep, self.sched_yield = sleep, sched_yield
        self.signals, self.kill = signals, kill
        self.hostname, self.affinity, self.cell = hostname, affinity, cell
        self.notice_after, self.observer, self.pace = notice_after, observer, pace
        # The fused reductions' plans (:mod:`.fused`): their wire buffers belong to one process.
        self.plans: dict[tuple, Any] = {} if plans is None else plans

    @property
    def mpi(self) -> Any:
        """MPI: ``mpi4py.MPI``, imported (so MPI initialised) the first time it is asked for."""
        if self._mpi is None:
            from mpi4py import MPI

            self._mpi = MPI
        return self._mpi

    @property
    def interrupts(self) -> InterruptSource:
        """The Ctrl-C held back by this process's :class:`~mpinb.interrupt.StopFlag` s."""
        if self._interrupts is None:
            from mpinb.interrupt import PENDING

            self._interrupts = PENDING
        return self._interrupts


#: This process.
PROCESS = Runtime(plans=_plans)
