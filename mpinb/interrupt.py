"""Cooperative interrupts: Ctrl-C stops every rank at the same iteration instead of one rank only.

A SIGINT that reaches only some ranks (or reaches them at different moments) would leave the others
blocked in the next collective. Inside :class:`StopFlag`, SIGINT only sets a flag; the long loop
folds ``flag.value`` into the reduction it already does each iteration/epoch, and every rank leaves
the loop when the *reduced* flag is set, then raises ``KeyboardInterrupt`` together.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

from mpinb._collective.runtime import PROCESS

__all__ = ["INTERRUPT_GRACE", "Interrupts", "StopFlag"]

#: Seconds a SIGINT may stay pending in a StopFlag while its rank waits in one mpinb collective
#: before the wait ends as a plain Ctrl-C would. Long enough that ranks which are merely slow (4
#: ranks sharing 2 cores, a step's tracing) still reach the vote and stop at the same step; short
#: enough that a rank stuck elsewhere never keeps the others waiting for long.
INTERRUPT_GRACE = 5.0


class Interrupts:
    """The Ctrl-C a :class:`StopFlag` holds back in one process (in the protocol model, one simulated
    rank), for the collective layer's waits: its :class:`~mpinb._collective.runtime.Runtime` holds
    it. Local; callable from any thread."""

    __slots__ = ("clock", "signals", "pending_at", "wakeup")

    def __init__(self, clock: Callable[[], float], signals: Any = None) -> None:
        self.clock, self.signals = clock, signals
        # When SIGINT arrived inside a StopFlag and no collective vote has taken it in yet (seconds
        # of ``clock``).
        self.pending_at: float | None = None
        # The read end of the pipe Python's C-level signal handler writes to while a StopFlag is
        # active: a wait on another thread learns of SIGINT through it even while the main thread
        # is inside C code (TensorFlow's) and so cannot run Python's handler yet.
        self.wakeup: int | None = None

    def note(self) -> None:
        """SIGINT arrived (inside a StopFlag): pending from now, unless it already was."""
        if self.pending_at is None:
            self.pending_at = self.clock()

    def pending_since(self) -> float | None:
        """When SIGINT arrived inside a :class:`StopFlag` that no vote has taken in yet, else ``None``."""
        fd = self.wakeup
        if fd is not None and self.pending_at is None:
            try:
                data = os.read(fd, 64)
            except (BlockingIOError, OSError):
                data = b""
            if self.signals.SIGINT in data:
                self.pending_at = self.clock()
        return self.pending_at

    def instead_if_pending(self, error: BaseException) -> BaseException:
        """``KeyboardInterrupt`` with ``error``'s text when SIGINT is pending here (taken in), else ``error``.

        A rank that was interrupted too (``cluster.interrupt()``, the Stop button) stops as
        interrupted, whichever rank's wait gave up first.
        """
        if self.pending_since() is None:
            return error
        self.consume()
        return KeyboardInterrupt(str(error))

    def consume(self) -> None:
        """Forget a pending SIGINT: a vote or an ended wait has taken it in."""
        self.pending_at = None


#: This process's.
PENDING = Interrupts(PROCESS.monotonic, PROCESS.signals)


class StopFlag:
    """Context manager that turns SIGINT into a flag for the duration of a collective loop.

    Local: it installs a handler in this process only; the collective decision is the caller's
    reduction of :attr:`value` (``max`` over ranks, or ``sum`` and test ``> 0``). A second Ctrl-C
    while the flag is already set raises ``KeyboardInterrupt`` at once, as an escape hatch.
    Outside the main thread (where Python cannot install signal handlers) the flag never sets.

    Examples
    --------
    >>> with StopFlag() as stop:
    ...     for it in range(max_iter):
    ...         sums, counts, stop_votes = mpinb.allreduce([s, c, stop.value])
    ...         if stop_votes:
    ...             stop.raise_interrupt(f"k-means stopped at iteration {it}")
    """

    def __init__(self) -> None:
        self._interrupts = PENDING
        self._signals = PENDING.signals
        self._set = False
        self._previous: object = None
        self._installed = False
        self._depth = 0  # re-entrant: an outer ``with`` can cover set-up, an inner one the loop

    @property
    def requested(self) -> bool:
        """Whether SIGINT arrived on this rank."""
        return self._set

    @property
    def value(self) -> float:
        """1.0 once SIGINT arrived on this rank, else 0.0: ready to pack into a float reduction."""
        return 1.0 if self._set else 0.0

    def request(self) -> None:
        """Set the flag by hand (tests, or a callback that wants a collective stop)."""
        self._set = True

    def raise_interrupt(self, where: str) -> None:
        """Raise the ``KeyboardInterrupt`` every rank raises after a collective stop."""
        raise KeyboardInterrupt(f"{where}: interrupted (Ctrl-C); every rank stopped at the same point.")

    def __enter__(self) -> StopFlag:
        self._depth += 1
        if self._depth == 1 and threading.current_thread() is threading.main_thread():
            self._previous = self._signals.getsignal(self._signals.SIGINT)
            self._signals.signal(self._signals.SIGINT, self._handle)
            self._installed = True
            self._open_wakeup()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._depth -= 1
        if self._depth == 0 and self._installed:
            self._signals.signal(self._signals.SIGINT, self._previous)
            self._installed = False
            self._close_wakeup()
            self._interrupts.consume()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._set:
            raise KeyboardInterrupt("second Ctrl-C: stopping this rank at once")
        self._set = True
        self._interrupts.note()

    def _open_wakeup(self) -> None:
        read, write = os.pipe()
        os.set_blocking(read, False)
        os.set_blocking(write, False)
        try:
            self._old_wakeup = self._signals.set_wakeup_fd(write, warn_on_full_buffer=False)
        except (ValueError, OSError):
            os.close(read)
            os.close(write)
            return
        self._pipe: tuple[int, int] | None = (read, write)
        self._interrupts.wakeup = read

    def _close_wakeup(self) -> None:
        pipe = getattr(self, "_pipe", None)
        if pipe is None:
            return
        self._signals.set_wakeup_fd(self._old_wakeup)
        self._interrupts.wakeup, self._pipe = None, None
        for fd in pipe:
            os.close(fd)

