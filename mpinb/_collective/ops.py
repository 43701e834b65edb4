"""One operation of the collective layer: its arrival, its messages, and how it gives up.

An operation starts with its *arrival*: one ``Iallreduce(MIN)`` of nine integers: a digest of the
operation's name and layout, the cell it belongs to and its place in the communicator's sequence,
each beside its negation, and three votes (each arriving as its maximum over the ranks: a stop
decision needs no message of its own). It is a barrier; a check that every rank called the same
collective with the same shapes and dtypes (a mismatch raises the same ``CollectiveMismatchError``
everywhere, before any data moves), from the same cell and at the same place (a collective of an
earlier cell never pairs with one of a later cell: the earlier one raises and the later one runs
again on a fresh communicator); and free votes (``check_all``), in one small message. The
data then move with non-blocking calls. The wire protocol is the same with and without a deadline.
"""

from __future__ import annotations

import pickle
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from mpinb._collective import protocol as _p
from mpinb._collective import texts
from mpinb._collective.protocol import VOTES
from mpinb._collective.wait import DeadlinePassed, PeerGaveUp, PeerLeft, poll
from mpinb._digest import int_digest
from mpinb.errors import CollectiveAbandoned, CollectiveMismatchError

if TYPE_CHECKING:
    from mpinb._collective.generation import Gen
    from mpinb._collective.interfaces import ChannelPort as Channel

__all__ = ["Op", "Retry", "digest_of"]

_AWAY = 0.5  # seconds an operation runs before it looks, as it finishes, whether the others gave it up


class Retry(Exception):
    """The arrival met ranks of an earlier cell: run this operation again on the next generation."""


class Op:
    """One operation in progress: its generation, deadline and messages."""

    __slots__ = ("chan", "gen", "comm", "name", "digest", "index", "cell", "timeout", "deadline", "my_votes",
                 "votes", "waited", "phase", "outcome", "began", "notice_at")

    def __init__(self, chan: Channel, gen: Gen | None, name: str, digest: int, index: int, cell: int,
                 timeout: float | None, deadline: float | None, votes: tuple[int, ...]) -> None:
        self.chan, self.gen, self.name, self.digest, self.index, self.cell = chan, gen, name, digest, index, cell
        self.comm: Any = None if gen is None else gen.comm
        self.timeout, self.deadline = timeout, deadline
        if not votes:
            self.my_votes = self.votes = _NO_VOTES
        else:
            if len(votes) > VOTES or min(votes) < 0:
                raise ValueError(f"an operation carries up to {VOTES} non-negative votes; got {votes!r}.")
            self.my_votes = self.votes = tuple(int(v) for v in votes) + (0,) * (VOTES - len(votes))
        self.waited = 0.0
        # Where the operation stands in the protocol's table (:mod:`.protocol`); every change of
        # either is a step of that table, and the status board shows it to the ranks on this host.
        self.phase: _p.Phase = _p.IDLE
        self.outcome: _p.Outcome | None = None
        self.began = chan.monotonic()
        # Read when a wait first runs long enough to need it (see notice_due): reading the
        # environment costs microseconds that every short operation would pay.
        self.notice_at: Any = _UNREAD

    @property
    def rank(self) -> int:
        return self.chan.rank

    @property
    def size(self) -> int:
        return self.chan.size

    def __enter__(self) -> Op:
        return self

    def __exit__(self, kind: Any, err: Any, tb: Any) -> None:
        if kind is not None:
            self.raised()
        if self.gen is None:
            return  # one rank: nothing claimed, nothing to leave
        try:
            if self.outcome is not None:
                return  # the operation already left through a step of the table
            if kind is None:
                note = self._given_up_meanwhile()
                if note is None:
                    self.step("finish")
                    return
                # Every message moved, but the others gave up on this operation while this rank
                # was away (stopped, descheduled): it raises with them, rather than return a
                # value they did not get.
                self.raised()
                self.step("revoked")
                raise self.chan.interrupts.instead_if_pending(texts.abandoned_error(self, note))
            # An exception between two messages of this operation (a KeyboardInterrupt, a bug): the
            # others would wait for the next message, so give the operation up for everyone.
            self.give_up("interrupt" if issubclass(kind, KeyboardInterrupt) else "raise", [], None,
                         f"raised {kind.__name__} between its messages")
        finally:
            self.chan.release()

    def _given_up_meanwhile(self) -> dict[str, Any] | None:
        """The revocation that reaches this operation, when one came while it ran long (``_AWAY``
        seconds or more: long enough for another rank to give up on it); ``None`` otherwise, and
        for every short operation, which does not look."""
        if self.chan.monotonic() - self.began < _AWAY:
            return None
        self.chan.notices()
        assert self.gen is not None, "an operation that ran long holds a place"
        note = self.gen.revoked
        return note if _p.revocation_reaches(note, self.rank, self.index) else None

    def raised(self) -> None:
        """This operation raises to its caller: the rank has been told that the cell went wrong, so
        its cell's ledger skips the cell-end comparison (:meth:`CellLedger.needs_check`)."""
        ledger = self.chan.ledger
        if ledger.cell == self.cell:
            ledger.raised = True

    def step(self, event: str) -> _p.Rule:
        """Take ``event``'s transition of the protocol table, and show it on the status board."""
        rule = _p.step(self.phase, event, self, self.chan.observer)
        board = self.chan.board
        if rule.to is not None:
            if board is not None:
                if rule.to == _p.MOVING:
                    board.phase(_p.MOVING)
                else:
                    assert self.gen is not None, "only MOVING has no place"
                    board.enter(self.gen.number, self.index, self.name, rule.to)
            self.phase = rule.to
        else:
            # A rule either goes to a phase or leaves with an outcome (the table's own check).
            outcome = rule.outcome
            assert outcome is not None
            self.phase, self.outcome = _p.IDLE, outcome
            if board is not None:
                board.leave(outcome)
        return rule

    def give_up(self, event: str, requests: list[Any], keep: Any, why: str | None,
                missing: dict[int, str] | None = None, departed: int | None = None) -> None:
        """Leave through ``event``; MPI may still use ``requests`` and ``keep``. Where the table says
        the step revokes, every other rank is told why (``why``)."""
        rule = self.step(event)
        self.chan.abandon(self, requests, keep, why, missing, departed, revoke=rule.revokes)

    def fail(self, error: BaseException) -> None:
        """Raise ``error``, which every rank raises at this point: nothing to give up."""
        if self.gen is not None:  # one rank: no protocol to step through
            self.step("fail")
        raise error

    def notice_due(self, now: float) -> bool:
        """Whether this rank should now say whom it waits for (``MPINB_WAIT_NOTICE``)."""
        if self.notice_at is _UNREAD:
            after = self.chan.runtime.notice_after()
            self.notice_at = None if after is None else self.began + after
        return self.notice_at is not None and now >= self.notice_at

    def tell_waiting(self) -> None:
        """Say, on this rank's stderr (the cell's output), whom it waits for and where they are."""
        waited = self.chan.monotonic() - self.began
        print(texts.waiting_notice(self, waited), file=sys.stderr, flush=True)
        self.notice_at = self.chan.monotonic() + max(30.0, waited)  # then less and less often

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
        chan = self.chan
        mpi_op = _mpi_op(chan.mpi_ops, op)
        post: list[tuple[Any, np.ndarray]] = [(chan.mpi.IN_PLACE, b) for b in buffers if b.size]
        post += [(s, r) for s, r in pairs if s.size]
        if chan.crowded:
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
        gathered = self._pickled(obj, None)
        assert gathered is not None, "an all-gather delivers to every rank"
        return gathered

    def gather(self, obj: Any, root: int) -> list[Any] | None:
        """Every rank's object, pickled, in rank order, on ``root`` (``None`` elsewhere)."""
        return self._pickled(obj, root)

    def _pickled(self, obj: Any, root: int | None) -> list[Any] | None:
        """Both object gathers: each rank's pickle as a block of bytes (``root=None``: to every rank)."""
        if self.size == 1:
            return [obj]
        data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8)
        gathered = self.gather_blocks(data, root)
        return None if gathered is None else _unpickle(*gathered)

    def gather_blocks(self, block: np.ndarray, root: int | None) -> tuple[np.ndarray, np.ndarray] | None:
        """Every rank's block of rows (axis 0; any length, the same trailing shape and dtype),
        concatenated in rank order, with each rank's row count; on ``root`` (``None`` elsewhere;
        ``root=None``: on every rank). The one count-then-blocks protocol: the counts travel first,
        then the blocks in one ``Gatherv`` (``Allgatherv``)."""
        rows = self.gather_ints(np.array([block.shape[0]], dtype=np.int64), root)
        if rows is None:
            self.gatherv(block.reshape(-1), None, None, root)
            return None
        rows = rows[:, 0]
        out = np.empty((int(rows.sum()), *block.shape[1:]), dtype=block.dtype)
        self.gatherv(block.reshape(-1), out.reshape(-1), rows * int(np.prod(block.shape[1:], dtype=np.int64)), root)
        return out, rows

    def gather_ints(self, values: np.ndarray, root: int | None) -> np.ndarray | None:
        """Every rank's equal-length int64 vector as rows of a ``(size, n)`` array, on ``root``
        (``None`` elsewhere; ``root=None``: on every rank)."""
        values = np.ascontiguousarray(values, dtype=np.int64)
        here = root is None or self.rank == root
        out = np.empty((self.size, values.size), dtype=np.int64) if here else None
        if self.size == 1:
            assert out is not None  # one rank is every root
            out[0] = values
            return out
        request = (self.comm.Iallgather(values, out) if root is None else self.comm.Igather(values, out, root=root))
        self._wait([request], (values, out))
        return out

    def gatherv(self, send: np.ndarray, recv: np.ndarray | None, counts: np.ndarray | None, root: int | None) -> None:
        """Variable-length blocks into ``recv`` on ``root`` (``None``: on every rank)."""
        if self.size == 1:
            assert recv is not None  # one rank is every root
            recv[: send.size] = send
            return
        spec = None if recv is None or counts is None else [recv, (counts, _displacements(counts))]
        request = (self.comm.Iallgatherv(send, spec) if root is None else self.comm.Igatherv(send, spec, root=root))
        self._wait([request], (send, spec))

    # -- arrival and waiting -----------------------------------------------------------------
    def arrive(self, layout: Any, what: str | None) -> None:
        # A fresh array each time: an abandoned arrival's buffer stays with MPI (``Gen.pending``).
        header = _p.arrival_header(self.digest, self.cell, self.index, self.my_votes)
        chan = self.chan
        mpi, monotonic = chan.mpi, chan.monotonic
        t0 = monotonic()
        self._wait([self.comm.Iallreduce(mpi.IN_PLACE, header, op=mpi.MIN)], header, chan.spin)
        self.waited = monotonic() - t0
        arrival = _p.decide_arrival(header.tolist(), self.cell)  # Python ints: cheaper to compare
        self.votes = arrival.votes
        verdict = arrival.verdict
        if verdict == "go":
            self.step("arrived")
            return
        if verdict == "abandoned":
            self._completed_by_an_abandoner()
        if verdict in ("earlier cell", "later cell"):
            # Every rank saw the same header, so every rank retires this generation here, without
            # a message; the later cell's ranks run the operation again on the next one, where the
            # earlier cell's ranks will join them from their next cell.
            self.step("retire")
            self.chan.retire(self, f"met a rank of another cell in {self.name} #{self.index}")
            if verdict == "earlier cell":
                raise texts.later_cell_error(self)
            raise Retry
        if verdict == "sequence":
            self.step("retire")
            self.chan.retire(self, f"sequence numbers #{arrival.low}-#{arrival.high} met")
            raise RuntimeError(
                f"mpinb's collective sequence differs across ranks at {self.name} (#{arrival.low} to "
                f"#{arrival.high}); this is a bug in mpinb. Every rank moves to a fresh communicator."
            )
        # "mismatch": the ranks agree that they differ; what each called travels as data.
        self.step("arrived")
        shown = getattr(layout, "detail", None) or (layout if isinstance(layout, str) else repr(layout))
        ledger = self.chan.ledger
        texts_ = self.allgather((self.name, shown, ledger.describe() if ledger.cell == self.cell and self.cell else ""))
        self.fail(CollectiveMismatchError(texts.mismatch_message(texts_, what)))

    def _completed_by_an_abandoner(self) -> None:
        """A rank that knew this generation was abandoned completed the arrival (see
        :func:`abandoned_header`): run again on the next generation if this operation belongs to a
        later cell than the abandoned one, else raise as the others did -- never move data here."""
        self.step("retire")
        assert self.gen is not None, "an arrival completed on a generation"
        try:
            note = self.chan.await_revocation(self.gen)
        finally:
            # Also when Ctrl-C comes while waiting for the notice: a generation this rank does not
            # retire here, it would run its next collective on, alone (found by the protocol model).
            self.chan.retire(self, f"{self.name} #{self.index} was abandoned by another rank")
        if note is None or note["rank"] == self.chan.rank:
            raise CollectiveAbandoned(
                f"{self.name} #{self.index} stopped on rank {self.chan.rank}: another rank had given up on this "
                f"collective. {texts.NEXT}", operation=self.name, reason="abandoned", rank=self.chan.rank,
            )
        if _p.of_a_later_cell(note, self.cell) or _p.outside_scope(note, self.chan.scope):
            raise Retry
        raise self.chan.interrupts.instead_if_pending(
            texts.stale_error(self.name, self.index, self.chan.rank, note, self.chan.wall()))

    def _wait(self, requests: list[Any], keep: Any, spin: float | None = None) -> None:
        try:
            poll(self.chan, requests, self.deadline, spin=spin, op=self)
        except DeadlinePassed:
            error = texts.timeout_error(self, self.phase)
            self.give_up("deadline", requests, keep, f"timed out after {self.timeout:g} s", error.missing)
            raise error from None
        except PeerGaveUp as gave_up:
            arriving = self.phase == _p.ARRIVING
            self.give_up("revoked", requests, keep, None)
            if arriving and (_p.of_a_later_cell(gave_up.note, self.cell)
                             or _p.outside_scope(gave_up.note, self.chan.scope)):
                # Its arrival met, at the same place, a collective of an earlier cell that a rank
                # gave up on (this rank left that cell before it), or the next collective of a rank
                # that raised after the last one of an mpinb call this rank has left.
                raise Retry from None
            raise self.chan.interrupts.instead_if_pending(texts.abandoned_error(self, gave_up.note)) from None
        except PeerLeft as left:
            why = f"rank {left.rank} {left.what}"
            self.give_up("left", requests, keep, why, departed=left.rank)
            raise texts.left_error(self, left.rank, why) from None
        except BaseException as err:
            # Ctrl-C (or cluster.interrupt()) while waiting: MPI may still write into the buffers.
            interrupted, phase = isinstance(err, KeyboardInterrupt), self.phase
            self.give_up("interrupt" if interrupted else "raise", requests, keep,
                         f"was interrupted ({type(err).__name__})")
            if interrupted:  # Python's own says nothing: say where this rank waited, and for whom
                raise texts.interrupted_error(self, phase) from None
            raise


_NO_VOTES = (0,) * VOTES
_UNREAD: Any = object()  # Op.notice_at before MPINB_WAIT_NOTICE is read
_digests: dict[Any, int] = {}


def digest_of(name: str, layout: Any) -> int:
    """The arrival's digest of an operation's name and layout."""
    key: Any = (name, layout)
    try:
        return _digests[key]
    except KeyError:
        pass
    except TypeError:  # unhashable layout: digest its repr every time
        key = None
    value = int_digest(repr((name, layout)).encode())
    if key is not None:
        if len(_digests) > 4096:
            _digests.clear()
        _digests[key] = value
    return value


def _mpi_op(ops: dict[str, Any], op: str) -> Any:
    """The MPI op of ``ops`` (the channel's, built once) a message reduces with."""
    try:
        return ops[op]
    except KeyError:
        raise ValueError(f"op must be one of {', '.join(map(repr, ops))}; got {op!r}.") from None


def _displacements(counts: np.ndarray) -> np.ndarray:
    displs = np.zeros(len(counts), dtype=np.int64)
    np.cumsum(counts[:-1], out=displs[1:])
    return displs


def _unpickle(data: np.ndarray, counts: np.ndarray) -> list[Any]:
    """The objects pickled in consecutive blocks of ``data``, of ``counts`` bytes each."""
    out, start = [], 0
    for n in counts.tolist():
        out.append(pickle.loads(data[start : start + n].tobytes()))
        start += n
    return out

