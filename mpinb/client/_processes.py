"""Ending processes by PID, with their descendants: the one way the client side does it."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable, Sequence

__all__ = ["descendants", "end", "kill"]


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children, grandchildren, ...), or ``[]``."""
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def kill(pid: int) -> None:
    """SIGKILL ``pid`` if it still exists."""
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def end(pids: Sequence[int], grace: float, *, terminate: bool = False) -> None:
    """Wait up to ``grace`` seconds for ``pids`` to exit (after SIGTERM when ``terminate``), then
    SIGKILL what is left."""
    import psutil

    procs = _processes(pids)
    if terminate:
        for proc in procs:
            try:
                proc.terminate()
            except psutil.Error:
                pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=2.0)


def _processes(pids: Iterable[int]) -> list:
    import psutil

    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.Error:
            pass
    return procs
