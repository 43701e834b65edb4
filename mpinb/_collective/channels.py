"""A channel: mpinb's private communicators for one user communicator, their generations and notices.

- On first use a channel duplicates the user's communicator twice, without blocking: a control
  communicator for point-to-point notices, and the data communicator the operations run on
  (generation 0). It then exchanges each rank's host, CPU affinity, engine id and status-board
  file (:mod:`mpinb._collective.board`), so that from then on a rank that gives up can say where
  every missing rank on its host is, even for the first collective after set-up.
- A rank that abandons a wait (deadline, Ctrl-C, a rank it waits for left the cell) *revokes* the
  generation: it keeps the abandoned requests and their buffers alive, sends a small notice to
  every other rank on the control communicator (down a tree: :mod:`mpinb._collective.notices`)
  and starts a non-blocking duplicate of the user's communicator, the next generation. A rank
  waiting in the revoked generation raises :class:`CollectiveAbandoned` naming who gave up on
  what. A rank that was elsewhere completes the abandoned arrival for the others and runs its next collective on
  the new generation -- unless that collective *is* the abandoned one, come late: then it raises at once, so it
  never pairs with another call. So the next cell works, and engine state survives: no restart.
- On an IPython engine the channel follows the cells (:mod:`mpinb._collective.cells`): each rank
  writes on its board row which cell it runs and how its last one ended, and tells the ranks on
  other hosts with a notice; a rank waiting for a rank that has left the cell stops waiting.
"""

from __future__ import annotations

import os
import threading
import warnings
from types import FrameType
from typing import Any

from mpinb._collective import board as _board
from mpinb._collective import cells, texts
from mpinb._collective import notices as _notices
from mpinb._collective import protocol as _p
from mpinb._collective.generation import Gen
from mpinb._collective.ops import Op, Retry, digest_of
from mpinb._collective.runtime import PROCESS, Runtime
from mpinb._collective.wait import DeadlinePassed, PeerLeft, poll
from mpinb.deadline import DEFAULT, resolve
from mpinb.errors import CollectiveAbandoned

__all__ = ["Channel", "Gen"]


class Channel:
    """mpinb's private communicators for one user communicator, and their bookkeeping, in the
    process ``runtime`` describes (:mod:`.runtime`; by default this one)."""

    def __init__(self, parent: Any, runtime: Runtime = PROCESS) -> None:
        self.runtime = runtime
        # What the waits and operations call, bound once: the seam costs no lookup per call.
        self.mpi = mpi = runtime.mpi
        self.mpi_ops = {"sum": mpi.SUM, "min": mpi.MIN, "max": mpi.MAX}
        self.monotonic, self.wall, self.time_ns = runtime.monotonic, runtime.wall, runtime.time_ns
        self.sleep, self.sched_yield, self.pace = runtime.sleep, runtime.sched_yield, runtime.pace
        self.spin = runtime.pace.spin
        self.interrupts, self.current_cell = runtime.interrupts, runtime.cell
        self.observer, self.plans = runtime.observer, runtime.plans
        self.parent = parent
        self.rank, self.size = parent.Get_rank(), parent.Get_size()
        host = runtime.hostname()
        self.hosts = [host] * self.size
        self.affinity: list[frozenset[int]] = [runtime.affinity()] * self.size
        self.engines: list[int | None] = [cells.engine_id()] * self.size
        self.ctrl: Any = None
        self._ctrl_pending: tuple[Any, Any] | None = None  # (communicator, Idup request) until complete
        self.gens: list[Gen] = []
        self.active = 0
        self.board: _board.Board | None = None
        self.ready = self.size == 1
        self.crowded = False  # more ranks on this host than cores: waiting ranks yield at once
        self.closed = False
        self._setting_up = False
        self._sends: list[Any] = []
        self._remote_cells: dict[int, _board.CellRecord] = {}  # ranks on other hosts, from their notices
        self.ledger = _p.CellLedger()  # this rank's collectives in the current cell
        # The outermost mpinb call (fit, evaluate) in progress here: its name and count on this
        # channel, the same on every rank (every rank makes the same calls), and how deeply nested.
        self.scope: tuple[str, int] | None = None
        self.calls = self.depth = 0
        # The thread whose operation is in progress: MPI pairs a rank's calls by their order on the
        # communicator, so a second thread's call would interleave with the first one's messages.
        self._owner: int | None = None
        self._owner_lock = threading.Lock()

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
            self._set_up("mpinb set-up", seconds, None if seconds is None else self.monotonic() + seconds)

    # -- operations -----------------------------------------------------------------------------
    def begin(self, name: str, layout: Any = None, *, timeout: Any = DEFAULT, votes: tuple[int, ...] = (),
              what: str | None = None) -> Op:
        seconds = resolve(timeout)  # checked at one rank too, so a bad value fails the same everywhere
        cell = self.current_cell()
        if self.size == 1:
            return Op(self, None, name, 0, 0, cell.id, None, None, votes)
        deadline = None if seconds is None else self.monotonic() + seconds
        self.collect()
        self._set_up(name, seconds, deadline)
        self._check_targets(name, cell)
        self._claim(name)
        if cell.id and name != _p.CELL_END:
            self.ledger.record(cell.id, name, _user_site)
        digest = digest_of(name, layout)
        op = None
        try:
            while True:
                self._expect_notices()
                op = Op(self, None, name, digest, 0, cell.id, seconds, deadline, votes)
                gen = self._current(op)
                gen.index += 1
                op.gen, op.comm, op.index = gen, gen.comm, gen.index
                op.step("enter")
                try:
                    op.arrive(layout, what)
                except Retry:
                    continue  # on the next generation, with the ranks of this cell
                return op  # released by the operation's __exit__
        except BaseException as err:
            if op is not None:
                op.__exit__(type(err), err, None)
            self.release()
            raise

    def _claim(self, name: str) -> None:
        """Make the calling thread the one whose operation is in progress, or raise at once: two
        threads of one rank in collectives of one communicator would pair wrongly or hang."""
        me = threading.get_ident()
        with self._owner_lock:
            owner = self._owner
            if owner is not None and owner != me and any(t.ident == owner for t in threading.enumerate()):
                raise RuntimeError(texts.second_thread_error(name, self.rank, owner))
            self._owner = me

    def release(self) -> None:
        """The operation in progress has ended (its ``__exit__``)."""
        self._owner = None

    def _check_targets(self, name: str, cell: cells.Cell) -> None:
        """A cell sent to only some engines cannot run a collective of every rank: say so before
        sending anything (every rank that runs the cell decides alike)."""
        if cell.targets is None or None in self.engines:
            return
        outside = [r for r, engine in enumerate(self.engines) if engine not in cell.targets]
        if outside:
            raise texts.not_in_cell_error(name, self.rank, outside, self.engines, cell.targets)

    # -- set-up -----------------------------------------------------------------------------------
    def _set_up(self, name: str, seconds: float | None, deadline: float | None) -> None:
        if self.ctrl is None:
            if self._ctrl_pending is None:
                self._ctrl_pending = self.parent.Idup()
                self.gens.append(Gen(0, *self.parent.Idup()))
            waits = [self._ctrl_pending[1], self.gens[0].request]
            try:
                poll(self, waits, deadline, spin=self.spin)
            except DeadlinePassed:
                assert seconds is not None  # a deadline passes only when there is one
                raise texts.setup_timeout(name, seconds, self.rank) from None
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
                self.board = _board.Board(self.runtime)
            except OSError:
                self.board = None  # no writable shared folder: collectives work, timeouts say less
        path = None if self.board is None else self.board.path
        timeout = DEFAULT if seconds is None else seconds
        mine = (self.hosts[self.rank], sorted(self.affinity[self.rank]), path, self.engines[self.rank])
        with self.begin("mpinb set-up", timeout=timeout) as op:
            table = op.allgather(mine)
        self.hosts = [h for h, _, _, _ in table]
        self.affinity = [frozenset(a) for _, a, _, _ in table]
        self.engines = [e for _, _, _, e in table]
        self.crowded = len(self.local_ranks()) > len(self.host_cores())
        if self.board is not None:
            self.board.open_peers({r: p for r, (h, _, p, _) in enumerate(table)
                                   if r != self.rank and p is not None and h == self.host},
                                  leader=self.local_ranks()[0])
        with self.begin("mpinb set-up", timeout=timeout):
            pass  # every rank has opened its neighbours' rows: the names can go
        if self.board is not None:
            self.board.unlink()
            self.board.enter(self.gens[self.active].number, 0, "mpinb set-up", _board.IDLE)
            self.board.leave(_board.DONE)
            cell = self.current_cell()
            if cell.id:
                self.board.cell_begin(cell.id)
        # The user's collectives are numbered from 1 (every rank resets at the same point).
        self.gens[self.active].index = 0
        self.ready = True

    # -- generations ------------------------------------------------------------------------------
    def _current(self, op: Op) -> Gen:
        """The generation to run ``op`` on, after moving past revoked ones (each Idup polled). Raises
        at once when ``op`` is a collective another rank abandoned, come late."""
        while True:
            gen = self.gens[self.active]
            if gen.request is not None:
                # Waiting for every rank to post the next duplicate: a rank that has left the cell
                # will not, so it is watched for as in any arrival.
                op.gen, op.comm = gen, gen.comm
                op.step("switch")
                try:
                    poll(self, [gen.request], op.deadline, spin=self.spin, op=op)
                except DeadlinePassed:
                    op.step("deadline")
                    raise texts.switch_timeout(self, op.name, op.timeout, gen, op.cell) from None
                except PeerLeft as left:
                    op.step("left")
                    raise texts.switch_left_error(op.name, self.rank, left.rank, left.what) from None
                except BaseException as err:
                    op.step("interrupt" if isinstance(err, KeyboardInterrupt) else "raise")
                    raise
                gen.request = None
            if gen.revoked is None:
                return gen
            stale = self._leave(gen, op.name, op.digest, op.cell)
            self.active += 1
            if stale is not None:  # raised before waiting for the next generation: the others may be idle
                op.step("stale")
                raise self.interrupts.instead_if_pending(stale)

    def _leave(self, gen: Gen, name: str, digest: int, cell: int) -> BaseException | None:
        note = gen.revoked
        assert note is not None
        gen.left = True
        complete, late = _p.late_arrival(note, gen.index, self.rank, cell, digest, self.scope)
        if complete:
            # This rank never reached the abandoned collective, so the others' arrivals are still
            # pending: complete them with a matching arrival, so MPI holds no request for ever.
            header = _p.abandoned_header()
            gen.pending.append(([gen.comm.Iallreduce(self.mpi.IN_PLACE, header, op=self.mpi.MIN)], header))
        stale = texts.stale_error(name, note["index"], self.rank, note, self.wall()) if late else None
        if stale is None and not gen.abandoned_here and note["rank"] != self.rank and note.get("departed") != self.rank:
            warnings.warn(texts.elsewhere_warning(note, self.rank), RuntimeWarning, stacklevel=_caller_level())
        self.collect()
        return stale

    def _expect_notices(self) -> None:
        """Take in the notices the host's shared word announces. A notice can sit in MPI's queues
        until the receiver has made progress a few times, so a rank entering its next collective
        could miss it; on one host the word says one is due. Across hosts, notices arrive as MPI
        delivers them (within a rank's next few collectives)."""
        board = self.board
        if board is None or board.host_revoked() <= self._known_revoked():
            return
        give_up = self.monotonic() + 5.0  # the notice was sent before the word was written
        while board.host_revoked() > self._known_revoked() and self.monotonic() < give_up:
            self.notices()
            if board.host_revoked() > self._known_revoked():
                self.sleep(1e-5)

    def _known_revoked(self) -> int:
        for gen in reversed(self.gens):
            if gen.revoked is not None:
                return gen.number + 1
        return 0

    def _post_next(self) -> None:
        newest = self.gens[-1]
        self.gens.append(Gen(newest.number + 1, *self.parent.Idup()))

    def abandon(self, op: Op, requests: list[Any], keep: Any, why: str | None,
                missing: dict[int, str] | None = None, departed: int | None = None, *, revoke: bool = True) -> None:
        """Give up on ``op``, keeping ``requests`` and ``keep`` while MPI may use them; with ``revoke``,
        tell every other rank why (``why``). A rank whose deadline passed sends the ranks it was
        waiting for along, so that the others name them too."""
        gen = op.gen
        assert gen is not None, "only an operation that holds a place is abandoned"
        gen.pending.append((requests, keep))
        gen.abandoned_here = True
        if gen.revoked is not None or not revoke:
            return
        gen.revoked = note = {"gen": gen.number, "index": op.index, "name": op.name, "rank": self.rank,
                              "why": why or "abandoned", "time": self.wall(), "missing": missing,
                              "timeout": op.timeout, "cell": op.cell, "digest": op.digest, "departed": departed}
        if departed is not None:
            # Where it ended its cell, as this rank saw it: a rank on another host may hear of the
            # revocation before that rank's own cell-end note (the cell-end comparison needs it).
            record = self.cell_record(departed)
            if record is not None:
                note["ended"] = (record.ended_cell, record.ended_gen, record.ended_index)
        self._sends += _notices.start(self.ctrl, _notices.REVOKED, self.rank, note, self.hosts, self._host_peers())
        if self.board is not None:
            self.board.mark_revoked(gen.number)
        self._post_next()

    def _host_peers(self) -> tuple[int, ...]:
        """The other ranks on this host: a revocation goes to each of them directly. One outside the
        collective passes nothing on until its next one; one stopped inside it (SIGSTOP, a long C
        call) must find the note in its buffers when it resumes, not wait for a relay that went
        idle after raising (the protocol model's case: it would return a value the others gave up)."""
        if self.board is None:
            return ()
        return tuple(r for r in self.local_ranks() if r != self.rank)

    def retire(self, op: Op, why: str) -> None:
        """End ``op``'s generation on this rank without a notice: every rank decides so at the same
        point, from the same arrival (the arrival completed, so nothing is pending)."""
        gen = op.gen
        assert gen is not None, "only an operation that holds a place is retired"
        gen.abandoned_here = True
        if gen.revoked is None:
            gen.revoked = {"gen": gen.number, "index": op.index, "name": op.name, "rank": self.rank, "why": why,
                           "time": self.wall(), "missing": None, "timeout": op.timeout, "cell": op.cell,
                           "digest": op.digest}
            self._post_next()

    def await_revocation(self, gen: Gen, seconds: float = 5.0) -> dict[str, Any] | None:
        """The notice that revoked ``gen``, waiting up to ``seconds`` for it (it was sent before any
        rank could complete an arrival as abandoned)."""
        give_up = self.monotonic() + seconds
        while gen.revoked is None and self.monotonic() < give_up:
            self.notices()
            if gen.revoked is None:
                self.sleep(1e-4)
        return gen.revoked

    def notices(self) -> None:
        """Take in every notice that has arrived, passing each on down its tree; a revocation notice
        ends its generation here too."""
        ctrl = self.ctrl
        if ctrl is None:
            return
        mpi = self.mpi
        status = mpi.Status()  # per call: a fit on a background thread and the idle tick may both look
        while True:
            # The first probe may only pull arrived messages into MPI's queue (MPICH over UCX), so
            # an empty answer is asked once more.
            message = ctrl.improbe(source=mpi.ANY_SOURCE, tag=mpi.ANY_TAG, status=status)
            if message is None:
                message = ctrl.improbe(source=mpi.ANY_SOURCE, tag=mpi.ANY_TAG, status=status)
                if message is None:
                    return
            tag = status.Get_tag()
            sends, note = _notices.forward(ctrl, tag, message.recv(), self.rank, self.hosts)
            self._sends += sends
            if tag == _notices.CELL_END:
                self._remote_cells[note[0]] = _board.CellRecord(*note[1:])
                continue
            gen = next((g for g in self.gens if g.number == note["gen"]), None)
            if gen is not None and gen.revoked is None and not self.closed:
                gen.revoked = note
                self._post_next()

    def collect(self) -> None:
        """Drop finished sends and abandoned requests; free generations nothing uses any more."""
        self.notices()
        if self._sends:
            self._sends = [s for s in self._sends if not s.Test()]
        if len(self.gens) == 1 and not self.gens[0].pending:
            return
        for gen in self.gens:
            if gen.pending:
                gen.pending = [(reqs, keep) for reqs, keep in gen.pending if not self.mpi.Request.Testall(reqs)]
            if gen.left and not gen.pending and not gen.freed and gen.comm is not None:
                gen.comm.Free()  # local in MPICH and Open MPI; every rank frees each generation once
                gen.freed = True

    def close(self) -> None:
        """Free the private communicators (at exit, or when the user's communicator is freed)."""
        # Ranks further down a note's tree hear of it only through this one: pass on what has
        # arrived (closed first: a revocation no longer starts a duplicate now), and let the small
        # sends finish (they are eager: at once, unless MPI is stuck).
        self.closed = True
        self.notices()
        give_up = self.monotonic() + 1.0
        while self._sends and self.monotonic() < give_up:
            self._sends = [s for s in self._sends if not s.Test()]
            if self._sends:
                self.sleep(1e-4)
        for gen in self.gens:
            if not gen.freed and gen.request is None and not gen.pending:
                gen.comm.Free()
                gen.freed = True
        if self.ctrl is not None and not self._sends:
            self.ctrl.Free()
            self.ctrl = None
        if self.board is not None:
            self.board.unlink()

    # -- cells ----------------------------------------------------------------------------------
    def on_cell(self, event: str, cell: cells.Cell, error: BaseException | None) -> None:
        """Record a cell's beginning or end where the other ranks look (board, notices)."""
        if not self.ready or self.closed or self.size == 1:
            return
        if event == "begin":
            if self.board is not None:
                self.board.cell_begin(cell.id)
            return
        gen = self.gens[self.active]
        text = cells.describe_error(error)
        if self.board is not None:
            self.board.cell_end(cell.id, gen.number, gen.index, text)
        if self.ctrl is not None and any(h != self.host for h in self.hosts):
            note = (self.rank, cell.id, False, cell.id, gen.number, gen.index, self.time_ns(), text)
            self._sends += _notices.start(self.ctrl, _notices.CELL_END, self.rank, note, self.hosts)
            self._sends = [s for s in self._sends if not s.Test()]

    def end_cell_check(self, cell: cells.Cell) -> None:
        """Compare this cell's collectives with every other rank's, as the cell ends without an error
        here (collective; see :class:`~mpinb._collective.protocol.CellLedger`). A rank that made fewer or
        more collectives meets the others at a different operation, and every rank raises
        :class:`~mpinb.CollectiveMismatchError` naming what each made. A rank whose cell ended with an
        error after the same number of collectives does not take part: the others return."""
        ledger = self.ledger
        if self.size == 1 or not self.ready or self.closed or not cell.id or not ledger.needs_check(cell.id):
            return
        layout = _CellRecord(ledger.layout(), ledger.describe())
        last = self.gens[self.active]
        here = (last.number, last.index)  # the place of this rank's last collective
        try:
            with self.begin(_p.CELL_END, layout, what="the collectives of this cell"):
                pass
        except CollectiveAbandoned as err:
            # The note that ended the comparison: on the generation still active where this rank
            # was told while waiting, the one before where it was told on entry.
            note = next((g.revoked for g in reversed(self.gens) if g.revoked is not None), None)
            same = note is not None and note["name"] == _p.CELL_END and note.get("cell") == cell.id \
                and note.get("digest") == digest_of(_p.CELL_END, layout)
            if note is not None and note.get("departed") is None:
                if same:
                    # The rank that gave up had made the same collectives: it was interrupted in
                    # the comparison, or met there from its next cell.
                    return
                raise  # it gave up on an earlier collective (one this rank completed): nothing diverged
            if err.by is not None and self.board is not None and self.hosts[err.by] == self.host \
                    and not self.board.alive(err.by):
                raise  # it died: that is all this rank knows, and what it says
            ended = None if note is None else note.get("ended")
            if same and ended is not None and ended[0] == cell.id and tuple(ended[1:]) >= here:
                # It ended its cell at this rank's last place (after an error: no comparison) or
                # later (after its comparison was given up): it skipped none of these collectives.
                return
            record = None if err.by is None else self.cell_record(err.by)
            raise texts.cell_divergence_error(self.rank, err.by, record, ledger) from None

    def cell_record(self, rank: int) -> _board.CellRecord | None:
        """Where ``rank`` is in the cells: its board row on this host, its last notice elsewhere."""
        if self.hosts[rank] == self.host and self.board is not None:
            record = self.board.read_cell(rank)
            if record is not None:
                return record
        return self._remote_cells.get(rank)

    def departed(self, op: Op) -> tuple[int, str] | None:
        """A rank ``op`` waits for that has left ``op``'s cell without entering ``op``, and what it did."""
        cell = op.cell
        if not cell:
            return None
        # While it moves to a fresh generation an operation has no place yet: it will take the next
        # one, and a rank that ended its cell at the generation's current place never entered it
        # (it gave up while moving too: found by the protocol model).
        gen = op.gen
        assert gen is not None, "an operation that waits holds a place"
        here = (gen.number, op.index or gen.index + 1)
        waited = self.monotonic() - op.began
        now_ns = self.time_ns()
        current = self.current_cell()
        sent = current.targets if current.id == cell and None not in self.engines else None
        for r in range(self.size):
            if r == self.rank:
                continue
            if self.board is not None and self.hosts[r] == self.host and not self.board.alive(r):
                return r, "died (its process is gone)"
            patience = _p.idle_patience(sent, self.engines[r])
            why = _p.departure(self.cell_record(r), cell, here, waited, now_ns, patience)
            if why is not None:
                return r, why
        return None

    def raised_between(self, error: BaseException, where: str) -> None:
        """This rank's own code raised ``error`` in the mpinb call ``where``, between two operations
        of this channel, in a script (see :func:`mpinb._collective.collective_call`): revoke the
        generation at the place this rank will not take, naming itself and its error, so that a rank
        waiting there (or arriving later from the same call) raises at once, and complete the
        arrivals the others post there. A rank that finds that place revoked already (another rank
        raised there too) only completes them. In a cell the cell-end path names it instead; and
        where an operation is in progress (another thread's), that operation gives up for itself."""
        if self.size == 1 or not self.ready or self.closed or self._owner is not None or self.current_cell().id:
            return
        self.notices()
        gen = self.gens[self.active]
        if gen.request is not None:
            return  # it failed while moving to a fresh communicator: the move's own waits name it
        place = gen.index + 1
        note = gen.revoked
        if note is None:
            gen.revoked = note = {"gen": gen.number, "index": place, "name": where, "rank": self.rank,
                                  "why": texts.raised_between_why(error, where), "time": self.wall(), "missing": None,
                                  "timeout": None, "cell": 0, "digest": None, "departed": None, "scope": self.scope}
            self._sends += _notices.start(self.ctrl, _notices.REVOKED, self.rank, note, self.hosts,
                                          self._host_peers())
            if self.board is not None:
                self.board.mark_revoked(gen.number)
            self._post_next()
        elif note["index"] != place:
            return  # given up at a place this rank has taken: it was told, or told the others
        # This rank takes that place with an arrival that says so: the ranks that posted theirs are
        # released (and none is left pending when this rank exits without another collective).
        gen.abandoned_here = True
        gen.index = place
        header = _p.abandoned_header()
        gen.pending.append(([gen.comm.Iallreduce(self.mpi.IN_PLACE, header, op=self.mpi.MIN)], header))


class _CellRecord(str):
    """The cell-end operation's layout: compared as its text (count and digest of the names), shown
    in a mismatch with ``detail`` (each collective's call site)."""

    detail: str

    def __new__(cls, text: str, detail: str) -> _CellRecord:
        self = super().__new__(cls, text)
        self.detail = detail
        return self


def _user_site() -> str:
    """The user's line that called the collective being recorded: ``"line 3 of the cell"`` or
    ``"train.py:41"`` (the innermost frame outside mpinb)."""
    import sys

    frame: FrameType | None = sys._getframe(2)
    while frame is not None and frame.f_globals.get("__name__", "").startswith("mpinb"):
        frame = frame.f_back
    if frame is None:
        return "unknown line"
    name = frame.f_code.co_filename
    if name.startswith("<") or "ipykernel" in name or "/ipython-input" in name:
        return f"line {frame.f_lineno} of the cell"
    return f"{os.path.basename(name)}:{frame.f_lineno}"


def _caller_level() -> int:
    """The ``stacklevel`` that points a warning at the first frame outside mpinb."""
    import sys

    frame: FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith("mpinb"):
        frame, level = frame.f_back, level + 1
    return level
