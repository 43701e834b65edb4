"""Cooperative interrupts: Ctrl-C stops every rank at the same iteration instead of one rank only.

A SIGINT that reaches only some ranks (or reaches them at different moments) would leave the others
blocked in the next collective. Inside :class:`StopFlag`, SIGINT only sets a flag; the long loop
folds ``flag.value`` into the reduction it already does each iteration/epoch, and every rank leaves
the loop when the *reduced* flag is set, then raises ``KeyboardInterrupt`` together.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType

__all__ = ["StopFlag"]


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
            self._previous = signal.getsignal(signal.SIGINT)
            signal.signal(signal.SIGINT, self._handle)
            self._installed = True
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._depth -= 1
        if self._depth == 0 and self._installed:
            signal.signal(signal.SIGINT, self._previous)  # type: ignore[arg-type]
            self._installed = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._set:
            raise KeyboardInterrupt("second Ctrl-C: stopping this rank at once")
        self._set = True
