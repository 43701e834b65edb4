"""The collective layer: the one module of mpinb that calls MPI communication.

Every mpinb collective is an *operation* on the *channel* of a user communicator:

- On first use a channel duplicates the user's communicator twice, without blocking: a control
  communicator for point-to-point notices, and the data communicator the operations run on
  (generation 0). It then exchanges each rank's host, CPU affinity and status-board file
  (:mod:`mpinb._collective.board`), so that from then on a rank that gives up can say where every missing
  rank on its host is, even for the first collective after set-up.
- An operation starts with its *arrival*: one ``Iallreduce(MIN)`` of four integers, a digest of the
  operation's name and layout, its negation and two votes. It is a barrier, a check that every rank
  called the same collective with the same shapes and dtypes (a mismatch raises the same
  ``CollectiveMismatchError`` everywhere, before any data moves) and a free boolean vote
  (``check_all``), in one small message. The data then move with non-blocking calls. The wire
  protocol of an operation is the same with and without a deadline.
- Every wait polls its requests. It checks the deadline, notices from other ranks, and lets SIGINT
  through (``KeyboardInterrupt``); it spins briefly, then sleeps with a growing pause while ranks
  have yet to arrive, so a waiting rank gives its core to the ranks that compute.
- A rank that abandons a wait (deadline, ``KeyboardInterrupt``) *revokes* the generation: it keeps
  the abandoned requests and their buffers alive, sends a small notice to every other rank on the
  control communicator and starts a non-blocking duplicate of the user's communicator, the next
  generation. A rank waiting in the revoked generation raises :class:`CollectiveAbandoned` naming
  who gave up on what; a rank that was elsewhere (computing, or it never called the abandoned
  collective) completes the abandoned arrival for the others, is warned, and runs its next
  collective on the new generation like everyone else. So the next cell works, and engine state
  survives: no restart.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import pickle
import socket
import time
import warnings
from typing import Any, Sequence

import numpy as np

from mpinb._collective import board as _board
from mpinb.deadline import DEFAULT, resolve
from mpinb.errors import (
    CollectiveAbandoned,
    CollectiveMismatchError,
    CollectiveTimeout,
    _describe_mismatch,
)

__all__ = ["Channel", "allgather", "barrier", "bcast", "channel", "collective", "reduce_in_place"]

_NOTICE = 77  # tag of revocation notices on the control communicator
_SPIN = 1e-3  # busy-poll this long before sleeping: arrival skew on an idle machine stays below it
_YIELD = 2e-2  # then test and yield the core for this long: a sleeping rank would delay the next message
_FIRST_PAUSE, _MAX_PAUSE = 2e-5, 1e-3  # then sleep between tests, the pause doubling
_DATA_SPIN = 2e-2  # with every rank present, test without yielding for this long
_CHECK = 5e-5  # seconds between looks at notices and the deadline while ranks arrive
_CHECK_DATA = 1e-3  # the same while data move
_OPS = ("sum", "min", "max")


def channel(comm: Any = None) -> Channel:
    """The channel of ``comm`` (default ``COMM_WORLD``), made on first use.

    Creating it communicates nothing: the set-up exchange runs inside the first operation.
    """
    if comm is None:
        global _world
        if _world is None:
            from mpi4py import MPI as mpi

            _world = _lookup(mpi.COMM_WORLD)
        return _world
    return _lookup(comm)


def collective(
    comm: Any, name: str, layout: Any = None, *, timeout: Any = DEFAULT, votes: tuple[int, int] = (0, 0),
    what: str | None = None,
) -> Op:
    """Begin operation ``name``: use as ``with collective(comm, "allreduce", layout) as op:``.

    ``layout`` (hashable, with a deterministic ``repr``) must be equal on every rank; ``what``
    names it in the mismatch error. ``votes`` are two non-negative integers whose maximum over the
    ranks is ``op.votes`` once the ranks have arrived.
    """
    return channel(comm).begin(name, layout, timeout=timeout, votes=votes, what=what)


def reduce_in_place(buffers: Sequence[np.ndarray], op: str = "sum", *, comm: Any = None, name: str,
                    timeout: Any = DEFAULT) -> None:
    """Reduce each contiguous buffer over the ranks, in place (one operation, several messages)."""
    layout = (op, tuple((b.shape, b.dtype.str) for b in buffers))
    with collective(comm, name, layout, timeout=timeout, what=f"{name}'s buffers") as call:
        call.allreduce(buffers, op)


def allgather(obj: Any, *, comm: Any = None, name: str, timeout: Any = DEFAULT) -> list[Any]:
    """Every rank's ``obj`` (pickled), in rank order, on every rank."""
    with collective(comm, name, timeout=timeout) as call:
        return call.allgather(obj)


def bcast(obj: Any, *, root: int = 0, comm: Any = None, name: str, timeout: Any = DEFAULT) -> Any:
    """Root's ``obj`` (pickled) on every rank."""
    with collective(comm, name, ("root", root), timeout=timeout) as call:
        return call.bcast(obj, root)


def barrier(*, comm: Any = None, name: str, timeout: Any = DEFAULT) -> float:
    """Wait until every rank has arrived; returns the seconds spent waiting."""
    with collective(comm, name, timeout=timeout) as call:
        return call.waited


class _Gen:
    """One generation of the data communicator."""

    __slots__ = ("number", "comm", "request", "index", "revoked", "abandoned_here", "pending", "left", "freed")

    def __init__(self, number: int, comm: Any, request: Any) -> None:
        self.number, self.comm, self.request = number, comm, request
        self.index = 0  # operations begun on it
        self.revoked: dict[str, Any] | None = None  # the notice that ended it
        self.abandoned_here = False
        self.pending: list[tuple[Any, Any]] = []  # (requests, buffers) MPI may still use
        self.left = False
        self.freed = False


class Channel:
    """mpinb's private communicators for one user communicator, and their bookkeeping."""

    def __init__(self, parent: Any) -> None:
        self.parent = parent
        self.rank, self.size = parent.Get_rank(), parent.Get_size()
        host = socket.gethostname()
        self.hosts = [host] * self.size
        self.affinity: list[frozenset[int]] = [_affinity()] * self.size
        self.ctrl: Any = None
        self._ctrl_pending: tuple[Any, Any] | None = None  # (communicator, Idup request) until complete
        self.gens: list[_Gen] = []
        self._active = 0
        self.board: _board.Board | None = None
        self.ready = self.size == 1
        self.crowded = False  # more ranks on this host than cores: waiting ranks yield at once
        self.closed = False
        self._setting_up = False
        self._sends: list[Any] = []

    # -- what the rest of mpinb reads ---------------------------------------------------------
    @property
    def host(self) -> str:
        return self.hosts[self.rank]

    def local_ranks(self) -> list[int]:
        """The ranks on this rank's host, in rank order (needs the set-up exchange)."""
        return [r for r, h in enumerate(self.hosts) if h == self.host]

    def host_cores(self) -> frozenset[int]:
        """The cores the ranks on this host may run on, together (needs the set-up exchange)."""
        return frozenset().union(*(self.affinity[r] for r in self.local_ranks()))

    def ensure_ready(self, timeout: Any = DEFAULT) -> None:
        """Collective the first time: duplicate, exchange hosts and boards. Free afterwards."""
        if not self.ready:
            seconds = resolve(timeout)
            self._set_up("mpinb set-up", seconds, None if seconds is None else time.monotonic() + seconds)

    # -- operations -----------------------------------------------------------------------------
    def begin(self, name: str, layout: Any = None, *, timeout: Any = DEFAULT, votes: tuple[int, int] = (0, 0),
              what: str | None = None) -> Op:
        seconds = resolve(timeout)  # checked at one rank too, so a bad value fails the same everywhere
        if self.size == 1:
            return Op(self, None, name, 0, None, None, votes)
        deadline = None if seconds is None else time.monotonic() + seconds
        self._collect()
        self._set_up(name, seconds, deadline)
        self._expect_notices()
        gen = self._current(name, seconds, deadline)
        gen.index += 1
        op = Op(self, gen, name, gen.index, seconds, deadline, votes)
        if self.board is not None:
            self.board.enter(gen.number, gen.index, name, _board.ARRIVING)
        try:
            op._arrive(layout, what)
        except BaseException as err:
            op.__exit__(type(err), err, None)
            raise
        return op

    # -- set-up -----------------------------------------------------------------------------------
    def _set_up(self, name: str, seconds: float | None, deadline: float | None) -> None:
        if self.ctrl is None:
            if self._ctrl_pending is None:
                self._ctrl_pending = self.parent.Idup()
                self.gens.append(_Gen(0, *self.parent.Idup()))
            waits = [self._ctrl_pending[1], self.gens[0].request]
            try:
                _poll(self, waits, deadline, spin=_SPIN)
            except _DeadlinePassed:
                raise CollectiveTimeout(
                    f"{name} timed out after {seconds:g} s on rank {self.rank} while mpinb set up its "
                    f"communicators: not every rank has called an mpinb collective on this communicator yet, "
                    "and before that mpinb cannot tell which ranks are missing. Call mpinb.world() on every "
                    "rank first (MPICluster does when the engines start); the set-up resumes at the next call.",
                    operation=name, timeout=seconds, rank=self.rank,
                ) from None
            self.ctrl, self._ctrl_pending = self._ctrl_pending[0], None
            self.gens[0].request = None
        if not self.ready and not self._setting_up:
            self._setting_up = True
            try:
                self._exchange(seconds)
            finally:
                self._setting_up = False

    def _exchange(self, seconds: float | None) -> None:
        if self.board is None:
            try:
                self.board = _board.Board()
            except OSError:
                self.board = None  # no writable shared folder: collectives work, timeouts say less
        path = None if self.board is None else self.board.path
        timeout = DEFAULT if seconds is None else seconds
        with self.begin("mpinb set-up", timeout=timeout) as op:
            table = op.allgather((self.hosts[self.rank], sorted(self.affinity[self.rank]), path))
        self.hosts = [h for h, _, _ in table]
        self.affinity = [frozenset(a) for _, a, _ in table]
        self.crowded = len(self.local_ranks()) > len(self.host_cores())
        if self.board is not None:
            self.board.open_peers({r: p for r, (h, _, p) in enumerate(table)
                                   if r != self.rank and p is not None and h == self.host},
                                  leader=self.local_ranks()[0])
        with self.begin("mpinb set-up", timeout=timeout):
            pass  # every rank has opened its neighbours' rows: the names can go
        if self.board is not None:
            self.board.unlink()
            self.board.enter(self.gens[self._active].number, 0, "mpinb set-up", _board.IDLE)
            self.board.leave(_board.DONE)
        # The user's collectives are numbered from 1 (every rank resets at the same point).
        self.gens[self._active].index = 0
        self.ready = True

    # -- generations ------------------------------------------------------------------------------
    def _current(self, name: str, seconds: float | None, deadline: float | None) -> _Gen:
        """The generation to run on, after moving past revoked ones (each Idup polled)."""
        while True:
            gen = self.gens[self._active]
            if gen.request is not None:
                if self.board is not None:
                    self.board.enter(gen.number, 0, name, _board.SWITCHING)
                try:
                    _poll(self, [gen.request], deadline, spin=_SPIN)
                except _DeadlinePassed:
                    if self.board is not None:
                        self.board.leave(_board.TIMED_OUT)
                    raise self._switch_timeout(name, seconds, gen) from None
                gen.request = None
            if gen.revoked is None:
                return gen
            self._leave(gen)
            self._active += 1

    def _leave(self, gen: _Gen) -> None:
        note = gen.revoked
        assert note is not None
        if gen.index == note["index"] - 1:
            # This rank never reached the abandoned collective, so the others' arrivals are still
            # pending: complete them with a matching arrival, so MPI holds no request for ever.
            header = np.zeros(4, np.int64)
            gen.pending.append(([gen.comm.Iallreduce(MPI.IN_PLACE, header, op=MPI.MIN)], header))
        gen.left = True
        if not gen.abandoned_here and note["rank"] != self.rank:
            warnings.warn(
                f"mpinb: rank {note['rank']} gave up on {note['name']} #{note['index']} ({note['why']}) while "
                f"rank {self.rank} was elsewhere; every rank moves to a fresh communicator, and this "
                "rank's next collective runs on it.",
                RuntimeWarning, stacklevel=_caller_level(),
            )
        self._collect()

    def _expect_notices(self) -> None:
        """Take in the notices the host's shared word announces. A notice can sit in MPI's queues
        until the receiver has made progress a few times, so a rank entering its next collective
        could miss it; on one host the word says one is due. Across hosts, notices arrive as MPI
        delivers them (within a rank's next few collectives)."""
        board = self.board
        if board is None or board.host_revoked() <= self._known_revoked():
            return
        give_up = time.monotonic() + 5.0  # the notice was sent before the word was written
        while board.host_revoked() > self._known_revoked() and time.monotonic() < give_up:
            self.notices()
            if board.host_revoked() > self._known_revoked():
                time.sleep(1e-5)

    def _known_revoked(self) -> int:
        for gen in reversed(self.gens):
            if gen.revoked is not None:
                return gen.number + 1
        return 0

    def _post_next(self) -> None:
        newest = self.gens[-1]
        self.gens.append(_Gen(newest.number + 1, *self.parent.Idup()))

    def _abandon(self, op: Op, requests: list[Any], keep: Any, why: str | None,
                 missing: dict[int, str] | None = None) -> None:
        """Give up on ``op``; ``why`` is None when a notice from another rank ended it. A rank whose
        deadline passed sends the ranks it was waiting for along, so that the others name them too."""
        gen = op.gen
        gen.pending.append((requests, keep))
        gen.abandoned_here = True
        if gen.revoked is not None:
            return
        gen.revoked = note = {"gen": gen.number, "index": op.index, "name": op.name, "rank": self.rank,
                              "why": why or "abandoned", "time": time.time(), "missing": missing,
                              "timeout": op.timeout}
        for r in range(self.size):
            if r != self.rank:
                self._sends.append(self.ctrl.isend(note, dest=r, tag=_NOTICE))
        if self.board is not None:
            self.board.mark_revoked(gen.number)
        self._post_next()

    def notices(self) -> None:
        """Take in every notice that has arrived; a notice ends its generation here too."""
        ctrl = self.ctrl
        if ctrl is None:
            return
        while True:
            # The first probe may only pull arrived messages into MPI's queue (MPICH over UCX), so
            # an empty answer is asked once more.
            message = ctrl.improbe(source=MPI.ANY_SOURCE, tag=_NOTICE)
            if message is None:
                message = ctrl.improbe(source=MPI.ANY_SOURCE, tag=_NOTICE)
                if message is None:
                    return
            note = message.recv()
            gen = next((g for g in self.gens if g.number == note["gen"]), None)
            if gen is not None and gen.revoked is None and not self.closed:
                gen.revoked = note
                self._post_next()

    def _collect(self) -> None:
        """Drop finished sends and abandoned requests; free generations nothing uses any more."""
        self.notices()
        if self._sends:
            self._sends = [s for s in self._sends if not s.Test()]
        if len(self.gens) == 1 and not self.gens[0].pending:
            return
        for gen in self.gens:
            if gen.pending:
                gen.pending = [(reqs, keep) for reqs, keep in gen.pending if not MPI.Request.Testall(reqs)]
            if gen.left and not gen.pending and not gen.freed and gen.comm is not None:
                gen.comm.Free()  # local in MPICH and Open MPI; every rank frees each generation once
                gen.freed = True

    def close(self) -> None:
        """Free the private communicators (at exit, or when the user's communicator is freed)."""
        self.closed = True
        for gen in self.gens:
            if not gen.freed and gen.request is None and not gen.pending:
                gen.comm.Free()
                gen.freed = True
        if self.ctrl is not None and not self._sends:
            self.ctrl.Free()
            self.ctrl = None
        if self.board is not None:
            self.board.unlink()

    # -- error messages -------------------------------------------------------------------------
    def whereabouts(self, gen: _Gen, index: int) -> tuple[dict[int, str], list[int]]:
        """The ranks not known to have arrived at ``(gen, index)``, each with where it was."""
        missing: dict[int, str] = {}
        arrived: list[int] = []
        now = time.time_ns()
        for r in range(self.size):
            if r == self.rank:
                continue
            row = None if self.board is None else self.board.read(r)
            if row is None:
                missing[r] = (f"on host {self.hosts[r]}, whose status is not visible from {self.host}"
                              if self.hosts[r] != self.host else "its status could not be read")
            elif row.gen > gen.number or (row.gen == gen.number and row.index >= index):
                arrived.append(r)
            elif row.inside:
                missing[r] = f"it is in {row.describe(now)}"
            elif row.index == 0 and row.gen == gen.number:
                since = "on this communicator yet" if gen.number == 0 else "since mpinb moved to a fresh communicator"
                missing[r] = f"no mpinb collective {since}; it is computing or blocked outside mpinb"
            else:
                missing[r] = f"its last mpinb collective: {row.describe(now)}; it is computing or blocked outside mpinb"
        return missing, arrived

    def _switch_timeout(self, name: str, seconds: float | None, gen: _Gen) -> CollectiveTimeout:
        previous = self.gens[self._active - 1].revoked if self._active else None
        cause = "" if previous is None else (
            f" after rank {previous['rank']} gave up on {previous['name']} #{previous['index']} ({previous['why']})"
        )
        missing = {r: why for r, why in self.whereabouts(gen, 0)[0].items()}
        listing = "; ".join(f"rank {r} ({why})" for r, why in missing.items()) or "unknown ranks"
        return CollectiveTimeout(
            f"{name} timed out after {seconds:g} s on rank {self.rank} waiting for every rank to move to a "
            f"fresh communicator{cause}: waiting for {listing}. Each rank moves when it enters its next mpinb "
            "collective; the move resumes at this rank's next call.",
            operation=name, timeout=seconds, rank=self.rank, missing=missing,
        )


class Op:
    """One operation in progress: its generation, deadline and messages."""

    __slots__ = ("chan", "gen", "comm", "name", "index", "timeout", "deadline", "my_votes", "votes", "waited",
                 "settled")

    def __init__(self, chan: Channel, gen: _Gen | None, name: str, index: int, timeout: float | None,
                 deadline: float | None, votes: tuple[int, int]) -> None:
        self.chan, self.gen, self.name, self.index = chan, gen, name, index
        self.comm = None if gen is None else gen.comm
        self.timeout, self.deadline = timeout, deadline
        self.my_votes = self.votes = votes
        self.waited = 0.0
        self.settled = False

    @property
    def rank(self) -> int:
        return self.chan.rank

    @property
    def size(self) -> int:
        return self.chan.size

    def __enter__(self) -> Op:
        return self

    def __exit__(self, kind: Any, err: Any, tb: Any) -> None:
        board = self.chan.board
        if kind is not None and not self.settled and self.gen is not None:
            # An exception between two messages of this operation (a KeyboardInterrupt, a bug): the
            # others would wait for the next message, so give the operation up for everyone.
            self.chan._abandon(self, [], None, f"raised {kind.__name__} between its messages")
        if board is not None and self.gen is not None:
            board.leave(_board.DONE if kind is None else
                        _board.TIMED_OUT if kind is CollectiveTimeout else
                        _board.ABANDONED if kind in (KeyboardInterrupt, CollectiveAbandoned) else _board.FAILED)

    def fail(self, error: BaseException) -> None:
        """Raise ``error``, which every rank raises at this point: nothing to give up."""
        self.settled = True
        raise error

    # -- messages -------------------------------------------------------------------------------
    def allreduce(self, buffers: Sequence[np.ndarray], op: str = "sum",
                  pairs: Sequence[tuple[np.ndarray, np.ndarray]] = ()) -> None:
        """Reduce contiguous ``buffers`` in place, and each ``(send, recv)`` of ``pairs`` into ``recv``
        (no copy of large arrays). One message at a time: with MPICH, fifty 1 MiB reductions in
        flight together took 15% longer than one after the other. Where ranks outnumber cores, all
        at once: a rank that gets a core then progresses every message (16 MiB in 50 arrays at 4
        ranks on 2 cores: 44 ms against 140 ms one by one). The messages are the same either way."""
        if self.size == 1:
            for send, recv in pairs:
                recv[...] = send
            return
        mpi_op = _mpi_op(op)
        post = [(MPI.IN_PLACE, b) for b in buffers if b.size] + [(s, r) for s, r in pairs if s.size]
        if self.chan.crowded:
            # More ranks than cores: whichever rank runs should find work for every message.
            self._wait([self.comm.Iallreduce(s, r, op=mpi_op) for s, r in post], post)
            return
        for send, recv in post:
            self._wait([self.comm.Iallreduce(send, recv, op=mpi_op)], (send, recv))

    def bcast_array(self, buf: np.ndarray, root: int) -> None:
        if self.size > 1 and buf.size:
            self._wait([self.comm.Ibcast(buf, root=root)], buf)

    def bcast(self, obj: Any, root: int, label: str | None = None) -> Any:
        """Root's object, pickled; an object root cannot pickle raises ``TypeError`` on every rank
        (``label`` names it there, by default its type)."""
        if self.size == 1:
            return obj
        is_root = self.rank == root
        data = b""
        if is_root:
            try:
                data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
                length = len(data)
            except Exception as err:  # noqa: BLE001 - reported on every rank below
                data = f"bcast could not pickle {label or type(obj).__name__} on rank {root}: {err}".encode()
                length = -len(data)
        n = np.array([length if is_root else 0], dtype=np.int64)
        self.bcast_array(n, root)
        size = abs(int(n[0]))
        buf = np.frombuffer(data, dtype=np.uint8).copy() if is_root else np.empty(size, dtype=np.uint8)
        self.bcast_array(buf, root)
        if n[0] < 0:
            self.fail(TypeError(buf.tobytes().decode(errors="replace")))
        return obj if is_root else pickle.loads(buf.tobytes())

    def allgather(self, obj: Any) -> list[Any]:
        """Every rank's object, pickled, in rank order."""
        if self.size == 1:
            return [obj]
        data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8)
        counts = self.allgather_ints(np.array([data.size], dtype=np.int64))[:, 0]
        out = np.empty(int(counts.sum()), dtype=np.uint8)
        self.allgatherv(data, out, counts)
        return _unpickle(out, counts)

    def gather(self, obj: Any, root: int) -> list[Any] | None:
        """Every rank's object, pickled, in rank order, on ``root`` (``None`` elsewhere)."""
        if self.size == 1:
            return [obj]
        data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8)
        mine = np.array([data.size], dtype=np.int64)
        is_root = self.rank == root
        counts = np.empty(self.size, dtype=np.int64) if is_root else None
        self._wait([self.comm.Igather(mine, counts, root=root)], (mine, counts))
        out = np.empty(int(counts.sum()), dtype=np.uint8) if is_root else None
        self.gatherv(data, out, counts, root)
        return _unpickle(out, counts) if is_root else None

    def allgather_ints(self, values: np.ndarray) -> np.ndarray:
        """Every rank's equal-length int64 vector, as rows of a ``(size, n)`` array."""
        values = np.ascontiguousarray(values, dtype=np.int64)
        out = np.empty((self.size, values.size), dtype=np.int64)
        if self.size == 1:
            out[0] = values
            return out
        self._wait([self.comm.Iallgather(values, out)], (values, out))
        return out

    def allgatherv(self, send: np.ndarray, recv: np.ndarray, counts: np.ndarray) -> None:
        """Variable-length blocks of ``send`` (flat) from every rank into flat ``recv`` in rank order."""
        if self.size == 1:
            recv[: send.size] = send
            return
        displs = _displacements(counts)
        spec = [recv, (counts, displs)]
        self._wait([self.comm.Iallgatherv(send, spec)], (send, recv, counts, displs))

    def gatherv(self, send: np.ndarray, recv: np.ndarray | None, counts: np.ndarray | None, root: int) -> None:
        if self.size == 1:
            recv[: send.size] = send
            return
        spec = None if recv is None else [recv, (counts, _displacements(counts))]
        self._wait([self.comm.Igatherv(send, spec, root=root)], (send, spec))

    # -- arrival and waiting -----------------------------------------------------------------
    def _arrive(self, layout: Any, what: str | None) -> None:
        digest = _digest(self.name, layout)
        header = np.array([digest, -digest, -self.my_votes[0], -self.my_votes[1]], dtype=np.int64)
        t0 = time.perf_counter()
        self._wait([self.comm.Iallreduce(MPI.IN_PLACE, header, op=MPI.MIN)], header, _board.ARRIVING, _SPIN)
        self.waited = time.perf_counter() - t0
        if self.chan.board is not None:
            self.chan.board.phase(_board.MOVING)
        self.votes = (int(-header[2]), int(-header[3]))
        if header[0] != -header[1]:
            texts = self.allgather((self.name, layout if isinstance(layout, str) else repr(layout)))
            self.fail(CollectiveMismatchError(_mismatch_message(texts, what)))

    def _wait(self, requests: list[Any], keep: Any, phase: int = _board.MOVING, spin: float | None = None) -> None:
        try:
            _poll(self.chan, requests, self.deadline, spin=spin, op=self)
        except _DeadlinePassed:
            error = self._timeout_error(phase)
            self.chan._abandon(self, requests, keep, f"timed out after {self.timeout:g} s", error.missing)
            self.settled = True
            raise error from None
        except _PeerGaveUp as gave_up:
            self.chan._abandon(self, requests, keep, None)
            self.settled = True
            raise self._abandoned_error(gave_up.note) from None
        except BaseException as err:
            # Ctrl-C (or cluster.interrupt()) while waiting: MPI may still write into the buffers.
            self.chan._abandon(self, requests, keep, f"was interrupted ({type(err).__name__})")
            self.settled = True
            raise

    def _timeout_error(self, phase: int) -> CollectiveTimeout:
        chan = self.chan
        head = f"{self.name} #{self.index} timed out after {self.timeout:g} s on rank {chan.rank}"
        missing: dict[int, str] = {}
        arrived: tuple[int, ...] = ()
        if phase == _board.ARRIVING:
            found, came = chan.whereabouts(self.gen, self.index)
            missing, arrived = found, tuple(came)
            listing = "; ".join(f"rank {r} ({why})" for r, why in missing.items())
            tail = f"waiting for {listing}" if missing else "every rank seems to have arrived, yet the arrival did not complete"
            if arrived:
                tail += f"; {_ranks(list(arrived))} arrived"
        else:
            tail = ("every rank arrived, but the data did not finish moving (a rank may have stopped "
                    "between the messages of this collective)")
        return CollectiveTimeout(
            f"{head}: {tail}. mpinb moves every rank to a fresh communicator, so the next collective works "
            "once every rank calls it; a rank stuck outside mpinb (its own MPI call, C code) cannot "
            "rejoin: cluster.restart() replaces the engines.",
            operation=self.name, number=self.index, timeout=self.timeout, rank=chan.rank,
            missing=missing, arrived=arrived,
        )

    def _abandoned_error(self, note: dict[str, Any]) -> CollectiveTimeout | CollectiveAbandoned:
        if note.get("missing") is not None:
            # Another waiting rank's deadline passed first: this rank waited for the same ranks.
            missing = {r: why for r, why in note["missing"].items() if r != self.chan.rank}
            listing = "; ".join(f"rank {r} ({why})" for r, why in missing.items()) or "the ranks that had not arrived"
            return CollectiveTimeout(
                f"{self.name} #{self.index} timed out after {note['timeout']:g} s on rank {self.chan.rank}: waiting "
                f"for {listing} (the deadline passed first on rank {note['rank']}, which told the others). mpinb "
                "moves every rank to a fresh communicator, so the next collective works once every rank calls it.",
                operation=self.name, number=self.index, timeout=note["timeout"], rank=self.chan.rank,
                missing=missing,
            )
        return CollectiveAbandoned(
            f"{self.name} #{self.index} stopped on rank {self.chan.rank}: rank {note['rank']} gave up on "
            f"{note['name']} #{note['index']} ({note['why']}). mpinb moves every rank to a fresh communicator, "
            "so the next collective works once every rank calls it.",
            operation=self.name, by=note["rank"], reason=note["why"], rank=self.chan.rank,
        )


class _DeadlinePassed(Exception):
    pass


class _PeerGaveUp(Exception):
    def __init__(self, note: dict[str, Any]) -> None:
        super().__init__(note)
        self.note = note


def _poll(chan: Channel, requests: list[Any], deadline: float | None, *, spin: float | None = None,
          op: Op | None = None) -> None:
    """Return once every request completed. Raises _DeadlinePassed, _PeerGaveUp (when ``op``'s
    generation is revoked by another rank at or before ``op``), or whatever SIGINT raises.

    MPI progresses a non-blocking collective only while it is tested, so the data phase
    (``spin=None``: every rank is there) keeps testing, and yields the core only after
    ``_DATA_SPIN`` seconds. While ranks have yet to arrive it busy-polls for ``spin`` seconds, then
    tests and yields the core (``sched_yield``: free on an idle core, given away on a busy one) for
    ``_YIELD`` seconds, and only then sleeps between tests with a doubling pause: a rank asleep
    when the last one arrives would hold up the operation's next message by the rest of its nap.
    Where ranks outnumber cores it sleeps from the start while ranks arrive, and yields while data
    move. Notices and the deadline are
    checked every ``_CHECK`` seconds (``_CHECK_DATA`` while data move) and after every sleep.
    """
    testall = MPI.Request.Testall
    if testall(requests):
        return
    now = time.monotonic()
    spin_until = now + (_DATA_SPIN if spin is None else spin)
    # Where ranks outnumber cores, a rank yielding in a loop still takes turns on a core that a
    # computing rank needs: waiting for arrivals, it sleeps from the start.
    yield_until = now if chan.crowded else spin_until + _YIELD
    # Probing for notices progresses MPI too, but costs tens of microseconds while megabytes move.
    interval = _CHECK if spin is not None else _CHECK_DATA
    check_at = now + interval  # the operation looked for notices when it began
    pause = _FIRST_PAUSE
    gen = None if op is None else op.gen
    while True:
        if testall(requests):
            return
        now = time.monotonic()
        if now >= check_at:
            check_at = now + interval
            chan.notices()
            note = None if gen is None else gen.revoked
            if note is not None and note["rank"] != chan.rank and op.index >= note["index"]:
                raise _PeerGaveUp(note)
            if deadline is not None and now >= deadline:
                if testall(requests):  # the last rank may have arrived while this one slept
                    return
                raise _DeadlinePassed
        if now >= spin_until or chan.crowded:
            if spin is None or now < yield_until:
                os.sched_yield()
            else:
                time.sleep(pause if deadline is None else min(pause, max(deadline - now, 0.0)))
                pause = min(2 * pause, _MAX_PAUSE)
                check_at = now  # look again after every sleep


MPI: Any = None  # mpi4py.MPI, imported with the first channel (never in the notebook client)
_channels: dict[int, Channel] = {}
_world: Channel | None = None
_keyval: Any = None
_digests: dict[Any, int] = {}


def _lookup(comm: Any) -> Channel:
    # By handle: a dict hit, and it calls nothing on ``comm``. An MPI attribute on the communicator
    # drops the entry when it is freed, so a later communicator that reuses the handle starts afresh.
    handle = comm.handle
    chan = _channels.get(handle)
    if chan is None:
        global _keyval, MPI
        from mpi4py import MPI

        if _keyval is None:
            _keyval = MPI.Comm.Create_keyval(delete_fn=_on_comm_free)
            atexit.register(_close_all)
        chan = _channels[handle] = Channel(comm)
        MPI.Comm.fromhandle(handle).Set_attr(_keyval, handle)
    return chan


def _on_comm_free(comm: Any, keyval: Any, handle: int) -> None:
    chan = _channels.pop(handle, None)
    if chan is not None:
        chan.close()


def _close_all() -> None:
    # Before mpi4py finalizes MPI (it does so after the atexit handlers).
    if MPI is None or MPI.Is_finalized():
        return
    global _world
    for chan in list(_channels.values()):
        chan.close()
        chan._collect()
    _channels.clear()
    _world = None


def _digest(name: str, layout: Any) -> int:
    key = (name, layout)
    try:
        return _digests[key]
    except KeyError:
        pass
    except TypeError:  # unhashable layout: digest its repr every time
        key = None
    text = repr((name, layout)).encode()
    # Python's hash() of str is salted per process; a keyed digest is identical on every rank. Seven
    # bytes keep the negation inside int64.
    value = int.from_bytes(hashlib.blake2b(text, digest_size=7).digest(), "little")
    if key is not None:
        if len(_digests) > 4096:
            _digests.clear()
        _digests[key] = value
    return value


def _mismatch_message(texts: list[tuple[str, str]], what: str | None) -> str:
    names = [n for n, _ in texts]
    if len(set(names)) > 1:
        return _describe_mismatch("the mpinb collective called at this point", names) + (
            " Every rank must call the same mpinb collectives in the same order."
        )
    return _describe_mismatch(what or f"{names[0]}'s arguments", [t for _, t in texts])


def _mpi_op(op: str) -> Any:
    if op not in _OPS:
        raise ValueError(f"op must be one of {', '.join(map(repr, _OPS))}; got {op!r}.")
    return {"sum": MPI.SUM, "min": MPI.MIN, "max": MPI.MAX}[op]


def _displacements(counts: np.ndarray) -> np.ndarray:
    displs = np.zeros(len(counts), dtype=np.int64)
    np.cumsum(counts[:-1], out=displs[1:])
    return displs


def _unpickle(data: np.ndarray, counts: np.ndarray) -> list[Any]:
    out, start = [], 0
    for n in counts.tolist():
        out.append(pickle.loads(data[start : start + n].tobytes()))
        start += n
    return out


def _caller_level() -> int:
    """The ``stacklevel`` that points a warning at the first frame outside mpinb."""
    import sys

    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith("mpinb"):
        frame, level = frame.f_back, level + 1
    return level


def _affinity() -> frozenset[int]:
    try:
        return frozenset(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity API
        return frozenset(range(os.cpu_count() or 1))


def _ranks(ranks: list[int]) -> str:
    return f"{'rank' if len(ranks) == 1 else 'ranks'} {', '.join(map(str, ranks))}"
