"""Where this rank is, how far and how fast: the state the notebook's rank panel shows. Local.

Engine side; no MPI communication. The state is kept by the code that already runs: the collective
layer's step observer (:class:`~mpinb._collective.runtime.Runtime`'s, called at every step of the
protocol table) notes which collective this rank is in and since when, and splits each step's time
into *wait* (arrived, the others not yet), *exchange* (data moving) and *compute* (the rest); a
fit's :class:`mpinb.live.Progress` marks its steps (a k-means iteration, a Keras epoch, or a Keras
train step through :meth:`~mpinb.live.Progress.batch`). A daemon thread publishes a snapshot through
ipyparallel's data publication twice a second while a cell runs (once where a host runs more ranks
than cores), and once when it ends: a side
channel that never waits for the running cell, and costs the cell nothing but the observer's few
clock reads per collective. Where nobody asked (:func:`start` not called: plain ``mpiexec``, a
plain Python process), nothing is observed and nothing runs.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from typing import Any

__all__ = ["HISTORY", "KEY", "batch", "fit_begin", "fit_done", "fit_update", "history", "running", "snapshot", "start",
           "stop"]

KEY = "mpinb_ranks"  # the data publication's key; mpinb.live's curve uses its own
HISTORY = 20_000  # step records each rank keeps for mpinb.report
_INTERVAL = 0.5  # seconds between messages while a cell runs
_RECENT = 32  # step records each message carries: the panel's last steps


class _State:
    """One rank's state. Plain attributes, written by the thread that runs the code they describe
    and read by the publisher: a torn read shows one stale number for half a second, never an error."""

    def __init__(self) -> None:
        self.rank = self.size = -1
        self.engine: int | None = None
        self.host = ""
        # The collective this rank is in (the layer's Op), and the step's clocks.
        self.op: Any = None
        self.entered = self.arrived = 0.0
        self.step_began = time.monotonic()
        self.wait = self.exchange = 0.0
        self.ops = 0  # collectives finished, ever
        # The current fit, from mpinb.live.Progress.
        self.fit: dict[str, Any] | None = None
        self.fits = 0
        self.batches = False  # the fit marks train steps (Keras batches); its epochs only count
        self.logs: Any = None  # the last batch's logs (Keras's dict), read only when publishing
        self.history: deque[tuple[Any, ...]] = deque(maxlen=HISTORY)
        self.memory: deque[tuple[float, int]] = deque(maxlen=HISTORY)  # (time, bytes) at each message
        self.curves: deque[tuple[Any, ...]] = deque(maxlen=HISTORY)  # (fit, kind, step, metrics) per update
        self.seq = 0
        self.active = False  # start() was called: the fits' hooks record
        self.cells = 0  # cells begun on this engine since start(): the number the panel shows
        self.cell_began = 0.0
        self.ended = False  # a cell ended since the last message: publish now (see _publish_loop)


_state = _State()
_thread: threading.Thread | None = None
_halt = threading.Event()
_wake = threading.Event()  # a cell ended: publish its end now, not at the next tick


def start(interval: float = _INTERVAL) -> bool:
    """Observe this rank's collectives and publish its state every ``interval`` seconds while a cell
    runs. Local; idempotent. Returns whether a publisher runs (``False`` outside an ipyparallel engine,
    where only the observer is installed: :func:`history` still works, and with ``MPINB_MONITOR=0``
    in the environment, where nothing is)."""
    global _thread
    import os

    from mpinb._collective import _channels, cells
    from mpinb._collective.runtime import PROCESS

    if os.environ.get("MPINB_MONITOR") == "0":
        return False  # the engines' environment turned the rank panel off
    mpi = PROCESS.mpi
    s = _state
    s.rank, s.size = mpi.COMM_WORLD.Get_rank(), mpi.COMM_WORLD.Get_size()
    s.engine = cells.engine_id()
    import socket

    s.host = socket.gethostname()
    s.active = True
    PROCESS.observer = _observe  # read by every channel made from now on ...
    for chan in list(_channels.values()):
        if chan.runtime is PROCESS:
            chan.observer = _observe  # ... and by those made already
    if not cells.install():
        return False
    cells.on_cell(_on_cell)
    if _thread is None or not _thread.is_alive():
        _halt.clear()
        _wake.clear()
        _thread = threading.Thread(target=_publish_loop, args=(float(interval),), name="mpinb-progress", daemon=True)
        _thread.start()
    return True


def stop() -> None:
    """Stop publishing and observing (the benchmark's "off"). Local."""
    global _thread
    from mpinb._collective import _channels
    from mpinb._collective.runtime import PROCESS

    _state.active = False
    _halt.set()
    _wake.set()
    if _thread is not None:
        _thread.join(timeout=2.0)
        _thread = None
    if PROCESS.observer is _observe:
        PROCESS.observer = None
    for chan in list(_channels.values()):
        if chan.observer is _observe:
            chan.observer = None


def _on_cell(event: str, cell: Any, error: BaseException | None) -> None:
    if cell.plumbing:  # the user's cells only: not pull's getter or a probe
        return
    if event == "begin":
        _state.cells += 1
        _state.cell_began = time.monotonic()
    else:  # its end reaches the panel at once, even for a cell shorter than the publishing interval
        _state.ended = True
        _wake.set()


def running() -> bool:
    """Whether this rank's publisher runs. Local."""
    return _thread is not None and _thread.is_alive()


# -- what the running code calls --------------------------------------------------------------


def _observe(op: Any, phase: Any, event: str, rule: Any) -> None:
    """The collective layer's observer: called before each step of an operation's protocol table."""
    s = _state
    now = time.monotonic()
    if op is not s.op:  # its first step (enter, or switch while a revoked generation is replaced)
        s.op, s.entered, s.arrived = op, now, 0.0
    if event == "arrived":
        s.arrived = now
        s.wait += now - s.entered
    elif rule is not None and rule.to is None:  # the operation leaves, however it ends
        if s.arrived:
            s.exchange += now - s.arrived
        else:
            s.wait += now - s.entered
        s.op = None
        s.ops += 1


def fit_begin(kind: str, total: int | None, run: str) -> None:
    """A fit begins (:class:`mpinb.live.Progress` is made, on every rank): its first step starts now."""
    s = _state
    if not s.active:
        return
    s.fits += 1
    s.batches = False
    s.logs = None
    s.fit = {"run": run, "kind": kind, "total": total, "step": 0, "metrics": {}, "batch": None, "steps": None,
             "done": False}
    s.step_began, s.wait, s.exchange = time.monotonic(), 0.0, 0.0


def fit_update(kind: str, step: int, total: int | None, run: str, metrics: dict[str, float]) -> None:
    """A fit's step ended (:meth:`mpinb.live.Progress.update`: every rank calls it)."""
    s = _state
    if not s.active:
        return
    fit = _fit_of(kind, total, run)
    fit["step"], fit["metrics"] = int(step), metrics
    s.curves.append((s.fits, kind, int(step), metrics))
    if not s.batches:
        _mark(kind, int(step), metrics.get(kind, metrics.get("loss")))


def _fit_of(kind: str, total: int | None, run: str) -> dict[str, Any]:
    """The fit ``run``'s record, begun here if its first word is a step (a panel started mid-fit)."""
    if _state.fit is None or _state.fit["run"] != run:
        fit_begin(kind, total, run)
    fit = _state.fit
    assert fit is not None
    return fit


def fit_done(run: str) -> None:
    fit = _state.fit
    if fit is not None and fit["run"] == run:
        fit["done"] = True


def batch(run: str, kind: str, total: int | None, done: int, steps: int | None, logs: Any) -> None:
    """A train step ended (Keras's ``on_train_batch_end``): the step the split is measured over."""
    s = _state
    if not s.active:
        return
    fit = _fit_of(kind, total, run)
    s.batches = True
    fit["batch"], fit["steps"] = int(done), steps
    s.logs = logs
    _mark("batch", int(done), None)


def _mark(kind: str, step: int, value: float | None) -> None:
    s = _state
    now = time.monotonic()
    if s.op is not None:  # a step that ends inside a collective: its time so far is waiting
        s.wait += now - s.entered
        s.entered = now
    wall = now - s.step_began
    compute = max(wall - s.wait - s.exchange, 0.0)
    s.history.append((s.fits, kind, step, time.time(), compute, s.exchange, s.wait,
                      None if value is None else float(value)))
    s.step_began, s.wait, s.exchange = now, 0.0, 0.0


# -- what the publisher sends ------------------------------------------------------------------


def snapshot() -> dict[str, Any]:
    """This rank's state now, as the rank panel reads it (plain Python values). Local."""
    from mpinb._collective import cells

    s = _state
    s.seq += 1
    cell = cells.current()
    out: dict[str, Any] = {"rank": s.rank, "size": s.size, "engine": s.engine, "host": s.host, "seq": s.seq,
                           "time": time.time(), "cell": s.cells if cell.id else 0, "where": None, "op": None,
                           "running_for": time.monotonic() - s.cell_began if cell.id else None,
                           "rss": _rss(), "fit": None, "recent": _recent(s.history)}
    if out["rss"] is not None:
        s.memory.append((out["time"], out["rss"]))
    if cell.id:
        out["where"] = _where()
        op = s.op
        if op is not None:
            out["op"] = _op_state(op)
    fit = s.fit
    if fit is not None:
        fit = dict(fit)
        if s.batches and s.logs is not None:
            fit["batch_loss"] = _number(s.logs.get("loss") if hasattr(s.logs, "get") else None)
        out["fit"] = fit
    return out


def _recent(records: deque[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    n = len(records)  # indexing a deque near its end is quick; copying 20,000 records is not
    return [records[i] for i in range(max(n - _RECENT, 0), n)]


def history() -> dict[str, Any]:
    """Every step this rank recorded (up to :data:`HISTORY`), for :func:`mpinb.report`. Local."""
    s = _state
    return {"rank": s.rank, "host": s.host, "rss": _rss(),
            "fields": ["fit", "kind", "step", "time", "compute", "exchange", "wait", "value"],
            "steps": list(s.history), "memory": list(s.memory), "curves": list(s.curves)}


def _op_state(op: Any) -> dict[str, Any]:
    from mpinb._collective import protocol as _p

    now = time.monotonic()
    arriving = _state.arrived == 0.0
    state: dict[str, Any] = {"name": op.name, "index": int(op.index), "since": now - _state.entered,
                             "phase": "waiting" if arriving else "exchanging", "waiting_for": None}
    if arriving and op.phase is _p.ARRIVING:
        state["waiting_for"] = _missing(op)
    return state


def _missing(op: Any) -> list[int] | None:
    """The ranks ``op`` waits for, from the status board of this host (no message): those whose last
    collective on its communicator is before ``op``'s place. A rank on another host, whose row this
    one cannot read, counts as missing: the panel may name one rank too many, never too few."""
    chan, gen = op.chan, op.gen
    board = chan.board
    if gen is None or board is None:
        return None
    missing = []
    for r in range(chan.size):
        if r == chan.rank:
            continue
        row = board.read(r) if chan.hosts[r] == chan.host else None
        if row is None or (row.gen, row.index) < (gen.number, op.index):
            missing.append(r)
    return missing


def _where() -> dict[str, Any] | None:
    """Where the main thread is: the user's innermost line (``line``, in ``func`` when not the
    cell's top level, ``file`` when not a cell) and the innermost library call inside it (``call``)."""
    import os

    from mpinb import _frames

    frame = sys._current_frames().get(threading.main_thread().ident or 0)
    if frame is None:
        return None
    try:
        frames = _frames.frames_of(frame)
    finally:
        del frame
    kinds = [_frames.kind(f.file) for f in frames]
    if "user" not in kinds:
        return None
    at = kinds.index("user")
    user = frames[at]
    call = next((f.func for f, k in zip(frames[:at], kinds[:at], strict=True) if k == "library"), None)
    mpinb = next((f.func for f, k in zip(frames[:at], kinds[:at], strict=True) if k == "mpinb"), None)
    cell = _frames.is_cell(user.file)
    return {"line": user.line, "func": None if user.func == "<module>" else user.func,
            "file": None if cell else os.path.basename(user.file), "call": call, "mpinb": mpinb}


def _rss() -> int | None:
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:  # noqa: BLE001 - a number on a panel, not a reason to fail
        return None


def _crowded() -> bool:
    """Whether this host runs more ranks than it has cores. Each message then costs the ranks more
    than its own time (the client's and the engines' handling of it take a core from ranks that
    wait for each other): at 4 ranks on 2 cores a Keras step measured +3-6% with two messages a
    second per rank, so such a host sends one."""
    from mpinb._collective import _channels

    return any(getattr(chan, "crowded", False) for chan in list(_channels.values()))


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except Exception:  # noqa: BLE001 - a tensor that cannot be read now
        return None


def _publish_loop(interval: float) -> None:
    from mpinb._collective import cells
    from mpinb.live import _data_publisher

    last_cell = 0
    while True:
        _wake.wait(interval * (2 if _crowded() else 1))
        if _halt.is_set():
            return
        _wake.clear()
        cell = cells.current().id
        ended, _state.ended = _state.ended, False
        if not cell and not last_cell and not ended:
            continue  # idle, and the client has the idle state already
        last_cell = cell
        try:
            publisher = _data_publisher()
            if publisher is not None:
                publisher.publish_data({KEY: snapshot()})
        except Exception:  # noqa: BLE001 - a panel's update must never end the thread or reach the cell
            pass
