"""The order in which this machine's engine processes end, as the kernel tells it.

Client. When one rank dies, MPI's launcher kills the others a moment later, and each engine's
nanny logs its engine's end; but the nannies are separate processes, and on a loaded host the
nanny of a rank that MPI killed can log before the nanny of the rank that died first (CI: a
SIGKILLed rank 1 was reported as rank 0). A pidfd becomes readable the moment its process has
ended, so one thread blocked in ``poll`` on every engine's pidfd sees the first death alone:
the others end only after the launcher noticed it, sent its signals and the kernel tore down
their memory. A wake-up that finds several ended at once proves nothing, and says so (None).
Nor does an end that another follows within :data:`TOGETHER` seconds: the launcher learns of a
death when the dying process closes its files, a moment before the kernel calls it ended, and on a
loaded host that moment stretched until a rank the launcher killed had ended first (CI: a
SIGKILLed rank 1 reported as rank 0, the pidfds' order inverted). Such ends count as together.

Linux only (``os.pidfd_open``); elsewhere, and for engines on other hosts, nothing is known and
:func:`mpinb.client._health.deaths` falls back on the nannies' order.
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Iterable

__all__ = ["TOGETHER", "ExitOrder"]

TOGETHER = 0.25  # seconds within which ends are not told apart (see the module's docstring)


class ExitOrder:
    """Watch PIDs of this host; :meth:`first` is the one that ended alone before any other."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fds: dict[int, int] = {}  # pidfd -> pid
        self._rounds: list[tuple[float, set[int]]] = []  # when, and which PIDs found ended, at each wake-up
        self._wake_r, self._wake_w = os.pipe()
        self._closed = False
        self._thread: threading.Thread | None = None

    def watch(self, pids: Iterable[int]) -> None:
        """Watch ``pids`` too (processes of this host; one already gone is skipped)."""
        opened = {}
        for pid in pids:
            try:
                opened[os.pidfd_open(pid)] = pid
            except (AttributeError, OSError):  # no pidfds here, or the process has ended already
                continue
        if not opened:
            return
        with self._lock:
            if self._closed:
                for fd in opened:
                    os.close(fd)
                return
            self._fds.update(opened)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="mpinb-exit-order", daemon=True)
                self._thread.start()
        os.write(self._wake_w, b"w")

    def first(self, pids: Iterable[int]) -> int | None:
        """The one of ``pids`` that ended first and alone; None if none ended, or several at once."""
        mine = self._first_round(pids)
        return next(iter(mine)) if len(mine) == 1 else None

    def together(self, pids: Iterable[int]) -> set[int]:
        """The ones of ``pids`` found ended at the first wake-up that found any, when they were
        several (the order among them is unknown); empty otherwise."""
        mine = self._first_round(pids)
        return mine if len(mine) > 1 else set()

    def _first_round(self, pids: Iterable[int]) -> set[int]:
        """Those of ``pids`` found ended in the first wake-up that found any, and within
        :data:`TOGETHER` seconds after it. When the thread has not run since they ended (a loaded
        host), a look now is one more wake-up: what is ended at this moment, alone or together, is
        as true as what the thread would have seen later. Asked sooner than :data:`TOGETHER` after
        the first end, it waits out the rest of that time and looks again."""
        wanted = set(pids)
        first = self._first_time(wanted)
        if first is None:
            return set()
        wait = first + TOGETHER - time.monotonic()
        if wait > 0:
            time.sleep(wait)
            self._look_now(wanted, at=first + TOGETHER)  # ended by now: within the window, as far as known
        with self._lock:
            return {pid for at, ended in self._rounds if at <= first + TOGETHER for pid in ended & wanted}

    def _first_time(self, wanted: set[int]) -> float | None:
        with self._lock:
            for at, ended in self._rounds:
                if ended & wanted:
                    return at
        return self._look_now(wanted)

    def _look_now(self, wanted: set[int], at: float | None = None) -> float | None:
        """Record which of ``wanted`` still watched have ended by now (as of ``at``, default now);
        return that time, or None if none has."""
        with self._lock:
            mine = {fd: pid for fd, pid in self._fds.items() if pid in wanted}
            recorded = {pid for _, ended in self._rounds for pid in ended}
            if not mine:
                return None
            poller = select.poll()
            for fd in mine:
                poller.register(fd, select.POLLIN)
            ended = {mine[fd] for fd, _ in poller.poll(0)} - recorded
            if not ended:  # the thread, when it runs, finds the same fds ready and records them after
                return None
            when = time.monotonic() if at is None else at
            self._rounds.append((when, ended))
            return when

    def close(self) -> None:
        """Stop watching; the thread ends and every descriptor is closed."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        os.write(self._wake_w, b"q")
        if thread is not None:
            thread.join(timeout=5)
        with self._lock:
            for fd in self._fds:
                os.close(fd)
            self._fds.clear()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _run(self) -> None:
        while True:
            poller = select.poll()
            poller.register(self._wake_r, select.POLLIN)
            with self._lock:
                for fd in self._fds:
                    poller.register(fd, select.POLLIN)
            events = poller.poll()  # only what has ended by now: nothing of Python runs in between
            with self._lock:
                ended = {self._fds.pop(fd) for fd, _ in events if fd in self._fds}
                for fd, _ in events:
                    if fd != self._wake_r and fd not in self._fds:
                        os.close(fd)
                ended -= {pid for _, seen in self._rounds for pid in seen}  # a look now found them first
                if ended:
                    self._rounds.append((time.monotonic(), ended))
                if any(fd == self._wake_r for fd, _ in events):
                    if os.read(self._wake_r, 64).endswith(b"q") or self._closed:
                        return
