"""Ending processes, the one way the client side does it: by PID with their descendants (:func:`end`,
:func:`kill`), or a child started in a session of its own with its whole group (:func:`finish`)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterable, Sequence

__all__ = ["descendants", "end", "finish", "kill", "remove_files", "send", "session_members", "shared_memory_of"]

_DRAIN = 5.0  # seconds to read what a killed group still wrote


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children, grandchildren, ...), or ``[]``."""
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def session_members(sessions: Iterable[int]) -> list[int]:
    """Every live process of this user whose session id is one of ``sessions``.

    ipyparallel starts the controller and ``mpiexec`` each in a session of its own, and everything
    they start stays in it unless it calls ``setsid`` itself: a child whose parent was killed is
    reparented (to PID 1), so it is no descendant of anything any more, but it keeps its session.
    A session id is the PID of the process that made it, and Linux reuses that PID only once no
    process is left in the session, so a session that still has members is the one recorded.
    """
    wanted = {int(s) for s in sessions if s}
    uid, found = os.getuid(), list[int]()
    if not wanted:
        return found
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != uid:
                continue
            with open(f"/proc/{name}/stat") as fh:
                state, _ppid, _pgrp, session = fh.read().rsplit(")", 1)[1].split()[:4]
        except (OSError, ValueError):
            continue
        if int(session) in wanted and state != "Z":
            found.append(int(name))
    return sorted(found)


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (``True`` where another user's process
    hides it: it exists)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is gone too: it only waits for its parent to collect its status
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def kill(pid: int) -> None:
    """SIGKILL ``pid`` if it still exists."""
    send(pid, signal.SIGKILL)


def send(pid: int, signum: int) -> None:
    """Send ``signum`` to ``pid`` if it still exists."""
    try:
        os.kill(pid, signum)
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


def finish(proc: subprocess.Popen[str], timeout: float | None) -> tuple[str, int | None]:
    """``proc``'s output and exit status; after ``timeout`` seconds, or when the wait itself is
    interrupted (Ctrl-C), SIGKILL its whole process group first.

    ``proc`` must have been started with ``start_new_session=True``, so that its group holds
    everything it started (``mpiexec``'s proxies and ranks, ``ssh``) and nothing else. Returns status
    ``None`` after a timeout, with what it wrote until then; re-raises an interruption after the kill.
    """
    try:
        out, _ = proc.communicate(timeout=timeout)
        return out or "", proc.returncode  # no output captured: nothing to quote
    except subprocess.TimeoutExpired:
        return _kill_group(proc), None
    except BaseException:
        _kill_group(proc)
        raise


def _kill_group(proc: subprocess.Popen[str]) -> str:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        out, _ = proc.communicate(timeout=_DRAIN)
    except subprocess.TimeoutExpired:  # a grandchild outside the group still holds the pipe
        out = ""
        if proc.stdout is not None:
            proc.stdout.close()
        proc.wait()
    return out or ""


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


def launcher_files_of(pids: Iterable[int]) -> set[str]:
    """The temporary files the MPI launcher's proxies (the parents of ``pids``) hold open:
    Hydra's ``/tmp/hydra_hwloc_xmlfile_*``, which it removes only when it exits cleanly."""
    found: set[str] = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                parent = int(fh.read().rsplit(")", 1)[1].split()[1])
            folder = f"/proc/{parent}/fd"
            for fd in os.listdir(folder):
                target = os.readlink(f"{folder}/{fd}")
                if os.path.basename(target).startswith("hydra_hwloc_xmlfile_"):
                    found.add(target)
        except (OSError, IndexError, ValueError):
            continue
    return found


def remove_files(paths: Iterable[str]) -> None:
    """Remove each of ``paths`` that still exists (a folder with what it holds); a path with ``*``
    stands for every path it matches then."""
    import glob
    import shutil

    expanded = []
    for path in paths:
        expanded.extend(glob.glob(glob.escape(os.path.dirname(path)) + "/" + os.path.basename(path))
                        if "*" in os.path.basename(path) else [path])
    for path in expanded:
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)
        except OSError:
            pass
