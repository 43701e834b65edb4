"""A deterministic simulator of mpinb's collective layer: the protocol model.

N ranks run in one process, each in a greenlet, each calling the real layer (``mpinb.allreduce`` ->
:class:`~mpinb._collective.channels.Channel`, :class:`~mpinb._collective.ops.Op`, ``poll``, the
protocol table) over a simulated MPI and a virtual clock: no MPI, no threads, no sleeps. A
collective completes for a rank, and a notice reaches a rank, only when the scheduler says so; a
rank runs only when the scheduler picks it. Every step is one choice among the enabled ones, so a
run is a function of its choices: :mod:`explore` enumerates every combination of the first few
(a bounded exhaustive search, for small worlds) and draws them by seeded random walks (for larger
ones), and a failing run replays exactly from its choice list. After every step the simulator
checks what can fail at once (a step missing from the protocol table, two different collectives
matched by MPI, a timeout that does not name a stopped rank); each time the virtual clock moves,
the invariants of time (every call with a deadline ends by it plus :data:`SLACK`; a rank whose wait
another rank decided -- by revoking the generation at or before its place, by ending its cell or
dying before entering its operation -- leaves it within :data:`BOUND`); at the end of a run, the
guarantees of :func:`oracle.invariant_violations`, the invariants of truth (an
error names a rank that left, raised, was stopped or differed; a mismatch needs programs that
differ; where the only fault came after the last collective, the other ranks' cells end without an
error), the recovery of the next cell and requests left pending on a communicator. A run has a
budget (:data:`T_MAX` virtual seconds, :data:`STEPS_PER_RANK` steps a rank): past it, the run is a
violation, so a protocol made slow or busy is reported, not left to run out the tier's time.

What is simulated, not run: MPI (collectives matched by order on a communicator, each rank's request
completing on its own; point-to-point messages delivered in order per pair), the status board (the
real :class:`Board` over memory, not a file; a dead rank's process check), and the engines' cells.
The channel is built already set up (the set-up exchange is proven by the ``mpi`` tier).

The simulator reaches the layer through one seam: each rank's channel is given a
:class:`~mpinb._collective.runtime.Runtime` of its own (a simulated MPI, the virtual clock, sleeps
and yields that hand the core to the scheduler, the rank's cell, its held-back Ctrl-C, its fused
plans, a coarser :class:`~mpinb._collective.runtime.Pace`, and an observer of every protocol step).
Nothing of the layer is patched. What the simulator still touches: it registers each rank's channel
in the layer's registry of channels by communicator (``mpinb._collective._channels``: what the
first collective on a real communicator does, here for channels built already set up) and removes
them after the run, and it silences the layer's warnings for the run (``warnings.catch_warnings``).
"""

from __future__ import annotations

import math
import pickle
import warnings
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import greenlet
import numpy as np
from oracle import CallOutcome, GiveUp, invariant_violations

import mpinb
from mpinb import _collective
from mpinb._collective import board as _board
from mpinb._collective import cells as _cells
from mpinb._collective import channels as _channels
from mpinb._collective import ops as _ops
from mpinb._collective import protocol as _p
from mpinb._collective.runtime import Pace, Runtime
from mpinb.errors import CollectiveAbandoned, CollectiveMismatchError, CollectiveTimeout
from mpinb.interrupt import INTERRUPT_GRACE, Interrupts

TICK = 0.01  # virtual seconds a rank that yields the core waits before it runs again unasked
IDLE_TICK = 0.05  # an engine idle between cells looks at its notices this often (as ``_IDLE_NOTICES``)
BOUND = 1.0  # a rank whose wait another rank decided is released within this (the promise)
SLACK = 0.1  # a call with a deadline ends within this past it (the simulated pauses are at most 0.05 s)
# The budget of one schedule: a run that has not ended by then is reported as a violation (a hang, or
# waits grown slow or busy), never left to eat the tier's time. Measured over 14,356 random walks at
# 2-16 ranks: every run ended by 3.6 virtual seconds, and within 231, 456, 674, 900, 1,579 and 3,547
# steps at 2, 3, 4, 5, 8 and 16 ranks (about 220 a rank).
T_MAX = 10.0  # virtual seconds
STEPS_PER_RANK = 1_000


class Violation(BaseException):
    """A broken guarantee, found while or after running a schedule (a BaseException, so that no
    handler of the layer or of a cell takes it for the user's error)."""


class Stop(BaseException):
    """Ends a rank's greenlet when the run is over."""


# -- simulated MPI --------------------------------------------------------------------------------
class Req:
    __slots__ = ("done", "apply", "rank", "inst")

    def __init__(self, rank: int, inst: Any = None) -> None:
        self.done, self.apply, self.rank, self.inst = inst is None, None, rank, inst

    def Test(self) -> bool:  # noqa: N802 - mpi4py's name
        return self.done


class Status:
    def __init__(self) -> None:
        self.tag = -1

    def Get_tag(self) -> int:  # noqa: N802
        return self.tag


class _RequestNS:
    @staticmethod
    def Testall(requests: list[Req]) -> bool:  # noqa: N802
        return all(r.done for r in requests)


class FakeMPI:
    """What the layer uses of ``mpi4py.MPI``."""

    IN_PLACE = "IN_PLACE"
    SUM, MIN, MAX = "sum", "min", "max"
    ANY_SOURCE = ANY_TAG = -1
    Status = Status
    Request = _RequestNS

    @staticmethod
    def Is_finalized() -> bool:  # noqa: N802
        return False


class Instance:
    """The i-th collective posted on a communicator: MPI matches by order, nothing else."""

    __slots__ = ("posts", "ready")

    def __init__(self) -> None:
        self.posts: dict[int, tuple[str, tuple, Req]] = {}
        self.ready = False


class Context:
    """One communicator, shared by every rank's handle of it."""

    def __init__(self, sim: Sim, name: str) -> None:
        self.sim, self.name = sim, name
        self.instances: list[Instance] = []
        self.posted = [0] * sim.n
        self.dups: list[Context] = []
        self.inbox: list[deque] = [deque() for _ in range(sim.n)]  # delivered point-to-point messages
        self.freed: set[int] = set()


class Comm:
    """One rank's handle of a :class:`Context`: the calls the layer makes."""

    _next_handle = 1

    def __init__(self, ctx: Context, rank: int) -> None:
        self.ctx, self.rank = ctx, rank
        self.handle = Comm._next_handle
        Comm._next_handle += 1

    def Get_rank(self) -> int:  # noqa: N802
        return self.rank

    def Get_size(self) -> int:  # noqa: N802
        return self.ctx.sim.n

    def Free(self) -> None:  # noqa: N802
        self.ctx.freed.add(self.rank)

    def _post(self, kind: str, args: tuple) -> Req:
        ctx, sim = self.ctx, self.ctx.sim
        i = ctx.posted[self.rank]
        sim.note(f"posts {kind} #{i} on {ctx.name}")
        ctx.posted[self.rank] += 1
        while len(ctx.instances) <= i:
            ctx.instances.append(Instance())
        inst = ctx.instances[i]
        req = Req(self.rank, inst)
        inst.posts[self.rank] = (kind, args, req)
        if kind == "allreduce" and _is_arrival(args):
            sim.arrivals[self.rank] = inst
        if len(inst.posts) == sim.n:
            sim.match(ctx, i, inst)
        return req

    def Iallreduce(self, send: Any, recv: Any, op: str) -> Req:  # noqa: N802
        data = (recv if send is FakeMPI.IN_PLACE else send).copy()
        return self._post("allreduce", (data, recv, op))

    def Ibcast(self, buf: Any, root: int) -> Req:  # noqa: N802
        return self._post("bcast", (buf.copy() if self.rank == root else None, buf, root))

    def Iallgather(self, send: Any, recv: Any) -> Req:  # noqa: N802
        return self._post("allgather", (send.copy(), recv, None))

    def Igather(self, send: Any, recv: Any, root: int) -> Req:  # noqa: N802
        return self._post("gather", (send.copy(), recv, root))

    def Iallgatherv(self, send: Any, spec: Any) -> Req:  # noqa: N802
        return self._post("allgatherv", (send.copy(), spec, None))

    def Igatherv(self, send: Any, spec: Any, root: int) -> Req:  # noqa: N802
        return self._post("gatherv", (send.copy(), spec, root))

    def Idup(self) -> tuple[Comm, Req]:  # noqa: N802
        ctx = self.ctx
        k = sum(1 for kind, _, _ in (inst.posts.get(self.rank, ("", (), None)) for inst in ctx.instances)
                if kind == "dup")
        while len(ctx.dups) <= k:
            ctx.dups.append(Context(ctx.sim, f"{ctx.name}.{len(ctx.dups)}"))
        return Comm(ctx.dups[k], self.rank), self._post("dup", (k,))

    def isend(self, obj: Any, dest: int, tag: int) -> Req:
        self.ctx.sim.send(self.ctx, self.rank, dest, tag, pickle.dumps(obj))
        return Req(self.rank)  # small notes are eager: complete at once

    def improbe(self, source: int, tag: int, status: Status) -> Any:
        box = self.ctx.inbox[self.rank]
        if not box:
            return None
        msg_tag, data = box.popleft()
        status.tag = msg_tag
        return _Message(data)


class _Message:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def recv(self) -> Any:
        return pickle.loads(self.data)


def _reduce(parts: list[np.ndarray], op: str) -> np.ndarray:
    out = parts[0].copy()
    for p in parts[1:]:
        if op == "sum":
            out = out + p
        elif op == "min":
            out = np.minimum(out, p)
        else:
            out = np.maximum(out, p)
    return out


# -- the board, over memory --------------------------------------------------------------------
class SimBoard(_board.Board):
    """The real board's rows over memory; process checks and where-probes answered by the simulator."""

    def __init__(self, sim: Sim, rank: int, runtime: Runtime) -> None:  # noqa: D107 - no file, no signal
        self.sim, self.rank = sim, rank
        self.runtime, self._time_ns = runtime, runtime.time_ns
        self._own_map = bytearray(_board._WORDS * 8)
        self.mine = memoryview(self._own_map).cast("q")
        self.mine[_board._PID] = 10_000 + rank
        self.path, self._where = f"sim-board-{rank}", None
        self.peers: dict[int, np.ndarray] = {}
        self.shared = self.mine
        self._maps: list[Any] = []
        self._names: dict[str, memoryview] = {}
        self._last_name = ""

    def link(self, boards: dict[int, SimBoard], leader: int) -> None:
        for r, b in boards.items():
            if r != self.rank:
                self.peers[r] = np.frombuffer(b._own_map, dtype=np.int64)
        if leader != self.rank:
            self.shared = memoryview(boards[leader]._own_map).cast("q")

    def unlink(self) -> None:
        pass

    def alive(self, rank: int) -> bool:
        return self.sim.ranks[rank].alive

    def stopped(self, rank: int) -> bool:
        sim = self.sim
        return sim.ranks[rank].alive and sim.now < sim.ranks[rank].frozen_until

    def ask_where(self, ranks: list[int], timeout: float = 1.0) -> dict[int, str]:
        return {r: self.sim.ranks[r].where for r in ranks if self.sim.ranks[r].alive}

    # The writes another rank's wait can turn on wake the ranks of this host (the others only
    # describe where a rank is, read when a wait ends).
    def leave(self, outcome: int) -> None:
        super().leave(outcome)
        self.sim.wake_host(self.rank)

    def cell_begin(self, cell: int) -> None:
        super().cell_begin(cell)
        self.sim.wake_host(self.rank)

    def cell_end(self, *args: Any) -> None:
        super().cell_end(*args)
        self.sim.wake_host(self.rank)

    def mark_revoked(self, gen: int) -> None:
        super().mark_revoked(gen)
        self.sim.wake_host(self.rank)
        # Only a rank that sends a revocation marks it: the note that travels (a rank that gives up
        # on a generation already revoked sends none).
        note = next(g.revoked for g in self.sim.ranks[self.rank].chan.gens if g.number == gen)
        self.sim.revocations.append((gen, note["index"], self.rank, self.sim.now))


# -- virtual time, and the runtime a simulated rank runs in ------------------------------------------
#: Coarser waiting than on a real machine: the same decisions, fewer steps.
PACE = Pace(spin=0.0, yield_for=0.0, first_pause=1e-3, max_pause=0.05, data_spin=0.0)


def rank_runtime(sim: Sim, rank: Rank) -> Runtime:
    """The process ``rank`` runs in, as the layer sees it: the simulator's MPI and virtual clock,
    sleeping and yielding hand the core to the scheduler; its own cell, Ctrl-C and plans."""

    def monotonic() -> float:
        return sim.now

    def sleep(seconds: float) -> None:
        sim.pause(max(seconds, 1e-6))

    def refused(*args: Any) -> Any:
        raise AssertionError("the simulator sends no signal and reads no host")

    return Runtime(mpi=FakeMPI, monotonic=monotonic, wall=lambda: 1.0e9 + sim.now,
                   time_ns=lambda: int((1.0e9 + sim.now) * 1e9), sleep=sleep, sched_yield=lambda: sim.pause(TICK),
                   signals=None, kill=refused, hostname=lambda: sim.sc.hosts[rank.r],
                   affinity=lambda: frozenset(range(64)), cell=lambda: rank.cell, interrupts=Interrupts(monotonic),
                   notice_after=lambda: None, observer=sim.observe, pace=PACE, plans=rank.plans)


# -- programs -----------------------------------------------------------------------------------
@dataclass
class Call:
    """One ``mpinb.allreduce`` of a rank: ``label`` names the call in the program (the same label on
    every rank is the same call), ``timeout`` its deadline (``None``: none), ``size`` its array's
    length (a rank passing another length makes every rank raise ``CollectiveMismatchError``)."""

    label: str
    timeout: float | None = None
    size: int = 2


@dataclass
class Compute:
    seconds: float


@dataclass
class Raise:
    """The user's code raises here: the cell ends with this error on this rank."""


@dataclass
class RaiseBetween:
    """The rank's framework raises here, between two collectives of the scenario's mpinb call
    (``Scenario.fit``): TensorFlow's error in one rank's train step."""


@dataclass
class Die:
    """The rank's process dies here."""


@dataclass
class Scenario:
    """``cells[c][r]``: rank r's steps in cell c (cell ids are ``c + 1``); ``hosts[r]``: its host.
    ``queued``: every cell is sent before the previous one ends (``%%px --noblock``); otherwise a
    cell starts when every rank has ended the previous one. ``interrupts``: (cell, rank) pairs hit by
    Ctrl-C at a moment the scheduler chooses while the rank runs that cell. A last cell, in which
    every rank calls one collective, checks that the world recovered."""

    name: str
    n: int
    hosts: list[str]
    cells: list[list[list[Any]]]
    queued: bool = False
    interrupts: list[tuple[int, int]] = field(default_factory=list)
    # Faults that strike inside a collective, at a moment the scheduler chooses while the rank waits
    # in one during that cell: an exception from the wait (MemoryError, a bug), the process dying
    # (one host only: across hosts MPI's launcher ends the job), the process stopped (SIGSTOP) for
    # that many seconds, its MPI progress with it.
    raises: list[tuple[int, int]] = field(default_factory=list)
    deaths: list[tuple[int, int]] = field(default_factory=list)
    freezes: dict[tuple[int, int], float] = field(default_factory=dict)
    # Ctrl-C that a StopFlag holds back for its loop's vote reaches the rank while it waits in a
    # collective (its runtime's Interrupts, on the virtual clock): the wait ends it after
    # mpinb.interrupt.INTERRUPT_GRACE if the collective has not completed by then.
    held: list[tuple[int, int]] = field(default_factory=list)
    script: bool = False  # a batch script: no cells (cell 0), and it catches each collective's error
    # Each cell's steps are one mpinb call (mpinb._collective.collective_call, as mpinb.keras.fit):
    # an error inside it ends the call (in a script, caught after it).
    fit: bool = False


def value_of(label: str, rank: int) -> float:
    """Rank ``rank``'s contribution to the call ``label``: every call's sum is different."""
    return float((sum(map(ord, label)) % 997) * 1000 + rank + 1)


# -- ranks ------------------------------------------------------------------------------------
_PLANS: dict[int, dict] = {}

RUNNABLE, WAITING, COMPUTING, IDLE, FINISHED = range(5)


class Rank:
    def __init__(self, sim: Sim, r: int) -> None:
        self.sim, self.r = sim, r
        self.state = RUNNABLE
        self.wake_at = 0.0
        self.dirty = False  # something it may be waiting for happened since it last looked
        self.alive = True
        self.cell = _cells.Cell(0)  # the cell this rank runs (its runtime's)
        self.plans = _PLANS.setdefault(r, {})  # a rank's fused plans, kept from run to run as in a process
        self.interrupt = False
        self.raise_inside = False
        self.frozen_until = 0.0
        self.where = "starting"
        self.cell_index = 0  # the next cell to run
        self.glet: greenlet.greenlet | None = None
        self.chan: Any = None
        self.runtime = rank_runtime(sim, self)


@dataclass
class Record:
    """What happened in one run, for the invariants."""

    calls: list[CallOutcome] = field(default_factory=list)
    cell_errors: dict[tuple[int, int], bool] = field(default_factory=dict)
    cell_ended: dict[tuple[int, int], float] = field(default_factory=dict)
    ops_begun: dict[tuple[int, int], int] = field(default_factory=dict)  # (rank, cell) -> collectives called
    first_trouble: dict[int, float] = field(default_factory=dict)  # cell -> first raise/give-up/death
    abnormal: list[tuple[int, int, str, float, float]] = field(default_factory=list)  # rank, cell, op, in, out
    gave_up: list[GiveUp] = field(default_factory=list)
    rules: set[tuple[_p.Phase, str]] = field(default_factory=set)
    errors: dict[tuple[int, int], str] = field(default_factory=dict)
    raised: dict[tuple[int, int], BaseException] = field(default_factory=dict)  # (rank, cell) -> its cell's error
    # (rank, cell) -> what the rank itself did wrong there, when (and how many of its calls had
    # returned): "raise" (its code raised), "interrupt" (Ctrl-C, also while computing), "raise inside",
    # "dies", "frozen", "gave up" (a deadline passed, or any other give-up that revokes).
    faults: dict[tuple[int, int], list[tuple[str, float, int]]] = field(default_factory=dict)
    returned: dict[tuple[int, int], int] = field(default_factory=dict)  # (rank, cell) -> calls that returned
    data_left: int = 0  # data messages left pending by an operation abandoned as its arrival completed
    seconds: float = 0.0  # the virtual time the run ended at
    overrun: float = -math.inf  # the most a call with a deadline ended past it
    released: float = 0.0  # the longest a rank waited after the first trouble in its cell


# -- the simulator ------------------------------------------------------------------------------
class Sim:
    def __init__(self, scenario: Scenario, chooser: Any) -> None:
        self.sc, self.n, self.chooser = scenario, scenario.n, chooser
        self.now = 0.0
        self.ranks = [Rank(self, r) for r in range(self.n)]
        self.flight: dict[tuple[int, int], deque] = {}  # (src, dst) -> messages in order
        self.contexts: list[Context] = []
        self.rec = Record()
        self.steps = 0
        self.current: Rank | None = None
        self.main = greenlet.getcurrent()
        self.cells_ended: list[set[int]] = [set() for _ in scenario.cells]
        self.interrupts_left = {(c + 1, r) for c, r in scenario.interrupts}
        self.raises_left = {(c + 1, r) for c, r in scenario.raises}
        self.deaths_left = {(c + 1, r) for c, r in scenario.deaths}
        self.freezes_left = {(c + 1, r): t for (c, r), t in scenario.freezes.items()}
        self.held_left = {(c + 1, r) for c, r in scenario.held}
        self.holds: list[tuple[int, int, str, float]] = []  # rank, cell, call, when a Ctrl-C was held back
        self.ops_in: dict[int, tuple[int, str, float]] = {}  # rank -> (cell, label, entered) of its call
        self.ready_reqs: list[tuple[str, int, int, Req]] = []  # matched, not yet complete for that rank
        self.stopping = False
        self.protocol_errors: list[str] = []
        self.log: list[str] | None = None
        self.moving_abandoned: set[str] = set()
        self.lagging = -1
        self.arrivals: dict[int, Instance] = {}  # each rank's latest arrival
        # For the invariants of time: each rank's call with a deadline (cell, label, deadline), the
        # place in its cell of the operation it waits in (cell, place, label, since: the cell-end
        # comparison is the place after its calls), the highest place each rank reached in each
        # cell, the operation each rank has in a phase (and since when), and the revocations sent
        # (generation, place, rank, when).
        self.deadlines: dict[int, tuple[int, str, float]] = {}
        self.inside: dict[int, tuple[int, int, str, float]] = {}
        self.reached: dict[tuple[int, int], int] = {}
        self.op_of: dict[int, tuple[Any, float]] = {}
        self.revocations: list[tuple[int, int, int, float]] = []
        self.died_at: dict[int, float] = {}
        self.completed_by_abandoner: set[int] = set()  # arrivals some rank completed for an abandoned operation

    # MPI
    def wake(self, r: int) -> None:
        self.ranks[r].dirty = True

    def wake_host(self, r: int) -> None:
        host = self.sc.hosts[r]
        for q, h in enumerate(self.sc.hosts):
            if h == host and q != r:
                self.ranks[q].dirty = True

    def match(self, ctx: Context, i: int, inst: Instance) -> None:
        kinds = {kind for kind, _, _ in inst.posts.values()}
        if len(kinds) > 1:
            raise Violation(f"MPI matched different collectives on {ctx.name} #{i}: "
                            + ", ".join(f"rank {r} {k}" for r, (k, _, _) in sorted(inst.posts.items())))
        kind = kinds.pop()
        posts = [inst.posts[r] for r in range(self.n)]
        if kind == "allreduce":
            ops_ = {a[2] for _, a, _ in posts}
            shapes = {(a[0].shape, a[0].dtype.str) for _, a, _ in posts}
            if len(ops_) > 1 or len(shapes) > 1:
                raise Violation(f"MPI matched allreduces of different ops or buffers on {ctx.name} #{i}: {shapes}")
            result = _reduce([a[0] for _, a, _ in posts], posts[0][1][2])
            for _, (_, recv, _), req in posts:
                req.apply = (lambda recv=recv: recv.__setitem__(Ellipsis, result))
        elif kind == "bcast":
            roots = {a[2] for _, a, _ in posts}
            if len(roots) > 1:
                raise Violation(f"MPI matched broadcasts from different roots on {ctx.name} #{i}")
            data = posts[roots.pop()][1][0]
            for _, (_, buf, _), req in posts:
                if buf.size != data.size:
                    raise Violation(f"MPI matched broadcasts of different sizes on {ctx.name} #{i}")
                req.apply = (lambda buf=buf: buf.__setitem__(Ellipsis, data.reshape(buf.shape)))
        elif kind in ("allgather", "gather"):
            stacked = np.stack([a[0] for _, a, _ in posts])
            for r, (_, (_, recv, root), req) in enumerate(posts):
                if recv is not None and (root is None or root == r):
                    req.apply = (lambda recv=recv: recv.__setitem__(Ellipsis, stacked.reshape(recv.shape)))
        elif kind in ("allgatherv", "gatherv"):
            joined = np.concatenate([a[0] for _, a, _ in posts])
            for r, (_, (_, spec, root), req) in enumerate(posts):
                if spec is not None and (root is None or root == r):
                    buf = spec[0]
                    req.apply = (lambda buf=buf: buf.__setitem__(slice(0, joined.size), joined))
        if kind == "allreduce" and _is_arrival(posts[0][1]):
            neutral = [r for r, (_, a, _) in enumerate(posts) if a[0][_p.DIGEST] == np.iinfo(np.int64).max]
            if neutral and len(neutral) < self.n:
                self.completed_by_abandoner.add(id(inst))
        inst.ready = True
        for r, (_, _, req) in sorted(inst.posts.items()):
            self.ready_reqs.append((ctx.name, i, r, req))

    def send(self, ctx: Context, src: int, dst: int, tag: int, data: bytes) -> None:
        self.flight.setdefault((src, dst), deque()).append((ctx, tag, data))

    def fault(self, rank: Rank, kind: str) -> None:
        """``rank`` does something wrong in the cell it runs (see :attr:`Record.faults`)."""
        c = rank.cell_index
        self.rec.faults.setdefault((rank.r, c), []).append((kind, self.now, self.rec.returned.get((rank.r, c), 0)))

    # the ranks' side
    def pause(self, seconds: float) -> None:
        rank = self.current
        rank.state, rank.wake_at, rank.dirty = WAITING, self.now + seconds, False
        self._switch_out(rank)
        if rank.interrupt:
            rank.interrupt = False
            raise KeyboardInterrupt()
        if rank.raise_inside:
            rank.raise_inside = False
            raise MemoryError(f"simulated: rank {rank.r} ran out of memory inside a collective")

    def compute(self, seconds: float) -> None:
        rank = self.current
        rank.state, rank.wake_at = COMPUTING, self.now + seconds
        rank.where = f"computing in cell {rank.cell.id}"
        self._switch_out(rank)
        if rank.interrupt:
            rank.interrupt = False
            raise KeyboardInterrupt()

    def _switch_out(self, rank: Rank) -> None:
        if self.stopping:
            raise Stop
        self.main.switch()
        if self.stopping:
            raise Stop

    # scheduling
    def enabled(self) -> list[tuple]:
        out: list[tuple] = []
        now = self.now
        frozen = {rank.r for rank in self.ranks if now < rank.frozen_until}
        for rank in self.ranks:
            state = rank.state
            if state == FINISHED or not rank.alive or rank.r in frozen:
                continue
            if (state == RUNNABLE or (state == WAITING and (rank.dirty or now >= rank.wake_at))
                    or (state != WAITING and now >= rank.wake_at)
                    or (state == IDLE and self._cell_available(rank))):
                out.append(("run", rank.r))
            if (self.interrupts_left and state in (WAITING, COMPUTING)
                    and (rank.cell.id, rank.r) in self.interrupts_left):
                out.append(("interrupt", rank.r))
            if state == WAITING and rank.r in self.ops_in:
                place = (rank.cell.id, rank.r)
                for kind, left in (("raise", self.raises_left), ("kill", self.deaths_left),
                                   ("freeze", self.freezes_left), ("hold", self.held_left)):
                    if place in left:
                        out.append((kind, rank.r))
        late: list[tuple] = []
        for name, i, r, req in self.ready_reqs:
            # A stopped process makes no MPI progress: neither its own requests nor, until its
            # part has moved, those of the others in the same collective complete.
            if frozen and (r in frozen or any(q in frozen and not p[2].done for q, p in req.inst.posts.items())):
                continue
            if self.ranks[r].alive:
                (late if r == self.lagging else out).append(("complete", name, i, r, req))
        for (src, dst), queue in self.flight.items():  # in order of first use: deterministic
            # A rank computing outside mpinb makes no MPI progress: what is sent to it may arrive
            # only once it calls mpinb again (and then before or after its first look).
            if queue and self.ranks[dst].state != COMPUTING and dst not in frozen and src not in frozen:
                (late if dst == self.lagging else out).append(("deliver", src, dst))
        # The lagging rank's messages and completions come only when nothing else can happen: the
        # orderings a uniform choice almost never makes (a notice that reaches one rank last).
        return out or late

    def _cell_available(self, rank: Rank) -> bool:
        c = rank.cell_index
        if c > len(self.sc.cells):
            return False
        if c == 0 or self.sc.queued:
            return True
        alive = {r.r for r in self.ranks if r.alive}
        return alive <= self.cells_ended[c - 1]

    def apply(self, choice: tuple) -> None:
        kind = choice[0]
        if kind == "run":
            self._run(self.ranks[choice[1]])
        elif kind == "interrupt":
            rank = self.ranks[choice[1]]
            self.note(f"Ctrl-C reaches rank {rank.r}")
            self.interrupts_left.discard((rank.cell.id, rank.r))
            rank.interrupt = True
            self.rec.first_trouble.setdefault(rank.cell.id, self.now)
            self.fault(rank, "interrupt")
            self._run(rank)
        elif kind == "hold":
            rank = self.ranks[choice[1]]
            self.note(f"Ctrl-C reaches rank {rank.r}, held back by a stop flag")
            self.held_left.discard((rank.cell.id, rank.r))
            rank.runtime.interrupts.note()
            cell, label, _ = self.ops_in[rank.r]
            self.holds.append((rank.r, cell, label, self.now))
            self.fault(rank, "interrupt")
            rank.dirty = True
        elif kind == "raise":
            rank = self.ranks[choice[1]]
            self.note(f"an exception is raised inside rank {rank.r}'s wait")
            self.raises_left.discard((rank.cell.id, rank.r))
            rank.raise_inside = True
            self.rec.first_trouble.setdefault(rank.cell.id, self.now)
            self.fault(rank, "raise inside")
            self._run(rank)
        elif kind == "kill":
            rank = self.ranks[choice[1]]
            self.note(f"rank {rank.r}'s process dies inside a collective")
            self.deaths_left.discard((rank.cell.id, rank.r))
            self._die(rank)
        elif kind == "freeze":
            rank = self.ranks[choice[1]]
            seconds = self.freezes_left.pop((rank.cell.id, rank.r))
            self.note(f"rank {rank.r} is stopped for {seconds:g} s inside a collective")
            rank.frozen_until = self.now + seconds
            self.fault(rank, "frozen")
            rank.wake_at = max(rank.wake_at, rank.frozen_until)
        elif kind == "complete":
            req = choice[4]
            self.ready_reqs.remove((choice[1], choice[2], choice[3], req))
            if req.apply is not None:
                req.apply()
            req.done = True
            self._observe_now(self.ranks[req.rank])
        else:
            _, src, dst = choice
            if self._deliver(src, dst):
                self._observe_now(self.ranks[dst])

    def _deliver(self, src: int, dst: int) -> bool:
        """The next message in flight from ``src`` to ``dst`` lands in its inbox (unless ``dst`` died)."""
        ctx, tag, data = self.flight[src, dst].popleft()
        if not self.ranks[dst].alive:
            return False
        ctx.inbox[dst].append((tag, data))
        return True

    def _thaw(self, rank: Rank) -> None:
        """A stopped process resumes. What the others sent it meanwhile landed in its buffers (the
        sender's shared-memory cell, the kernel's socket buffer) while it was stopped: its first look
        finds it."""
        for (src, dst), queue in self.flight.items():
            if dst == rank.r and self.ranks[src].frozen_until <= self.now:
                while queue:
                    self._deliver(src, dst)

    def _observe_now(self, rank: Rank) -> None:
        """A completion or a message only its own rank can see: a waiting rank looks at once. Sound:
        until it looks, no other rank can tell whether the event has happened, so the orderings
        where it looks later are those where the event comes later."""
        if rank.state == WAITING:
            self._run(rank)
        else:
            rank.dirty = True

    def _run(self, rank: Rank) -> None:
        self.current = rank
        if rank.state == IDLE:
            rank.state = RUNNABLE
        if rank.state != RUNNABLE:
            rank.state = RUNNABLE
        rank.glet.switch()
        self.current = None

    def run(self) -> Record:
        self.lagging = self.chooser.choose(self.n + 1)  # a rank whose news always comes last, or none
        for rank in self.ranks:
            rank.glet = greenlet.greenlet(lambda rank=rank: self._rank_main(rank), parent=self.main)
        self._build_channels()
        while True:
            if all(r.state == FINISHED or not r.alive for r in self.ranks):
                break
            choices = self.enabled()
            if not choices:
                wakes = [r.wake_at for r in self.ranks if r.alive and r.state in (WAITING, COMPUTING, IDLE)]
                wakes += [r.frozen_until for r in self.ranks if r.alive and r.frozen_until > self.now]
                if not wakes:
                    raise Violation("deadlock: no rank can run and nothing is in flight")
                before, self.now = self.now, max(self.now, min(wakes))
                for rank in self.ranks:
                    if rank.alive and before < rank.frozen_until <= self.now:
                        self._thaw(rank)
                self._check_time()
                if self.now > T_MAX:
                    raise Violation(f"over budget: {T_MAX:g} virtual seconds and the run has not ended (a hang, "
                                    "or waits grown slow): " + self._describe_waiting())
                continue
            choice = choices[self.chooser.choose(len(choices))] if len(choices) > 1 else choices[0]
            self.steps += 1
            if self.steps > STEPS_PER_RANK * self.n:
                raise Violation(f"over budget: {STEPS_PER_RANK * self.n:,} steps by {self.now:.2f} virtual s and the "
                                "run has not ended (waits grown busy): " + self._describe_waiting())
            self.apply(choice)
            if self.protocol_errors:
                raise Violation(self.protocol_errors[0])
        self._check_end()
        return self.rec

    def stop(self) -> None:
        self.stopping = True
        for rank in self.ranks:
            if rank.glet is not None and not rank.glet.dead:
                try:
                    rank.glet.throw(Stop)
                except BaseException:  # noqa: BLE001 - a rank's teardown must not mask the result
                    pass

    def _check_time(self) -> None:
        """The invariants of time, each time the clock moves: every call with a deadline ends by it
        plus :data:`SLACK`; a rank whose wait another rank decided (by revoking the generation it
        waits on, at or before its place; by leaving its cell before entering the operation it
        waits in; by dying before completing it) leaves that wait within :data:`BOUND` of the
        decision. A stopped rank's own clock starts when it resumes."""
        now = self.now
        for r, (cell, label, deadline) in self.deadlines.items():
            rank = self.ranks[r]
            if rank.alive and now > max(deadline, rank.frozen_until) + SLACK:
                raise Violation(f"rank {r}'s {label} (cell {cell}) still waits {now - deadline:.2f} s after its "
                                f"deadline (slack {SLACK:g} s)")
        for r, (op, since) in self.op_of.items():
            rank = self.ranks[r]
            if not rank.alive or op.outcome or op.phase not in (_p.ARRIVING, _p.MOVING) or op.gen is None:
                continue
            for gen, index, by, at in self.revocations:
                start = max(at, since, rank.frozen_until)
                if by != r and gen == op.gen.number and op.index >= index and now - start > BOUND + SLACK:
                    raise Violation(f"rank {r} still waits in {op.name} #{op.index} (generation {gen}) "
                                    f"{now - start:.2f} s after rank {by} revoked it at #{index} (bound {BOUND:g} s)")
        for r, (cell, place, label, since) in self.inside.items():
            rank = self.ranks[r]
            if not rank.alive or self.sc.script:
                continue
            for q in self.ranks:
                if q is rank:
                    continue
                if q.alive:
                    at = self.rec.cell_ended.get((q.r, cell))
                    if at is None or self.reached.get((q.r, cell), 0) >= place:
                        continue
                    what = "ended its cell"
                else:
                    at = self.died_at.get(q.r)
                    if at is None or self.rec.returned.get((q.r, cell), 0) >= place:
                        continue
                    what = "died"
                start = max(at, since, rank.frozen_until)
                if now - start > BOUND + SLACK:
                    raise Violation(f"rank {r} still waits in {label} (cell {cell}) {now - start:.2f} s after rank "
                                    f"{q.r} {what} without entering it (bound {BOUND:g} s)")

    def _describe_waiting(self) -> str:
        return "; ".join(f"rank {rank.r} at {rank.where}" for rank in self.ranks
                         if rank.alive and rank.state != FINISHED) or "nothing runs"

    def _build_channels(self) -> None:
        world, ctrl, gen0 = (Context(self, name) for name in ("world", "ctrl", "gen0"))
        self.contexts += [world, ctrl, gen0]
        boards = {r: SimBoard(self, r, self.ranks[r].runtime) for r in range(self.n)}
        hosts = self.sc.hosts
        for rank in self.ranks:
            r = rank.r
            chan = _channels.Channel(Comm(world, r), rank.runtime)
            chan.hosts = list(hosts)
            chan.affinity = [frozenset(range(64))] * self.n
            chan.engines = list(range(self.n))
            chan.ctrl = Comm(ctrl, r)
            chan.gens = [_channels.Gen(0, Comm(gen0, r), None)]
            chan.board = boards[r]
            same = {q: boards[q] for q in range(self.n) if hosts[q] == hosts[r]}
            chan.board.link(same, leader=min(same))
            chan.crowded = False
            chan.ready = True
            rank.chan = chan
            # mpinb.allreduce(comm=...) finds the channel by the communicator's handle (unique
            # in the process: every simulated communicator has its own).
            _collective._channels[chan.parent.handle] = chan
        self._world = world

    def _rank_main(self, rank: Rank) -> None:
        r, chan = rank.r, rank.chan
        try:
            cells = self.sc.cells + [[[Call("check")] for _ in range(self.n)]]
            while rank.cell_index < len(cells):
                while not self._cell_available(rank):
                    self._idle(rank)
                c = rank.cell_index
                rank.cell_index += 1
                cell = rank.cell = _cells.Cell(0 if self.sc.script else c + 1)
                if not self.sc.script:
                    chan.on_cell("begin", cell, None)
                self.note(f"cell {c + 1} begins")
                error: BaseException | None = None
                begun = 0
                try:
                    for step in self._steps(rank, cells[c][r]):
                        if isinstance(step, Call):
                            begun += 1
                            self.rec.ops_begun[r, c + 1] = self.reached[r, c + 1] = begun
                            rank.where = f"allreduce {step.label} in cell {c + 1}"
                            try:
                                self._call(rank, c + 1, step)
                            except Exception:  # noqa: BLE001 - a script that goes on after an error
                                if not self.sc.script or self.sc.fit:
                                    raise
                        elif isinstance(step, Compute):
                            self.compute(step.seconds)
                        elif isinstance(step, Raise):
                            self.fault(rank, "raise")
                            raise ValueError(f"the user's code raised on rank {r}")
                        elif isinstance(step, Die):
                            self._die(rank)
                            return
                    rank.where = f"the end of cell {c + 1}"
                    if not self.sc.script:
                        # The cell's last statement on an engine (cells.EndCheck): an operation at
                        # the place after the cell's calls.
                        self.reached[r, c + 1] = begun + 1
                        self.inside[r] = (c + 1, begun + 1, "the cell-end comparison", self.now)
                        try:
                            _collective.cell_end_check(runtime=rank.runtime)
                        finally:
                            self.inside.pop(r, None)
                except (KeyboardInterrupt, Exception) as err:  # the cell's error, as the engine records it
                    error = err
                    self.rec.raised[r, c + 1] = err
                rank.where = f"idle after cell {c + 1}"
                self.rec.cell_errors[r, c + 1] = error is not None
                self.note(f"cell {c + 1} ends: " + ("ok" if error is None else f"{type(error).__name__}: {error}"))
                if error is not None:
                    self.rec.errors[r, c + 1] = f"{type(error).__name__}: {error}"
                    self.rec.first_trouble.setdefault(c + 1, self.now)
                self.rec.cell_ended[r, c + 1] = self.now
                if not self.sc.script:
                    chan.on_cell("end", cell, error)
                rank.cell = _cells.Cell(0)
                if c < len(self.cells_ended):
                    self.cells_ended[c].add(r)
            # The engine stays up, idle, passing notes on, until every rank has ended the last cell.
            last = len(cells)
            while not all(x is rank or not x.alive or (x.r, last) in self.rec.cell_ended for x in self.ranks):
                self._idle(rank)
            chan.close()
        finally:
            rank.state = FINISHED

    def _steps(self, rank: Rank, steps: list[Any]) -> Any:
        """A cell's steps; with ``Scenario.fit``, inside one mpinb call, where a ``RaiseBetween`` is
        raised (a collective's error leaves the loop, and the call with it, as it leaves fit)."""
        if not self.sc.fit:
            yield from steps
            return
        with _collective.collective_call("fit", rank.chan.parent):
            for step in steps:
                if isinstance(step, RaiseBetween):
                    self.fault(rank, "raise")
                    raise RuntimeError(f"simulated: rank {rank.r}'s framework raised in its train step")
                yield step

    def _idle(self, rank: Rank) -> None:
        rank.state, rank.wake_at = IDLE, self.now + IDLE_TICK
        self._switch_out(rank)
        rank.chan.notices()

    def _die(self, rank: Rank) -> None:
        self.fault(rank, "dies")
        self.died_at[rank.r] = self.now
        rank.alive = False
        rank.where = "dead"
        self.rec.first_trouble.setdefault(rank.cell.id, self.now)
        for other in self.ranks:
            other.dirty = True

    def _call(self, rank: Rank, cell: int, step: Call) -> None:
        value = np.full(step.size, value_of(step.label, rank.r))
        began = self.now
        self.ops_in[rank.r] = (cell, step.label, began)
        self.inside[rank.r] = (cell, self.reached[rank.r, cell], step.label, began)
        if step.timeout is not None:
            self.deadlines[rank.r] = (cell, step.label, began + step.timeout)
        try:
            result = mpinb.allreduce([value], comm=rank.chan.parent, timeout=step.timeout)[0]
        except BaseException as err:
            self.rec.calls.append(CallOutcome(rank.r, cell, step.label, False, False, began, self.now))
            if isinstance(err, CollectiveTimeout):
                self._check_named(rank, step.label, err)
            raise
        finally:
            self.ops_in.pop(rank.r, None)
            self.inside.pop(rank.r, None)
            if self.deadlines.pop(rank.r, None) is not None:
                self.rec.overrun = max(self.rec.overrun, self.now - began - step.timeout)
        self.rec.returned[rank.r, cell] = self.rec.returned.get((rank.r, cell), 0) + 1
        right = float(sum(value_of(step.label, q) for q in range(self.n)))
        self.rec.calls.append(CallOutcome(rank.r, cell, step.label, True, bool(np.all(result == right)),
                                             began, self.now))

    def _check_named(self, rank: Rank, label: str, err: CollectiveTimeout) -> None:
        """A timeout names every rank that is stopped (SIGSTOP) as it is raised: the one thing a
        user can do something about."""
        stopped = [q.r for q in self.ranks if q.alive and self.now < q.frozen_until]
        unnamed = [q for q in stopped if q not in err.missing]
        if unnamed:
            self.protocol_errors.append(f"rank {rank.r}'s timeout in {label} does not name stopped rank(s) "
                                        f"{unnamed}: {err}")

    # observing the protocol
    def note(self, text: str) -> None:
        if self.log is not None:
            who = f"rank {self.current.r}" if self.current is not None else "network"
            self.log.append(f"{self.now:8.4f} {who}: {text}")

    def observe(self, op: Any, phase: _p.Phase, event: str, rule: _p.Rule | None) -> None:
        if rule is None:  # the step raises ProtocolError: a handler of the layer or the cell may catch it
            self.protocol_errors.append(f"mpinb's collective protocol has no step {event!r} from phase "
                                        f"{phase.text!r}")
            return
        self.rec.rules.add((rule.phase, rule.event))
        if rule.phase == _p.MOVING and rule.event not in ("finish", "fail") and op is not None and op.comm is not None:
            # MPI cannot cancel a collective: the messages of an operation given up while its data
            # moved stay posted, and so may the arrival of the next one on ranks that got past it.
            self.moving_abandoned.add(op.comm.ctx.name)
        if self.log is not None and op is not None:
            gen = getattr(op.gen, "number", None)
            target = rule.to if rule.to is not None else rule.outcome
            self.note(f"{op.name} gen {gen} #{op.index} cell {op.cell}: {rule.phase.text} --{rule.event}--> "
                      + (target.text if target is not None else "?"))
        if op is None or self.current is None:
            return
        rank = self.current
        if rule.to is not None:
            if rule.to == _p.ARRIVING:
                self.op_of[rank.r] = (op, self.now)
        else:
            self.op_of.pop(rank.r, None)
            if rule.event == "deadline":
                self.fault(rank, "gave up")
        if rule.event == "arrived" and id(self.arrivals.get(rank.r)) in self.completed_by_abandoner:
            self.protocol_errors.append(f"rank {rank.r} moved data in {op.name} #{op.index} on an arrival that "
                                        "another rank completed for an abandoned operation")
        if rule.outcome is not None and rule.outcome != _p.DONE and rule.event != "fail":
            cell, label, entered = self.ops_in.get(rank.r, (op.cell, op.name, op.began))
            self.rec.abnormal.append((rank.r, cell, label, entered, self.now))
            if rule.event in ("deadline", "interrupt", "raise"):
                self.rec.first_trouble.setdefault(cell, self.now)
                self.rec.gave_up.append(GiveUp(rank.r, cell, label, self.now))

    # the guarantees, at the end of a run
    def _check_end(self) -> None:
        rec = self.rec
        dead = any(not r.alive for r in self.ranks)
        problems = invariant_violations(rec.calls, rec.cell_errors, {}, BOUND, rec.gave_up, _ops._AWAY)
        # A Ctrl-C held back by a stop flag ends the wait it came in within the grace (the rank
        # stops, rather than keep waiting for a rank stuck elsewhere), unless the call ended first.
        for r, cell, label, at in self.holds:
            ended = max((c.ended for c in rec.calls if (c.rank, c.cell, c.label) == (r, cell, label)), default=None)
            if ended is not None and ended - at > INTERRUPT_GRACE + BOUND:
                problems.append(f"rank {r}'s {label} (cell {cell}) ended {ended - at:.2f} s after a Ctrl-C held back "
                                f"by a stop flag (grace {INTERRUPT_GRACE:g} s, bound {BOUND:g} s)")
        # Released in time: an operation that did not complete ended within the bound of the first
        # trouble in its cell (a raise, a give-up, a death, or a rank that left the cell with fewer
        # collectives than another).
        for c in range(1, len(self.sc.cells) + 2):
            begun = {r: rec.ops_begun.get((r, c), 0) for r in range(self.n)}
            most = max(begun.values(), default=0)
            early = [rec.cell_ended[r, c] for r in range(self.n) if begun[r] < most and (r, c) in rec.cell_ended]
            trouble = min([t for t in (rec.first_trouble.get(c),) if t is not None] + early, default=None)
            for r, cell, label, entered, left in rec.abnormal:
                # A stopped process waits for nothing: its bound runs from when it resumed.
                start = max(entered, trouble or 0.0, self.ranks[r].frozen_until)
                if cell == c and trouble is not None:
                    rec.released = max(rec.released, left - start)
                if cell == c and trouble is not None and left - start > BOUND + 1e-9:
                    problems.append(f"rank {r} waited in {label} (cell {c}) {left - start:.2f} s "
                                    f"after the first trouble in its cell (bound {BOUND:g} s)")
        problems += self._false_errors()
        if not dead:
            last = len(self.sc.cells) + 1
            for r in range(self.n):
                if rec.cell_errors.get((r, last)):
                    problems.append(f"the world did not recover: rank {r}'s next cell raised "
                                    f"{rec.errors.get((r, last))}")
            # No arrival left pending: every arrival some rank posted was posted by every rank (the
            # data messages of an operation abandoned just after its arrival completed can be: counted).
            for ctx in self.contexts + [d for c in self.contexts for d in _all_dups(c)]:
                for i, inst in enumerate(ctx.instances):
                    if len(inst.posts) != self.n:
                        if ctx.name not in self.moving_abandoned and any(
                                kind == "allreduce" and _is_arrival(args) for kind, args, _ in inst.posts.values()):
                            problems.append(f"an arrival left pending on {ctx.name} #{i}: posted by ranks "
                                            f"{sorted(inst.posts)} only")
                        else:
                            rec.data_left += 1
        if problems:
            raise Violation("; ".join(dict.fromkeys(problems)))


    def _false_errors(self) -> list[str]:
        """The invariants of truth, per cell of the scenario: an error that names a rank (``by``)
        names one that did something wrong in that cell (raised, was interrupted, died, was
        stopped, gave up), whose program there differs, or that had left the cell when the error
        was raised (its cell ended: it says why in turn); a ``CollectiveMismatchError`` needs
        programs that differ; and where every rank made the same collectives and the only faults
        came after a rank's last collective had returned (its code raised, or Ctrl-C reached it
        computing), every other rank's cell ends without an error."""
        rec, found = self.rec, []
        for c, cell in enumerate(self.sc.cells, start=1):
            calls = [tuple((s.label, s.size) for s in steps if isinstance(s, Call)) for steps in cell]
            common = max(set(calls), key=calls.count)
            culprits = {r for r in range(self.n) if (r, c) in rec.faults or calls[r] != common
                        or any(not isinstance(s, Call) for s in cell[r])}
            differ = len(set(calls)) > 1
            late_only = all(kind in ("raise", "interrupt") and done == len(calls[r])
                            for (r, cc), events in rec.faults.items() if cc == c for kind, _, done in events)
            for r in range(self.n):
                err = rec.raised.get((r, c))
                if err is None:
                    continue
                what = f"rank {r}'s cell {c} raised {type(err).__name__}: {err}"
                by = getattr(err, "by", None)
                left = by is not None and (rec.cell_ended.get((by, c), math.inf) <= rec.cell_ended[r, c]
                                           or self.died_at.get(by, math.inf) <= rec.cell_ended[r, c])
                if isinstance(err, CollectiveAbandoned) and by is not None and by not in culprits and not left:
                    found.append(f"{what} -- naming rank {by}, which did nothing wrong in that cell")
                elif isinstance(err, CollectiveMismatchError) and not differ:
                    found.append(f"{what} -- though every rank made the same collectives")
                elif late_only and not differ and (r, c) not in rec.faults and not self.sc.script:
                    found.append(f"{what} -- though the only fault came after every collective of the cell")
        return found


def _is_arrival(args: tuple) -> bool:
    data = args[0]
    return args[2] == FakeMPI.MIN and data.dtype == np.int64 and data.shape == (_p.WORDS,)


def _all_dups(ctx: Context) -> list[Context]:
    out = []
    for d in ctx.dups:
        out.append(d)
        out += _all_dups(d)
    return out


def run_schedule(scenario: Scenario, chooser: Any,
                 log: list[str] | None = None) -> tuple[Record | None, str | None, int]:
    """Run ``scenario`` once under ``chooser``: (record, violation text or None, steps); with ``log``,
    what happened, step by step, is appended to it."""
    sim = Sim(scenario, chooser)
    sim.log = log
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            record = sim.run()
            return record, None, sim.steps
        except Violation as v:
            return sim.rec, str(v), sim.steps
        finally:
            sim.rec.seconds = sim.now
            sim.stop()
            for rank in sim.ranks:
                if rank.chan is not None:
                    _collective._channels.pop(rank.chan.parent.handle, None)
