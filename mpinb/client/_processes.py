"""Ending processes by PID, with their descendants: the one way the client side does it."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable, Sequence

__all__ = ["descendants", "end", "kill", "remove_files", "shared_memory_of"]


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


def shared_memory_of(pids: Iterable[int]) -> set[str]:
    """The files under ``/dev/shm`` that processes ``pids`` map (MPI's shared-memory segments):
    what a killed MPI world leaves behind, and only that world's."""
    found: set[str] = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as maps:
                for line in maps:
                    path = line.rstrip("\n").split(maxsplit=5)[-1]
                    if path.startswith("/dev/shm/") and not path.startswith("/dev/shm/mpinb-"):
                        found.add(path.removesuffix(" (deleted)"))
        except (OSError, IndexError):
            continue
    return found


def remove_files(paths: Iterable[str]) -> None:
    """Unlink each of ``paths`` that still exists."""
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass
