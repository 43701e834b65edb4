"""Ending a cluster whose notebook is gone, however it went (SIGKILL, an OOM kill, a timeout).

Client. An ``atexit`` hook never runs when the kernel is killed, so :class:`MPICluster` starts this
small process beside the cluster it owns. The watchdog holds the read end of a pipe whose only
write end is in the owner; it reads the PIDs to watch from it (the controller, ``mpiexec``, the
engines, again after a restart). When the owner says ``stop`` (a clean :meth:`MPICluster.stop`),
the watchdog just exits. When the pipe ends without ``stop``, or the owner's PID is gone (a forked
child of the owner could keep the pipe open), the owner has died: the watchdog sends SIGTERM to
every watched process, its descendants and the members of the sessions they lead, SIGKILL two
seconds later to what is left, removes the files those processes leave when killed (MPI's shared
memory, the launcher's and engines' temporary files, the cluster's files in its profile), runs the
commands it was given for that case (``scancel`` of a Slurm job whose engines run on other nodes,
where no PID of this machine reaches them), and exits. It runs in its own session, so a signal to
the kernel's process group does not reach it.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from collections.abc import Iterable

__all__ = ["Watchdog"]

_POLL = 0.5  # seconds between looks at the owner's PID while the pipe is quiet
_GRACE = 2.0  # seconds between SIGTERM and SIGKILL


class Watchdog:
    """The owner's side: start the watchdog, tell it what to watch, release it on a clean stop."""

    def __init__(self) -> None:
        read, write = os.pipe()  # not inheritable: processes started later do not hold it
        self._write: int | None = write
        try:
            self.process = subprocess.Popen(
                # Not ``-m mpinb.client._watchdog``: runpy would warn that the package (which imports
                # this module) loaded it before running it as __main__ -- on every cluster start.
                [sys.executable, "-c", "import sys; from mpinb.client._watchdog import main; main(int(sys.argv[1]))",
                 str(os.getpid())],
                stdin=read, stdout=subprocess.DEVNULL, start_new_session=True,
            )
        finally:
            os.close(read)

    def watch(self, pids: Iterable[int]) -> None:
        """Add ``pids`` (and, when it acts, their descendants) to what the watchdog ends."""
        line = " ".join(str(int(p)) for p in pids if p)
        if line and self._write is not None:
            os.write(self._write, f"watch {line}\n".encode())

    def on_death(self, command: list[str]) -> None:
        """Run ``command`` too when the owner dies (after ending the watched processes); the last given counts."""
        if command and self._write is not None:
            os.write(self._write, f"run {json.dumps(command)}\n".encode())

    def remove_on_death(self, paths: Iterable[str]) -> None:
        """Files and folders the cluster leaves when its processes are killed (MPI's shared memory,
        the launcher's and the engines' temporary files): removed after the processes end."""
        paths = [p for p in paths if p]
        if paths and self._write is not None:
            os.write(self._write, f"remove {json.dumps(paths)}\n".encode())

    def release(self) -> None:
        """The owner stopped the cluster itself: the watchdog exits without touching anything."""
        if self._write is None:
            return
        try:
            os.write(self._write, b"stop\n")
        except OSError:
            pass
        os.close(self._write)
        self._write = None
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def main(owner: int) -> None:
    from mpinb.client._processes import alive, descendants, end, remove_files, session_members

    watched: set[int] = set()
    leftovers: set[str] = set()
    command: list[str] = []
    buffered = b""
    while True:
        ready, _, _ = select.select([0], [], [], _POLL)
        if ready:
            chunk = os.read(0, 4096)
            if not chunk:
                break  # the write end is closed: the owner is gone (or released us: see below)
            buffered += chunk
            *lines, buffered = buffered.split(b"\n")
            for line in lines:
                words = line.decode().split()
                if words[:1] == ["stop"]:
                    return
                if words[:1] == ["watch"]:
                    watched.update(int(w) for w in words[1:])
                if words[:1] == ["run"]:
                    command = json.loads(line.decode().split(" ", 1)[1])
                if words[:1] == ["remove"]:
                    leftovers.update(json.loads(line.decode().split(" ", 1)[1]))
        elif not alive(owner):
            break
    trees = set(watched)
    for pid in watched:
        trees.update(descendants(pid))
    # What a killed watched process left: its children, reparented, are no one's descendants any
    # more, but keep the session it made (the controller's schedulers, when it died first).
    trees.update(session_members(watched))
    trees.discard(os.getpid())
    end(sorted(trees), grace=_GRACE, terminate=True)
    remove_files(sorted(leftovers))
    if command:
        try:
            subprocess.run(command, check=False, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            pass  # nobody is left to tell (scancel missing, slurmctld gone): the job's time limit ends it

