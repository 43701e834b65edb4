"""The status board: every rank's last mpinb collective and cell, readable by the ranks on its host.

Each rank owns one row in a small file it maps into memory (in ``/dev/shm`` where there is one).
Writing the row is a few plain stores, so every collective records itself at no communication
cost; a rank that gives up waiting reads the rows of the ranks on its host, so it can say where a
missing rank is even while that rank computes, sleeps or is blocked elsewhere. The files are
unlinked once every rank has opened its neighbours' (the mappings outlive the names), so nothing
is left behind however a process ends. No MPI here: the collective layer exchanges the paths.

Beside each row, a *where* file: a rank asked where it is (``ask_where``) receives ``SIGUSR2`` and
Python's ``faulthandler`` writes its threads' stacks there from the signal handler itself, so the
answer comes even while the rank computes in C code, sleeps or is blocked in its own MPI call.

``/dev/shm`` is shared by every account on the machine, so no file here has a name another account
can know before it exists: each is created under a random name with ``O_EXCL | O_NOFOLLOW`` (a
planted symlink, file or FIFO makes the creation fail, never redirects it), the where file's name
travels in its owner's row, and a rank opens another's file only if it is a regular file of its
own account that nobody else may read (:func:`_open_own`).
"""

from __future__ import annotations

import faulthandler
import fcntl
import mmap
import os
import re
import tempfile
import threading
import uuid
from stat import S_ISREG
from typing import Any

import numpy as np

from mpinb import _frames
from mpinb._collective.runtime import PROCESS, Runtime

__all__ = ["Board", "CellRecord", "Row"]

_ROW = 64  # words of one rank's row
_WORDS = 80  # this rank's row; in the host leader's file, 16 more words the host shares
_HOST_REVOKED = 64  # 1 + the newest generation some rank on this host gave up on
_GEN, _INDEX, _ENTERED, _LEFT, _PHASE, _OUTCOME, _PID, _CELL = range(8)
_NAME = slice(8, 16)  # 64 bytes of UTF-8
# The cell: the one running (or the last, if none runs), and the last one that ended, with where
# this rank's collectives were then (generation, operations begun) and how it ended.
_CELL_RUNNING, _ENDED_CELL, _ENDED_GEN, _ENDED_INDEX, _ENDED_NS = range(16, 21)
_MAIN_THREAD, _STARTED = 21, 22  # the main thread's ident, and when the process started (clock ticks)
_WHERE_NAME = slice(23, 25)  # the 16 random bytes that name this process's where file (0: none)
_ENDED_TEXT = slice(25, 64)  # 312 bytes of UTF-8: "raised ZeroDivisionError: division by zero"
_TEXT_BYTES = (_ENDED_TEXT.stop - _ENDED_TEXT.start) * 8

# Phases of an operation, and how it ended: the protocol table's (:mod:`.protocol`).
from mpinb._collective.protocol import (  # noqa: E402 - after the layout constants they sit beside
    ABANDONED,
    ARRIVING,
    DONE,
    FAILED,
    IDLE,
    MOVING,
    SWITCHING,
    TIMED_OUT,
    Outcome,
    Phase,
)

# What a row's words say, by the code the board stores (:attr:`Phase.code`, :attr:`Outcome.code`).
_PHASES = {ARRIVING.code: "waiting for the others to arrive", MOVING.code: "moving data",
           SWITCHING.code: "moving to a fresh communicator"}
_OUTCOMES = {DONE.code: "left", FAILED.code: "raised", TIMED_OUT.code: "timed out", ABANDONED.code: "gave up"}


class Row:
    """A snapshot of one rank's record."""

    __slots__ = ("gen", "index", "name", "entered_ns", "left_ns", "phase", "outcome")

    def __init__(self, words: np.ndarray) -> None:
        self.gen, self.index = int(words[_GEN]), int(words[_INDEX])
        self.entered_ns, self.left_ns = int(words[_ENTERED]), int(words[_LEFT])
        self.phase, self.outcome = int(words[_PHASE]), int(words[_OUTCOME])
        self.name = np.ascontiguousarray(words[_NAME]).tobytes().rstrip(b"\0").decode(errors="replace")

    @property
    def inside(self) -> bool:
        return self.index > 0 and self.left_ns == 0

    def describe(self, now_ns: int) -> str:
        """``allreduce #3 (generation 1), entered 2.0 s ago and still inside it, moving data``, at
        ``now_ns`` (the wall clock's nanoseconds)."""
        if self.index == 0 and self.gen == 0:
            return "no mpinb collective on this communicator yet"
        what = f"{self.name} #{self.index}" + (f" (generation {self.gen})" if self.gen else "")
        entered = (now_ns - self.entered_ns) / 1e9
        if self.inside:
            return f"{what}, entered {entered:.1f} s ago and still inside it, {_PHASES.get(self.phase, 'waiting')}"
        how = _OUTCOMES.get(self.outcome, "left")
        return f"{what}, entered {entered:.1f} s ago, {how} {(now_ns - self.left_ns) / 1e9:.1f} s ago"


class CellRecord:
    """Where one rank is in the notebook's cells: its current (or last) cell, whether it runs, and
    the last cell that ended there, with the rank's place in its collectives at that moment."""

    __slots__ = ("cell", "running", "ended_cell", "ended_gen", "ended_index", "ended_ns", "text")

    def __init__(self, cell: int, running: bool, ended_cell: int, ended_gen: int, ended_index: int,
                 ended_ns: int, text: str) -> None:
        self.cell, self.running = cell, running
        self.ended_cell, self.ended_gen, self.ended_index = ended_cell, ended_gen, ended_index
        self.ended_ns, self.text = ended_ns, text

    @classmethod
    def from_words(cls, words: np.ndarray) -> CellRecord:
        text = np.ascontiguousarray(words[_ENDED_TEXT]).tobytes().rstrip(b"\0").decode(errors="replace")
        return cls(int(words[_CELL]), bool(words[_CELL_RUNNING]), int(words[_ENDED_CELL]), int(words[_ENDED_GEN]),
                   int(words[_ENDED_INDEX]), int(words[_ENDED_NS]), text)


class Board:
    """This rank's row, writable, and the rows of the other ranks on this host, read-only; plus the
    words the host shares, in the file of its lowest rank (the leader), writable by all. Its clocks
    and signals are ``runtime``'s (:mod:`.runtime`)."""

    def __init__(self, runtime: Runtime = PROCESS) -> None:
        self.runtime, self._time_ns = runtime, runtime.time_ns
        folder = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
        fd, self.path = _create_private(folder, "mpinb-board-")
        try:
            os.ftruncate(fd, _WORDS * 8)
            self._own_map = mmap.mmap(fd, _WORDS * 8)
        finally:
            os.close(fd)
        # A memoryview of int64: item stores cost a fraction of NumPy's, and every collective makes six.
        self.mine = memoryview(self._own_map).cast("q")
        self.mine[_PID] = os.getpid()
        self.mine[_MAIN_THREAD] = threading.main_thread().ident or 0
        self.mine[_STARTED] = _started(os.getpid())
        self._where = _own_where_file(folder, runtime)
        if self._where is not None:
            self.mine[_WHERE_NAME] = memoryview(_where_token(self._where)).cast("q")
        self.peers: dict[int, np.ndarray] = {}
        self.shared = self.mine  # the host's shared words live in the leader's file
        self._maps: list[mmap.mmap] = []
        self._names: dict[str, memoryview] = {}
        self._last_name = ""

    def open_peers(self, paths: dict[int, str], leader: int) -> None:
        """Map the rows of the other ranks on this host (rank -> path), the leader's writable; rows
        that cannot be opened (another host that happens to share the name, a private /tmp) are
        simply not read."""
        for rank, path in paths.items():
            writable = rank == leader
            try:
                fd = _open_own(path, os.O_RDWR if writable else os.O_RDONLY)
            except OSError:
                continue
            try:
                mapped = mmap.mmap(fd, _WORDS * 8, prot=mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0))
            except (OSError, ValueError):
                continue
            finally:
                os.close(fd)
            self._maps.append(mapped)
            self.peers[rank] = np.frombuffer(mapped, dtype=np.int64)
            if writable:
                self.shared = memoryview(mapped).cast("q")
            words = self.peers[rank]
            token = np.ascontiguousarray(words[_WHERE_NAME]).tobytes()
            _open_where_file(os.path.dirname(path), int(words[_PID]), int(words[_STARTED]), token)

    def host_revoked(self) -> int:
        """1 + the newest generation a rank on this host gave up on (0: none)."""
        return int(self.shared[_HOST_REVOKED])

    def mark_revoked(self, gen: int) -> None:
        # Generations are revoked one after another, so the word only grows; no lock needed.
        if self.shared[_HOST_REVOKED] < gen + 1:
            self.shared[_HOST_REVOKED] = gen + 1

    def unlink(self) -> None:
        for path in (self.path, self._where or ""):
            try:
                os.unlink(path)
            except OSError:
                pass

    def ask_where(self, ranks: list[int], timeout: float = 1.0) -> dict[int, str]:
        """Where each of ``ranks`` (on this host) is in its Python code: ``"time.sleep in f (cell.py:3)"``.

        Signals each of them (checking first that its PID is still the process that wrote the row)
        and reads the stack its handler wrote; ranks that do not answer within ``timeout`` are left out.
        """
        pending: dict[int, tuple[int, int, int]] = {}  # rank -> (where fd, PID, main thread)
        for rank in ranks:
            words = self.peers.get(rank)
            if words is None:
                continue
            pid, started = int(words[_PID]), int(words[_STARTED])
            fd = _peer_where.get((pid, started))
            if fd is None or not started or _started(pid) != started:
                continue  # gone, or its PID now names another process: never signal that one
            pending[rank] = (fd, pid, int(words[_MAIN_THREAD]))
        found: dict[int, str] = {}
        runtime = self.runtime
        monotonic, signum = runtime.monotonic, _where_signal(runtime)
        if not pending or signum is None or not _asking.acquire(timeout=timeout):
            return found
        asked: dict[int, float] = {}  # rank -> when it was last signalled
        give_up = monotonic() + timeout
        try:
            while True:  # read first: a rank that slept past the deadline still reads what came
                for rank, (fd, pid, main) in list(pending.items()):
                    if rank in asked:
                        where = _innermost(_read_all(fd), main)
                        if where is not None:
                            found[rank] = where
                            del pending[rank]
                            fcntl.flock(fd, fcntl.LOCK_UN)
                            continue
                    elif not _try_lock(fd):
                        continue  # another rank on this host is asking it: ours comes after
                    if monotonic() - asked.get(rank, -_ASK_AGAIN) >= _ASK_AGAIN:
                        # Asked again when silent: a signal that comes while the handler still
                        # writes an earlier answer (on another thread) is dropped by faulthandler.
                        # The file is emptied only the first time, so a slow answer is never cut.
                        try:
                            if rank not in asked:
                                os.ftruncate(fd, 0)
                            runtime.kill(pid, signum)
                        except OSError:
                            del pending[rank]
                            fcntl.flock(fd, fcntl.LOCK_UN)
                            continue
                        asked[rank] = monotonic()
                if not pending or monotonic() >= give_up:
                    break
                runtime.sleep(0.005)
        finally:
            for rank in pending:
                if rank in asked:
                    fcntl.flock(pending[rank][0], fcntl.LOCK_UN)
            _asking.release()
        return found

    def enter(self, gen: int, index: int, name: str, phase: Phase) -> None:
        mine = self.mine
        if self._last_name != name:
            mine[_NAME] = self._encode(name)
            self._last_name = name
        mine[_GEN], mine[_INDEX] = gen, index
        mine[_ENTERED], mine[_LEFT] = self._time_ns(), 0
        mine[_PHASE], mine[_OUTCOME] = phase.code, 0

    def phase(self, phase: Phase) -> None:
        self.mine[_PHASE] = phase.code

    def leave(self, outcome: Outcome) -> None:
        self.mine[_LEFT] = self._time_ns()
        self.mine[_OUTCOME] = outcome.code
        self.mine[_PHASE] = IDLE.code

    def cell_begin(self, cell: int) -> None:
        self.mine[_CELL] = cell
        self.mine[_CELL_RUNNING] = 1

    def cell_end(self, cell: int, gen: int, index: int, text: str) -> None:
        mine = self.mine
        raw = text.encode()[:_TEXT_BYTES].ljust(_TEXT_BYTES, b"\0")
        mine[_ENDED_TEXT] = memoryview(raw).cast("q")
        mine[_ENDED_GEN], mine[_ENDED_INDEX], mine[_ENDED_NS] = gen, index, self._time_ns()
        mine[_ENDED_CELL] = cell  # last: a reader that sees the cell sees the rest of its record
        mine[_CELL_RUNNING] = 0

    def read_cell(self, rank: int) -> CellRecord | None:
        words = self.peers.get(rank)
        return None if words is None else CellRecord.from_words(words[:_ROW].copy())

    def alive(self, rank: int) -> bool:
        """Whether the process that wrote ``rank``'s row still runs (``True`` where it cannot tell)."""
        words = self.peers.get(rank)
        if words is None or not int(words[_STARTED]):
            return True
        return _started(int(words[_PID])) == int(words[_STARTED])

    def stopped(self, rank: int) -> bool:
        """Whether the process that wrote ``rank``'s row is stopped (SIGSTOP, Ctrl-Z, a debugger)."""
        words = self.peers.get(rank)
        if words is None or not int(words[_STARTED]) or _started(int(words[_PID])) != int(words[_STARTED]):
            return False
        try:
            with open(f"/proc/{int(words[_PID])}/stat", "rb") as stat:
                return stat.read().rsplit(b")", 1)[1].split()[0] in (b"T", b"t")
        except (OSError, IndexError):
            return False

    def read(self, rank: int) -> Row | None:
        words = self.peers.get(rank)
        return None if words is None else Row(words[:_ROW].copy())

    def _encode(self, name: str) -> memoryview:
        encoded = self._names.get(name)
        if encoded is None:
            raw = name.encode()[:64].ljust(64, b"\0")
            encoded = self._names[name] = memoryview(raw).cast("q")
        return encoded


def _where_signal(runtime: Runtime) -> int | None:
    """A signal nothing else in the stack uses (Hydra forwards SIGUSR1 to its processes); none on Windows."""
    return getattr(runtime.signals, "SIGUSR2", None)


_FRAME = re.compile(r'^\s+File "(?P<file>[^"]*)", line (?P<line>\d+) in (?P<func>\S+)')


# One where file per process, whichever communicators it is on (faulthandler writes to one file per
# signal), under a random name its row gives to the ranks on its host; they keep it open.
_own_where: str | None = None
_peer_where: dict[tuple[int, int], int] = {}
# One asker at a time per where file: an asker's truncation would cut another's answer short. The
# ranks on a host take its lock (flock), the threads of a process this one.
_asking = threading.Lock()
_ASK_AGAIN = 0.1  # seconds without an answer before the signal is sent again


def _read_all(fd: int) -> str:
    return os.pread(fd, min(os.fstat(fd).st_size, 1 << 22), 0).decode(errors="replace")


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


_WHERE_PREFIX = "mpinb-where-"
_CREATE_TRIES = 8  # fresh random names to try when one exists (only someone else's planting makes one)


def _create_private(folder: str, prefix: str, flags: int = 0) -> tuple[int, str]:
    """A new file of this account's, readable by it alone, at ``folder/prefix<32 random hex digits>``:
    ``(fd, path)``. ``O_EXCL | O_NOFOLLOW``: a name someone else took (a symlink to one of our
    files, a file they can read, a FIFO) is never opened, only skipped for another."""
    for _ in range(_CREATE_TRIES):
        path = os.path.join(folder, prefix + uuid.uuid4().hex)
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | flags, 0o600), path
        except FileExistsError:
            continue
    raise FileExistsError(f"{_CREATE_TRIES} random names in {folder} all existed")


def _open_own(path: str, flags: int) -> int:
    """Open another rank's board or where file: only a regular file (never through a symlink, never a
    FIFO, which could block the open) that belongs to this account and that no other account may
    read or write. A rank's files are made so (:func:`_create_private`); anything else at the path
    was put there by someone else."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise PermissionError(f"{path} is not a private file of this account")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _where_token(path: str) -> bytes:
    """The 16 bytes that name the where file at ``path`` in its owner's row."""
    return bytes.fromhex(os.path.basename(path)[len(_WHERE_PREFIX):])


def _own_where_file(folder: str, runtime: Runtime = PROCESS) -> str | None:
    global _own_where
    signum = _where_signal(runtime)
    if _own_where is None and signum is not None:
        try:
            fd, path = _create_private(folder, _WHERE_PREFIX, os.O_APPEND)
        except OSError:
            return None
        _ignore_when_unhandled(signum, runtime.signals)
        faulthandler.register(signum, file=fd, all_threads=True, chain=False)
        _own_where = path
    return _own_where


def _ignore_when_unhandled(signum: int, signals: Any) -> None:
    """Make ``signum``'s default action "ignore": faulthandler puts back the handler it replaced when
    the interpreter finalises, and a rank asked where it is while it exits (a batch script that
    caught a collective's error and ends) was killed by the default action, and mpiexec ended the
    job with it, the real error never printed. Only the main thread may set handlers; elsewhere the
    default stays."""
    try:
        if signals.getsignal(signum) == signals.SIG_DFL:
            signals.signal(signum, signals.SIG_IGN)
    except ValueError:
        pass


def _open_where_file(folder: str, pid: int, started: int, token: bytes) -> None:
    if (pid, started) not in _peer_where and started and any(token):
        try:
            _peer_where[(pid, started)] = _open_own(os.path.join(folder, _WHERE_PREFIX + token.hex()), os.O_RDWR)
        except OSError:
            pass


def _started(pid: int) -> int:
    """When process ``pid`` started, in clock ticks since boot (0 where /proc cannot tell)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return int(stat.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 0


def _innermost(dump: str, main: int) -> str | None:
    """Where the main thread is, from faulthandler dumps (``None`` until enough is written): its
    user's innermost line with the library call inside it (:func:`mpinb._frames.describe`). The
    first dump in ``dump`` whose main-thread block shows a user's frame, its outermost frame, or
    its end wins; a line still being written, and lines of an answer cut short before its header,
    are skipped."""
    header = f"0x{main:016x}"
    in_main = False
    frames: list[_frames.Frame] = []
    for line in dump.splitlines(keepends=True):
        if not line.endswith("\n"):
            break
        if line.startswith(("Thread 0x", "Current thread 0x")) or not line.strip():
            if in_main and frames:
                return _frames.describe(frames)
            in_main, frames = header in line, []
            continue
        frame = _FRAME.match(line) if in_main else None
        if frame is None:
            continue
        frames.append(_frames.Frame(frame["file"], int(frame["line"]), frame["func"]))
        if frame["func"] == "<module>" or _frames.kind(frame["file"]) == "user":
            return _frames.describe(frames)  # the user's line, or the outermost frame: enough
    return None
