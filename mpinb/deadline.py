"""Deadlines for mpinb's collectives, and the status board that says what a missing rank is doing."""

from __future__ import annotations

import atexit
import math
import os
import pickle
import time
from typing import Any

import numpy as np

__all__ = ["get_collective_timeout", "set_collective_timeout"]

ENV_VAR = "MPINB_COLLECTIVE_TIMEOUT"


class _Default:
    """The ``timeout`` default: use :func:`get_collective_timeout` (like ``socket``'s global default)."""

    def __repr__(self) -> str:
        return "<the global default>"


#: Passed as ``timeout=DEFAULT`` (the default), a collective uses the global default deadline.
DEFAULT: Any = _Default()
_UNSET: Any = object()
_setting: Any = _UNSET
_env_cache: tuple[str | None, float | None] = (None, None)

# Each rank owns one row of 16 int64 in the board window. Its own record (written with plain stores
# into its window memory, so recording costs no communication): number of the collective on this
# communicator, entry and exit times (ns since the epoch; exit 0 while inside), outcome, and the
# name (32 bytes of UTF-8). A rank that gives up writes a "poison" note into the others' rows, so a
# late rank's next mpinb collective on the communicator raises at once instead of waiting forever.
_ROW = 16
_NUMBER, _ENTERED, _LEFT, _OUTCOME, _NAME = 0, 1, 2, 3, slice(4, 8)
_POISON_BY, _POISON_NUMBER, _POISON_MS, _POISON_NAME = 8, 9, 10, slice(12, 16)
_INSIDE, _DONE, _FAILED, _TIMED_OUT = 0, 1, 2, 3
_READ_BUDGET = 1.0  # seconds a timed-out rank spends reading the others' records
_SPIN = 2e-4  # busy-poll this long before sleeping: a small collective completes within it
_MAX_PAUSE = 2e-3  # longest sleep between polls; MPICH progresses a request only while it is tested


def set_collective_timeout(seconds: float | None) -> None:
    """Set the deadline, in seconds, that mpinb's collectives use when not given ``timeout=``.

    Local: it sets this process's default only, so call it on every rank (in a ``%%px`` cell, or at
    the top of the script). It takes precedence over the ``MPINB_COLLECTIVE_TIMEOUT`` environment
    variable; ``None`` turns the default deadline off (collectives block, as plain MPI does).

    Parameters
    ----------
    seconds : float or None
        A positive number of seconds, or ``None`` for no deadline.

    Examples
    --------
    >>> mpinb.set_collective_timeout(60)   # a rank missing for a minute raises CollectiveTimeout
    """
    global _setting
    _setting = _check_seconds(seconds, "seconds")


def get_collective_timeout() -> float | None:
    """The deadline mpinb's collectives use when not given ``timeout=``, in seconds (``None``: none).

    Local. It is the value given to :func:`set_collective_timeout`, or else the environment variable
    ``MPINB_COLLECTIVE_TIMEOUT`` (read at call time, so ``%env`` in a notebook works), or else ``None``.
    """
    if _setting is not _UNSET:
        return _setting
    global _env_cache
    raw = os.environ.get(ENV_VAR)
    if raw == _env_cache[0]:
        return _env_cache[1]
    text = (raw or "").strip().lower()
    if text in ("", "none", "off"):
        value = None
    else:
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not value > 0:
            raise ValueError(
                f"{ENV_VAR} must be a positive number of seconds (or empty or 'none' for no deadline); got {raw!r}."
            )
        value = None if math.isinf(value) else value
    _env_cache = (raw, value)
    return value


def begin(comm: Any, name: str, timeout: Any = DEFAULT) -> _Call:
    """Start mpinb collective ``name`` on ``comm``: count it, record it on the board, set its deadline.

    Use as ``with begin(comm, "allreduce", timeout) as call:`` and issue every message through
    ``call``, so the whole operation, helper steps included, shares one deadline.
    """
    seconds = get_collective_timeout() if timeout is DEFAULT else _check_seconds(timeout, "timeout")
    state = _state_of(comm)
    if state.broken is not None:
        from mpinb.errors import CollectiveTimeout

        raise CollectiveTimeout(
            f"{name} cannot run on rank {state.rank}: this communicator is unusable since {state.broken}, "
            "so its collectives can no longer be matched across ranks; use a fresh communicator.",
            operation=name, rank=state.rank,
        )
    state.number += 1
    call = _Call(comm, state, name, state.number, seconds if state.size > 1 else None)
    if state.board is None and call.deadline is not None:
        state.board = _Board.create(call)
    if state.board is not None:
        state.board.enter(call)
    return call


class _Call:
    """One mpinb collective in progress: its deadline, and its messages issued against it."""

    __slots__ = ("comm", "state", "name", "number", "timeout", "deadline")

    def __init__(self, comm: Any, state: _State, name: str, number: int, timeout: float | None) -> None:
        self.comm, self.state, self.name, self.number, self.timeout = comm, state, name, number, timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout

    def __enter__(self) -> _Call:
        return self

    def __exit__(self, kind: Any, err: Any, tb: Any) -> None:
        board = self.state.board
        if board is not None:
            from mpinb.errors import CollectiveTimeout

            board.leave(_DONE if kind is None else _TIMED_OUT if kind is CollectiveTimeout else _FAILED)

    # Each message: the blocking MPI call without a deadline (no overhead), else the non-blocking
    # one polled until the deadline.
    def allreduce(self, buf: np.ndarray, op: Any) -> None:
        from mpi4py import MPI

        if self.deadline is None:
            self.comm.Allreduce(MPI.IN_PLACE, buf, op=op)
        else:
            self._wait(self.comm.Iallreduce(MPI.IN_PLACE, buf, op=op), buf)

    def bcast_buf(self, buf: np.ndarray, root: int) -> None:
        if self.deadline is None:
            self.comm.Bcast(buf, root=root)
        else:
            self._wait(self.comm.Ibcast(buf, root=root), buf)

    def allgatherv(self, send: np.ndarray, recv: Any) -> None:
        if self.deadline is None:
            self.comm.Allgatherv(send, recv)
        else:
            self._wait(self.comm.Iallgatherv(send, recv), (send, recv))

    def gatherv(self, send: np.ndarray, recv: Any, root: int) -> None:
        if self.deadline is None:
            self.comm.Gatherv(send, recv, root=root)
        else:
            self._wait(self.comm.Igatherv(send, recv, root=root), (send, recv))

    def barrier(self) -> None:
        """Wait until every rank has arrived; only under a deadline (a guard before blocking-only calls)."""
        if self.deadline is not None:
            self._wait(self.comm.Ibarrier(), None)

    def bcast(self, obj: Any, root: int) -> Any:
        """Pickled broadcast: a length, then the bytes."""
        if self.deadline is None:
            return self.comm.bcast(obj, root=root)
        is_root = self.comm.Get_rank() == root
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL) if is_root else b""
        n = np.array([len(data)], dtype=np.int64)
        self.bcast_buf(n, root)
        buf = np.frombuffer(data, dtype=np.uint8) if is_root else np.empty(int(n[0]), dtype=np.uint8)
        self.bcast_buf(buf, root)
        return obj if is_root else pickle.loads(buf.tobytes())

    def allgather(self, obj: Any) -> list[Any]:
        """Pickled allgather: the lengths, then the bytes with one Allgatherv."""
        if self.deadline is None:
            return self.comm.allgather(obj)
        data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8)
        counts = np.empty(self.state.size, dtype=np.int64)
        mine = np.array([data.size], dtype=np.int64)
        self._wait(self.comm.Iallgather(mine, counts), (mine, counts))
        return _unpickle_parts(self._bytes_v(data, counts, None))

    def gather(self, obj: Any, root: int) -> list[Any] | None:
        """Pickled gather to ``root``: the lengths, then the bytes with one Gatherv."""
        if self.deadline is None:
            return self.comm.gather(obj, root=root)
        data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8)
        is_root = self.comm.Get_rank() == root
        counts = np.empty(self.state.size, dtype=np.int64) if is_root else None
        mine = np.array([data.size], dtype=np.int64)
        self._wait(self.comm.Igather(mine, counts, root=root), (mine, counts))
        parts = self._bytes_v(data, counts, root)
        return None if parts is None else _unpickle_parts(parts)

    def _bytes_v(self, data: np.ndarray, counts: np.ndarray | None, root: int | None) -> Any:
        from mpi4py import MPI

        recv = None
        if counts is not None:
            displs = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
            out = np.empty(int(counts.sum()), dtype=np.uint8)
            recv = [out, (counts, displs), MPI.BYTE]
        if root is None:
            self.allgatherv(data, recv)
        else:
            self.gatherv(data, recv, root)
        return None if recv is None else (recv[0], counts, recv[1][1])

    def _wait(self, req: Any, keep: Any) -> None:
        """Poll ``req`` until it completes or the deadline passes; then raise CollectiveTimeout."""
        try:
            if req.Test():
                return
            spin_until = time.monotonic() + _SPIN
            pause = 5e-5
            while True:
                now = time.monotonic()
                if now >= self.deadline:
                    if req.Test():  # the last rank may have arrived while we slept
                        return
                    break
                if now >= spin_until:
                    time.sleep(min(pause, self.deadline - now))
                    pause = min(2 * pause, _MAX_PAUSE)
                if req.Test():
                    return
        except BaseException:
            # Interrupted (Ctrl-C) with the request in flight: MPI may still write into its buffers.
            self._abandon(req, keep, f"{self.name} #{self.number} was interrupted on rank {self.state.rank}")
            raise
        self._abandon(req, keep, f"{self.name} #{self.number} timed out on rank {self.state.rank}")
        raise self._timeout_error()

    def _abandon(self, req: Any, keep: Any, reason: str) -> None:
        # The request can still complete if the late rank arrives: its buffers must stay alive (and
        # out of any scratch cache), and the communicator can no longer be trusted to match.
        self.state.abandoned.append((req, keep))
        self.state.broken = reason

    def _timeout_error(self) -> Exception:
        from mpinb.errors import CollectiveTimeout

        state, board = self.state, self.state.board
        head = f"{self.name} #{self.number} timed out after {self.timeout:g} s on rank {state.rank}"
        if board is None:
            return CollectiveTimeout(
                f"{head}: not every rank arrived. Which ranks are missing is unknown because this was the "
                "first mpinb collective with a deadline on this communicator (it creates the status board "
                "that names them); this communicator is now unusable.",
                operation=self.name, number=self.number, timeout=self.timeout, rank=state.rank,
            )
        board.leave(_TIMED_OUT)
        rows = board.read_all()
        board.poison_others(self)
        missing: dict[int, str] = {}
        arrived: list[int] = []
        now = time.time_ns()
        for r in range(state.size):
            row = rows.get(r)
            if row is None:
                missing[r] = "its status could not be read in time; across nodes this needs asynchronous progress, MPIR_CVAR_ASYNC_PROGRESS=1"
                continue
            number, name = int(row[_NUMBER]), _decode(row[_NAME])
            if number > self.number or (number == self.number and name == self.name):
                arrived.append(r)
            elif number == self.number:
                missing[r] = f"it entered {name} #{number} instead{_when(row, now)}"
            elif number == 0:
                missing[r] = "no mpinb collective on this communicator yet"
            else:
                missing[r] = f"its last mpinb collective: {name} #{number}{_when(row, now)}"
        if missing:
            waiting = ", ".join(f"rank {r} ({why})" for r, why in missing.items())
            tail = f"waiting for {waiting}; {_ranks(arrived)} arrived."
        else:
            tail = (
                "every rank entered it, yet it did not complete (a rank may be stuck in a non-mpinb "
                "collective, or ranks issued collectives on this communicator in different orders)."
            )
        return CollectiveTimeout(
            f"{head}: {tail} This communicator is now unusable: use a fresh one.",
            operation=self.name, number=self.number, timeout=self.timeout, rank=state.rank,
            missing=missing, arrived=tuple(arrived),
        )


class _State:
    """mpinb's bookkeeping for one communicator, cached on it as an MPI attribute."""

    __slots__ = ("rank", "size", "number", "board", "broken", "abandoned", "__weakref__")

    def __init__(self, comm: Any) -> None:
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.number = 0
        self.board: _Board | None = None
        self.broken: str | None = None
        self.abandoned: list[Any] = []


class _Board:
    """Every rank's last mpinb collective, in an MPI window readable without the owner's help.

    Passive-target RMA: a timed-out rank reads the others' rows with ``Rget`` inside a ``Lock_all``
    epoch held for the window's life. On one node MPICH serves these from shared memory, so a rank
    busy computing (or blocked elsewhere) is read all the same; across nodes the target's MPI library
    may have to make progress, hence the bounded read.
    """

    def __init__(self, win: Any, state: _State) -> None:
        self.win, self.state = win, state
        self.mine = np.frombuffer(win.tomemory(), dtype=np.int64)
        self.names: dict[str, np.ndarray] = {}
        self.freed = False

    @classmethod
    def create(cls, call: _Call) -> _Board:
        from mpi4py import MPI

        # Creating a window is a blocking collective: first make sure, under the deadline, that every
        # rank is here, so a rank missing from this very call cannot hang the others in Win.Allocate.
        call.barrier()
        win = MPI.Win.Allocate(_ROW * 8, 8, comm=call.comm)
        win.Lock_all()
        board = cls(win, call.state)
        board.mine[:] = 0
        _boards.append(board)
        if len(_boards) == 1:
            atexit.register(_free_all)
        return board

    def enter(self, call: _Call) -> None:
        mine = self.mine
        if mine[_POISON_BY]:
            self._refuse(call)
        mine[_NAME] = self._name(call.name)
        mine[_NUMBER] = call.number
        mine[_ENTERED] = time.time_ns()
        mine[_LEFT] = 0
        mine[_OUTCOME] = _INSIDE

    def leave(self, outcome: int) -> None:
        self.mine[_LEFT] = time.time_ns()
        self.mine[_OUTCOME] = outcome

    def read_all(self) -> dict[int, np.ndarray]:
        rows = np.zeros((self.state.size, _ROW), dtype=np.int64)
        rows[self.state.rank] = self.mine
        reqs = {r: self.win.Rget(rows[r], r) for r in range(self.state.size) if r != self.state.rank}
        done = {self.state.rank}
        end = time.monotonic() + _READ_BUDGET
        while reqs and time.monotonic() < end:
            for r in [r for r, q in reqs.items() if q.Test()]:
                done.add(r)
                del reqs[r]
            if reqs:
                time.sleep(1e-4)
        self.state.abandoned.append((list(reqs.values()), rows))
        return {r: rows[r] for r in done}

    def poison_others(self, call: _Call) -> None:
        note = np.zeros(_ROW - _POISON_BY, dtype=np.int64)
        note[0] = self.state.rank + 1
        note[_POISON_NUMBER - _POISON_BY] = call.number
        note[_POISON_MS - _POISON_BY] = int(round(call.timeout * 1000))
        note[_POISON_NAME.start - _POISON_BY :] = self._name(call.name)
        from mpi4py import MPI

        reqs = [
            self.win.Rput(note, r, target=(_POISON_BY, note.size, MPI.INT64_T))
            for r in range(self.state.size)
            if r != self.state.rank
        ]
        end = time.monotonic() + _READ_BUDGET
        while reqs and time.monotonic() < end:
            reqs = [q for q in reqs if not q.Test()]
        self.state.abandoned.append((reqs, note))

    def free(self) -> None:
        """Collective: every rank frees its boards together, when the communicator is freed or at exit.

        Not after a rank gave up on the communicator: MPICH's Win.Free then waits forever (measured),
        so the window is left to MPI_Finalize, which only warns about it.
        """
        if self.freed:
            return
        self.freed = True
        if self.state.broken is not None or self.mine[_POISON_BY]:
            return
        self.win.Unlock_all()
        self.win.Free()

    def _refuse(self, call: _Call) -> None:
        from mpinb.errors import CollectiveTimeout

        mine = self.mine
        by, number, seconds = int(mine[_POISON_BY]) - 1, int(mine[_POISON_NUMBER]), mine[_POISON_MS] / 1000
        name = _decode(mine[_POISON_NAME])
        self.state.broken = f"rank {by} gave up on it when {name} #{number} timed out"
        call.state.number -= 1
        raise CollectiveTimeout(
            f"{call.name} cannot run on rank {self.state.rank}: rank {by} gave up on this communicator when "
            f"{name} #{number} timed out there after {seconds:g} s waiting for this rank, which had not "
            "entered it in time; collectives on it can no longer be matched across ranks. Use a fresh "
            "communicator, and find out why this rank was late.",
            operation=call.name, rank=self.state.rank, missing={self.state.rank: "late"},
        )

    def _name(self, name: str) -> np.ndarray:
        encoded = self.names.get(name)
        if encoded is None:
            raw = name.encode()[:32].ljust(32, b"\0")
            encoded = self.names[name] = np.frombuffer(raw, dtype=np.int64).copy()
        return encoded


_boards: list[_Board] = []
_states: dict[int, _State] = {}
_keyval: Any = None


def _state_of(comm: Any) -> _State:
    # Looked up by handle: a dict hit is cheaper than Get_attr and calls nothing on ``comm`` (tests
    # count the calls on wrapped communicators). An MPI attribute on the communicator drops the entry
    # when it is freed, so a later communicator that reuses the handle starts afresh.
    handle = comm.handle
    state = _states.get(handle)
    if state is None:
        global _keyval
        from mpi4py import MPI

        if _keyval is None:
            _keyval = MPI.Comm.Create_keyval(delete_fn=_on_comm_free)
        state = _states[handle] = _State(comm)
        MPI.Comm.fromhandle(handle).Set_attr(_keyval, handle)
    return state


def _on_comm_free(comm: Any, keyval: Any, handle: int) -> None:
    # Comm.Free is collective, so every rank frees the board together here.
    state = _states.pop(handle, None)
    if state is not None and state.board is not None:
        state.board.free()


def _free_all() -> None:
    # Runs before mpi4py's own exit handler finalizes MPI (atexit is last-in, first-out); boards were
    # created in the same order on every rank, so the collective frees match.
    from mpi4py import MPI

    if MPI.Is_finalized():
        return
    for board in _boards:
        board.free()
    _boards.clear()


def _check_seconds(seconds: Any, what: str) -> float | None:
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float, np.integer, np.floating)) or not seconds > 0:
        raise ValueError(f"{what} must be a positive number of seconds or None (no deadline); got {seconds!r}.")
    return None if math.isinf(seconds) else float(seconds)


def _unpickle_parts(parts: tuple[np.ndarray, np.ndarray, np.ndarray]) -> list[Any]:
    data, counts, displs = parts
    return [pickle.loads(data[d : d + n].tobytes()) for n, d in zip(counts.tolist(), displs.tolist())]


def _decode(words: np.ndarray) -> str:
    return np.ascontiguousarray(words).tobytes().rstrip(b"\0").decode(errors="replace") or "?"


def _when(row: np.ndarray, now_ns: int) -> str:
    entered = (now_ns - int(row[_ENTERED])) / 1e9
    if row[_LEFT] == 0:
        return f", entered {entered:.1f} s ago and still inside it"
    left = (now_ns - int(row[_LEFT])) / 1e9
    how = {_DONE: "left", _FAILED: "raised", _TIMED_OUT: "timed out"}.get(int(row[_OUTCOME]), "left")
    return f", entered {entered:.1f} s ago, {how} {left:.1f} s ago"


def _ranks(ranks: list[int]) -> str:
    return f"{'rank' if len(ranks) == 1 else 'ranks'} {', '.join(map(str, ranks))}"
