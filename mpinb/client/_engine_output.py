"""What ``mpiexec`` and the engines under it print, relayed by the client: never blocking the ranks,
written to the log file when the disk allows, and each rank's last words kept for its death report.

Client. ipyparallel hands ``mpiexec`` its log file as stdout: then a full disk makes Hydra's write
of a rank's stderr fail, and Hydra ends the job (every rank died at the first 60-byte ``os.write(2,
...)`` of a cell on a full ``IPYTHONDIR``). Here ``mpiexec`` writes into a pipe instead. One thread
reads it as fast as it fills, another appends what was read to the log file: a write the disk
refuses (``ENOSPC``, a quota, an I/O error) drops those bytes, counts them, and leaves a note in the
file once space is back; a disk that stalls drops output beyond :data:`_PENDING` instead of making
the ranks wait. ``mpiexec -prepend-rank`` (Hydra) tags each line with its rank, so the reader keeps
each rank's last lines of stderr in memory, and a rank's death report can quote them even when the
disk kept nothing (:meth:`EngineOutput.last_words`).
"""

from __future__ import annotations

import os
import re
import select
import threading
import time
from collections import deque
from typing import Any

from ipyparallel.cluster.launcher import MPIEngineSetLauncher

__all__ = ["EngineOutput", "RelayedMPIEngineSetLauncher", "disk_usage", "fatal_signals_to_launcher", "grab_fd"]

_READ = 1 << 16  # bytes per read of the pipe
_PIPE = 1 << 20  # bytes the pipe holds
_PENDING = 8 << 20  # bytes read but not yet written beyond which new output is dropped (a stalled disk)
_RECENT = 256 << 10  # bytes of the latest output kept in memory (the nannies' and mpiexec's death reports)
_WORDS = 6  # a rank's last lines of its own stderr kept (before a fatal signal's stack dump)
_LINE = 240  # characters of one quoted line
_SYS_PIDFD_GETFD = 438  # the same number on every Linux architecture
_NOTE_EVERY = 60.0  # seconds between two notes of output still being dropped

# ipyparallel's own log lines ("2026-12-07 13:21:24.158 [KernelNanny.2] ...", "[IPEngine.0.0]"): not
# what the rank's program said.
_IPP_LOG = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ \[[A-Za-z]+[.\]\d]")
_RANK_LINE = re.compile(rb"^\[(\d+)\] ?(.*)$")
# Python's faulthandler (PYTHONFAULTHANDLER=1 in the engines) names the fatal signal before its dump.
_FATAL = re.compile(r"^Fatal Python error: (Segmentation fault|Aborted|Bus error|Floating-point exception|"
                    r"Illegal instruction)")
# The other lines of faulthandler's dump (threads, frames, the extension modules loaded).
_DUMP = re.compile(r"^(\s*$|\s+File \"|\s+<no Python frame>|\s+\.\.\.|\s+Binary file|(Current thread|Thread) 0x|"
                   r"Stack \(most recent|Extension modules:|Current thread's C stack|Python runtime state)")
FATAL_SIGNALS = {"Segmentation fault": "SIGSEGV", "Aborted": "SIGABRT", "Bus error": "SIGBUS",
                 "Floating-point exception": "SIGFPE", "Illegal instruction": "SIGILL"}


class RelayedMPIEngineSetLauncher(MPIEngineSetLauncher):
    """ipyparallel's ``mpiexec`` engine launcher, with ``mpiexec``'s output relayed (:class:`EngineOutput`)."""

    relay: EngineOutput | None = None

    def start(self, n: int) -> Any:
        real = str(self.output_file)  # type: ignore[has-type]  # an untyped trait
        relay = EngineOutput(real)
        # ipyparallel opens ``output_file`` and hands that file to mpiexec as stdout and stderr:
        # pointed for that moment at the pipe's write end, it hands mpiexec the pipe.
        self.output_file = f"/dev/fd/{relay.write_end}"
        try:
            started = super().start(n)
        except BaseException:
            relay.close()
            raise
        finally:
            self.output_file = real
            relay.detach()  # mpiexec holds the write end now: EOF when it (and all it started) ended
        self.relay = relay
        return started


class EngineOutput:
    """A pipe for ``mpiexec``'s output, drained at once into ``path`` (when the disk allows) and into memory."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._read_end, self.write_end = os.pipe()
        try:  # room for a burst while this process is busy elsewhere (Linux: up to 1 MiB unprivileged)
            import fcntl

            fcntl.fcntl(self.write_end, getattr(fcntl, "F_SETPIPE_SZ", 1031), _PIPE)
        except (ImportError, OSError):
            pass
        self._lock = threading.Condition()
        self._pending = bytearray()
        self._recent: deque[bytes] = deque()
        self._recent_size = 0
        self._partial = b""
        self._words: dict[int, deque[str]] = {}
        self._fatal: dict[int, str] = {}  # rank -> signal name its faulthandler reported
        self._where: dict[int, str] = {}  # rank -> the innermost frame of its current thread then
        self._dump: dict[int, str] = {}  # rank -> where in faulthandler's dump its lines are now
        self._unread: dict[int, tuple[int, int]] = {}  # rank -> (engine pid, our copy of its stderr pipe)
        self._late: dict[int, list[str]] = {}  # rank -> what its stderr pipe held when it died
        self._ended = False
        self.dropped = 0  # bytes never written to ``path``
        self._noted = 0  # bytes dropped that the note in the file or to the user already counted
        self._told_at = 0.0
        self._told = 0
        self._why = ""
        self._file: int | None = None
        self._closing = False
        self._open()
        self._threads = [threading.Thread(target=self._read, name="mpinb-engine-output-read", daemon=True),
                         threading.Thread(target=self._write, name="mpinb-engine-output-write", daemon=True)]
        for thread in self._threads:
            thread.start()

    # -- what the client asks ------------------------------------------------------------------

    def recent(self) -> str:
        """The latest output (up to :data:`_RECENT` bytes), as text."""
        with self._lock:
            return b"".join(self._recent).decode(errors="replace")

    def keep_unread(self, rank: int, pid: int, pipe: int) -> None:
        """Hold a copy of the read end of ``rank``'s stderr pipe (``pipe``, this process's copy; see
        :func:`fatal_signals_to_launcher`), read only once engine ``pid`` has died.

        The engine's own thread forwards that pipe, and needs Python's lock to do it: a native
        abort in a thread that holds it (or one faster than that thread) dies with its last message
        still in the pipe. A copy held here keeps the pipe, and that message, after the death.
        """
        with self._lock:
            old = self._unread.pop(rank, None)
            self._unread[rank] = (pid, pipe)
        if old is not None:
            os.close(old[1])

    def last_words(self, rank: int) -> tuple[str | None, list[str]]:
        """The fatal signal ``rank``'s Python reported (``"SIGABRT"``, or None), and the last lines
        of its own stderr before that: trimmed, ipyparallel's log lines left out, the frame it was
        in last."""
        with self._lock:
            late = self._leftover(rank)
            words = [*self._words.get(rank, ()), *late][-_WORDS:]
            fatal, where = self._fatal.get(rank), self._where.get(rank)
        lines = [_trim(line) for line in words if line.strip()]
        if fatal is not None:
            lines.append(f"Fatal Python error: {fatal}" + (f" ({_frame(where)})" if where else ""))
        return (FATAL_SIGNALS.get(fatal) if fatal else None), lines

    def news(self) -> str | None:
        """A note for the user when output was dropped since the last note (at most one a
        minute while it goes on), else None."""
        with self._lock:
            if self.dropped <= self._told or (self._told and time.monotonic() - self._told_at < _NOTE_EVERY):
                return None
            self._told, self._told_at = self.dropped, time.monotonic()
            dropped, why = self.dropped, self._why
        return (f"{_size(dropped)} of the engines' output could not be written to {self.path} ({why}; "
                f"{disk_usage(self.path)}). The ranks go on, and what they print still reaches the notebook; "
                "free space there, or set IPYTHONDIR to a roomier place before starting the next cluster.")

    def detach(self) -> None:
        """Close this process's write end (once ``mpiexec`` holds its own)."""
        with self._lock:
            fd, self.write_end = self.write_end, -1
        if fd >= 0:
            os.close(fd)

    def close(self, timeout: float = 5.0) -> None:
        """Wait (up to ``timeout`` s) for the output to end, stop both threads, close the file."""
        self.detach()
        self._closing = True  # the file may be removed now: never create it again
        for thread in self._threads:
            thread.join(timeout)
        with self._lock:
            self._ended = True
            self._lock.notify_all()
        self._threads[1].join(timeout)
        with self._lock:
            if self._file is not None:
                os.close(self._file)
                self._file = None
            for _, pipe in self._unread.values():
                os.close(pipe)
            self._unread.clear()

    # -- the two threads -------------------------------------------------------------------------

    def _read(self) -> None:
        try:
            while chunk := os.read(self._read_end, _READ):
                with self._lock:
                    if len(self._pending) < _PENDING:
                        self._pending += chunk
                        self._lock.notify_all()
                    else:  # the disk does not keep up: never make the ranks wait for it
                        self._drop(len(chunk), "the disk did not keep up")
                    self._remember(chunk)
        except OSError:
            pass
        finally:
            os.close(self._read_end)
            with self._lock:
                self._ended = True
                self._lock.notify_all()

    def _write(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._ended:
                    self._lock.wait()
                if not self._pending:
                    return
                data, self._pending = bytes(self._pending), bytearray()
                owed = self.dropped
                note = self._note(owed)
            written, err = self._put(note + data)
            with self._lock:
                if written >= len(note):  # the note made it: what it counts is told
                    self._noted = owed
                if err is not None:
                    self._drop(min(len(note) + len(data) - written, len(data)), err)

    def _put(self, data: bytes) -> tuple[int, str | None]:
        """Write ``data`` to the file: how many bytes made it, and why the rest did not (None: all did)."""
        view, written = memoryview(data), 0
        try:
            if self._file is None and not self._closing:
                self._open()
            if self._file is None:
                return 0, "the log file could not be opened"
            while written < len(data):
                written += os.write(self._file, view[written:])
        except OSError as err:
            return written, err.strerror or str(err)
        return written, None

    def _open(self) -> None:
        try:
            self._file = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError:
            self._file = None

    # -- helpers, under the lock -----------------------------------------------------------------

    def _leftover(self, rank: int) -> list[str]:
        """What ``rank``'s stderr pipe still held when its engine died (read once, after the death:
        while it lives, its own thread reads the pipe)."""
        if rank in self._late or rank not in self._unread:
            return self._late.get(rank, [])
        pid, pipe = self._unread[rank]
        if _alive(pid):
            return []
        del self._unread[rank]
        data = b""
        try:
            # Only what is there: a child of the engine may still hold the write end (no EOF).
            while len(data) < _READ and select.select([pipe], [], [], 0)[0] and (chunk := os.read(pipe, _READ)):
                data += chunk
        except OSError:
            pass
        finally:
            os.close(pipe)
        text = data.decode(errors="replace").splitlines()
        self._late[rank] = [line for line in text if not _IPP_LOG.match(line) and not _FATAL.match(line)
                            and not _DUMP.match(line)]
        return self._late[rank]

    def _drop(self, size: int, why: str) -> None:
        self.dropped += size
        self._why = why

    def _note(self, owed: int) -> bytes:
        if self._noted >= owed:
            return b""
        return (f"[mpinb: {_size(owed - self._noted)} of this output were dropped here ({self._why}); "
                "the ranks went on]\n").encode()

    def _remember(self, chunk: bytes) -> None:
        self._recent.append(chunk)
        self._recent_size += len(chunk)
        while self._recent_size > _RECENT and len(self._recent) > 1:
            self._recent_size -= len(self._recent.popleft())
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        if len(self._partial) > _READ:  # no newline in sight: keep the start of it only
            self._partial = self._partial[:_READ]
        for raw in lines:
            m = _RANK_LINE.match(raw)
            if m is not None:
                # Hydra tags what it reads at once, not each line: a line written in pieces (as
                # faulthandler writes) carries its rank's tag again where a piece began.
                line = m[2].replace(b"[" + m[1] + b"] ", b"")
                self._said(int(m[1]), line.decode(errors="replace").rstrip("\r"))

    def _said(self, rank: int, line: str) -> None:
        """One line of ``rank``'s own output: its last words, or part of its faulthandler dump."""
        state = self._dump.get(rank)
        if state is None and (m := _FATAL.match(line)) is not None:
            self._fatal[rank], self._dump[rank] = m[1], "dump"
        elif state == "dump" and line.startswith("Current thread"):
            self._dump[rank] = "current"
        elif state == "current" and line.strip().startswith("File "):
            self._where[rank], self._dump[rank] = line, "done"
        elif _IPP_LOG.match(line):
            if state is None and "[IPEngine" in line:
                # The engine logs each request it takes (and its start-up, with multi-line
                # records): what the rank printed before belongs to earlier work.
                self._words.pop(rank, None)
        elif state is None or not _DUMP.match(line):
            # Also during the dump: the engine's own thread forwards what was written to its
            # stderr just before the signal (a native library's last message) while the dump runs.
            self._words.setdefault(rank, deque(maxlen=_WORDS)).append(line)


def fatal_signals_to_launcher() -> tuple[int, int] | None:
    """On an engine: faulthandler's report of a fatal signal goes straight to the launcher's pipe.

    Local (run on each engine by ``MPICluster``). ipykernel points the engine's file descriptor 2 at
    a pipe that a thread of the engine forwards (to the notebook, and to the launcher): a report
    written there as the process dies is never forwarded. ``PYTHONFAULTHANDLER`` enabled it on
    descriptor 2 before that; here it moves to the launcher's own descriptor, which ipykernel kept.
    Returns this process's id and the read end of that pipe (see :meth:`EngineOutput.keep_unread`).
    """
    import faulthandler
    import os
    import sys

    fd = getattr(sys.stderr, "_original_stdstream_copy", None)
    if not isinstance(fd, int):
        return None
    faulthandler.enable(file=fd, all_threads=True)
    pipe = getattr(sys.stderr, "_fid", None)
    return (os.getpid(), pipe) if isinstance(pipe, int) else None


def grab_fd(pid: int, fd: int) -> int | None:
    """A copy of process ``pid``'s descriptor ``fd`` in this process (Linux's ``pidfd_getfd``, 5.6 and
    later, on a process this one may trace: its own descendants), or None."""
    import ctypes

    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        got = libc.syscall(_SYS_PIDFD_GETFD, pidfd, fd, 0)
    except (OSError, AttributeError):
        return None
    finally:
        os.close(pidfd)
    # Never made non-blocking: the flag belongs to the pipe's open file, which the engine's own
    # reader shares (it stopped reading, and the engine's stderr filled up, when it was).
    return int(got) if got >= 0 else None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def disk_usage(path: str) -> str:
    """How full the filesystem under ``path`` is, and where it is mounted: "the filesystem at /x is
    100% full: 2.0 MiB used of 2.0 MiB, 0 B free"."""
    folder = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(folder) and folder != os.path.dirname(folder):
        folder = os.path.dirname(folder)
    try:
        st = os.statvfs(folder)
    except OSError:
        return f"the filesystem under {folder} could not be asked how full it is"
    mount = _mount_point(folder)
    total, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    used = total - st.f_bfree * st.f_frsize
    percent = 100.0 * used / total if total else 100.0
    return (f"the filesystem at {mount} is {percent:.0f}% full: {_size(used)} used of {_size(total)}, "
            f"{_size(free)} free")


def _mount_point(folder: str) -> str:
    try:
        dev = os.stat(folder).st_dev
        while folder != os.path.dirname(folder) and os.stat(os.path.dirname(folder)).st_dev == dev:
            folder = os.path.dirname(folder)
    except OSError:
        pass
    return folder


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


_CELL_FRAME = re.compile(r'File "[^"]*ipykernel_\d+[/\\]\d+\.py", line (\d+)')


def _frame(line: str) -> str:
    """faulthandler's innermost frame, as "at line 5 of its cell" when it is a cell's."""
    m = _CELL_FRAME.search(line)
    return f"at line {m[1]} of its cell" if m else _trim(line)


def _trim(line: str) -> str:
    line = line.strip()
    return line if len(line) <= _LINE else line[: _LINE - 3] + "..."
