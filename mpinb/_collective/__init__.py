"""The collective layer: the one part of mpinb that calls MPI communication.

Every mpinb collective is an *operation* (:mod:`.ops`) on the *channel* (:mod:`.channel`) of a user
communicator. An operation begins with an arrival that checks every rank called the same collective,
from the same cell, at the same place in the sequence; its data then move with non-blocking calls.
Every wait polls (:mod:`.wait`): the deadline, Ctrl-C, notices from other ranks, and whether a rank
it waits for has ended the cell (:mod:`.cells`, :mod:`.board`). A rank that gives up revokes the
channel's generation; the others learn of it, and every rank moves to a fresh communicator, so the
next cell works and engine state survives. The error texts live in :mod:`.texts`. MPI, the clocks,
sleeping, signals, the running cell and a held-back Ctrl-C come from one object a channel is given,
its :class:`~mpinb._collective.runtime.Runtime` (this process's, unless the protocol model's).

Nothing here imports ``mpi4py.MPI`` until a channel is made, so ``import mpinb`` never starts MPI.
"""

from __future__ import annotations

import atexit
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from mpinb._collective.fused import plan
from mpinb._collective.runtime import PROCESS, Runtime
from mpinb._roles import refuse_client
from mpinb._words import on_ranks
from mpinb.deadline import DEFAULT

if TYPE_CHECKING:
    from mpinb._collective.channels import Channel
    from mpinb._collective.ops import Op
    from mpinb.interrupt import StopFlag

__all__ = ["allgather", "allreduce", "barrier", "bcast", "cell_end_check", "channel", "collective", "collective_call",
           "common_exception", "failures", "gather", "gather_rows", "reduce_in_place", "vote"]


def channel(comm: Any = None) -> Channel:
    """The channel of ``comm`` (default ``COMM_WORLD``), made on first use.

    Creating it communicates nothing: the set-up exchange runs inside the first operation.
    ``comm=None`` in the client of a running ``MPICluster`` raises, before MPI is imported
    (:mod:`mpinb._roles`): the ranks are its engines, not this process.
    """
    if comm is None:
        global _world
        refuse_client()
        if _world is None:
            _world = _lookup(PROCESS.mpi.COMM_WORLD)
        return _world
    return _lookup(comm)


def collective(
    comm: Any, name: str, layout: Any = None, *, timeout: Any = DEFAULT, votes: tuple[int, ...] = (),
    what: str | None = None,
) -> Op:
    """Begin operation ``name``: use as ``with collective(comm, "allreduce", layout) as op:``.

    ``layout`` (hashable, with a deterministic ``repr``) must be equal on every rank; ``what``
    names it in the mismatch error. ``votes`` are up to three non-negative integers; each one's maximum over
    the ranks is in ``op.votes`` (a 3-tuple) once the ranks have arrived.
    """
    return channel(comm).begin(name, layout, timeout=timeout, votes=votes, what=what)


def reduce_in_place(buffers: Sequence[np.ndarray], op: str | Sequence[str] = "sum", *, comm: Any = None, name: str,
                    timeout: Any = DEFAULT, votes: tuple[int, ...] = (), stop: StopFlag | None = None,
                    where: str = "") -> Op:
    """Reduce each contiguous buffer over the ranks, in place: one operation, a message a buffer.

    ``op`` is one op for every buffer or one per buffer. ``votes`` ride in the arrival (see
    :func:`collective`), and so does ``stop``: see :func:`_stop_together`. Returns the finished
    operation, whose ``votes`` and ``waited`` the caller may read.
    """
    ops = [op] * len(buffers) if isinstance(op, str) else list(op)
    layout = (tuple(ops), tuple((b.shape, b.dtype.str) for b in buffers))
    with collective(comm, name, layout, timeout=timeout, votes=_with_stop(votes, stop),
                    what=f"{name}'s buffers") as call:
        if not _stopped(call, stop):
            for kind in dict.fromkeys(ops):
                call.allreduce([b for b, o in zip(buffers, ops, strict=True) if o == kind], kind)
    _stop_together(call, stop, where)
    return call


def allreduce(arrays: Sequence[np.ndarray], op: str = "sum", *, out: Sequence[np.ndarray] | None = None,
              comm: Any = None, name: str, timeout: Any = DEFAULT, what: str | None = None) -> list[Any]:
    """The fused reduction of ``arrays`` (see :mod:`.fused`): one message per dtype, the arrival
    checking every rank passed the same shapes, dtypes and ``op``; results in ``out`` if given."""
    chan = channel(comm)
    fused = plan(arrays, op, chan.plans)
    if out is not None:
        out = fused.check_out(out, arrays)
    with chan.begin(name, fused, timeout=timeout, what=what or f"{name}'s shapes, dtypes and op") as call:
        return fused.run(arrays, call, out)


def allgather(obj: Any, *, comm: Any = None, name: str, timeout: Any = DEFAULT, stop: StopFlag | None = None,
              where: str = "") -> list[Any]:
    """Every rank's ``obj`` (pickled), in rank order, on every rank; ``stop`` as in :func:`_stop_together`."""
    with collective(comm, name, timeout=timeout, votes=_with_stop((), stop)) as call:
        gathered = None if _stopped(call, stop) else call.allgather(obj)
    _stop_together(call, stop, where)
    assert gathered is not None  # a stopped gather raised in _stop_together
    return gathered


def gather(obj: Any, *, root: int = 0, comm: Any = None, name: str, timeout: Any = DEFAULT) -> list[Any] | None:
    """Every rank's ``obj`` (pickled), in rank order, on ``root``; ``None`` elsewhere."""
    with collective(comm, name, ("root", root), timeout=timeout) as call:
        return call.gather(obj, root)


@overload
def gather_rows(rows: np.ndarray, *, root: None, comm: Any = ..., name: str, timeout: Any = ...,
                what: str | None = ...) -> np.ndarray: ...
@overload
def gather_rows(rows: np.ndarray, *, root: int = ..., comm: Any = ..., name: str, timeout: Any = ...,
                what: str | None = ...) -> np.ndarray | None: ...
def gather_rows(rows: np.ndarray, *, root: int | None = 0, comm: Any = None, name: str, timeout: Any = DEFAULT,
                what: str | None = None) -> np.ndarray | None:
    """Every rank's rows (contiguous, axis 0, any count) in rank order, on ``root`` (``None``: on
    every rank); the arrival checks the trailing shape, dtype and root.

    A 0-d ``rows`` (a scalar: no axis 0) on any rank makes every rank raise the same ``ValueError``
    naming those ranks. Whether a rank's input is 0-d is data, so the verdict rides in the arrival
    as a vote: a rank that raised alone would leave the others waiting in this collective, and the
    common case pays nothing for the check.
    """
    scalar = rows.ndim == 0
    layout = f"rows of shape {rows.shape[1:]} and dtype {rows.dtype}" + ("" if root is None else f", to rank {root}")
    with collective(comm, name, layout, timeout=timeout, what=what or f"{name}'s row shape, dtype and root",
                    votes=(int(scalar),)) as call:
        if call.votes[0]:
            call.fail(ValueError(_no_rows_message(name, call.allgather(scalar), call.size)))
        if rows.dtype.kind not in "biufc":
            # Objects and strings have no fixed-size MPI type; small, so pickling is fine here.
            parts = call.allgather(rows) if root is None else call.gather(rows, root)
            return None if parts is None else np.concatenate(parts)
        gathered = call.gather_blocks(rows, root)
        return None if gathered is None else gathered[0]


def bcast(obj: Any, *, root: int = 0, comm: Any = None, name: str, timeout: Any = DEFAULT) -> Any:
    """Root's ``obj`` on every rank: a numeric NumPy array by buffer, anything else pickled (an
    object root cannot pickle raises the same ``TypeError`` on every rank). Root gets ``obj`` back."""
    with collective(comm, name, ("root", root), timeout=timeout) as call:
        if call.size == 1:
            return obj
        is_root = call.rank == root
        numeric = is_root and isinstance(obj, np.ndarray) and obj.dtype.kind in "biufc"
        header = call.bcast((("array", obj.shape, obj.dtype.str) if numeric else ("object", obj)) if is_root else None,
                            root, label=type(obj).__name__)
        if header[0] == "object":
            return obj if is_root else header[1]
        _, shape, dtype = header
        buf = np.ascontiguousarray(obj) if is_root else np.empty(shape, dtype=dtype)
        call.bcast_array(buf, root)
        return obj if is_root else buf


def barrier(*, comm: Any = None, name: str, timeout: Any = DEFAULT, layout: Any = None,
            what: str | None = None) -> float:
    """Wait until every rank has arrived, with the same ``layout`` (else every rank raises
    :class:`~mpinb.CollectiveMismatchError` naming ``what``); returns the seconds spent waiting."""
    with collective(comm, name, layout, timeout=timeout, what=what) as call:
        return call.waited


def vote(value: int | Sequence[int], *, comm: Any = None, name: str, timeout: Any = DEFAULT) -> Any:
    """The largest of every rank's non-negative ``value`` (or, for up to three values, of each):
    it rides in the arrival, no message of its own."""
    several = not isinstance(value, (int, np.integer))
    values = (int(value),) if isinstance(value, (int, np.integer)) else tuple(int(v) for v in value)
    with collective(comm, name, timeout=timeout, votes=values) as call:
        return call.votes[:len(values)] if several else call.votes[0]


def failures(report: Any, *, root: int | None = None, comm: Any = None, name: str,
             timeout: Any = DEFAULT) -> dict[int, Any]:
    """Every failing rank's ``report`` (``None``: this rank is fine), by rank, on every rank.

    One operation: whether any rank failed rides in the arrival, so the common case moves no data;
    only then do the reports travel (with ``root``, only root may fail and its report is broadcast).
    """
    with collective(comm, name, None if root is None else ("root", root), timeout=timeout,
                    votes=(int(report is not None),)) as call:
        if not call.votes[0]:
            return {}
        if root is not None:
            return {root: call.bcast(report, root)}
        return {rank: r for rank, r in enumerate(call.allgather(report)) if r is not None}


def common_exception(module: str, qualname: str, message: str, *, comm: Any = None, name: str,
                     timeout: Any = DEFAULT) -> BaseException:
    """The exception of type ``module.qualname`` with ``message`` that every rank can build: that
    type where every rank can import it by name, else ``RuntimeError`` naming it (one operation)."""
    from mpinb._collective.exceptions import agreed

    with collective(comm, name, (module, qualname), timeout=timeout) as call:
        return agreed(call, module, qualname, message)


def cell_end_check(value: Any = None, *, runtime: Runtime = PROCESS) -> Any:
    """Compare the collectives of the cell that is ending with every other rank's, on each
    communicator this rank used in it (collective); returns ``value``. The last statement of every
    cell on an engine calls it (:mod:`.cells`), so a rank that skipped or added a collective fails
    its cell, and so does every other rank, instead of keeping a value paired with another call.
    ``runtime``: the process whose channels compare (the protocol model's simulated ranks share
    one Python process)."""
    cell = runtime.cell()
    if cell.id:
        for chan in list(_channels.values()):
            if chan.runtime is runtime:
                chan.end_cell_check(cell)
    return value


@contextmanager
def collective_call(name: str, comm: Any) -> Iterator[None]:
    """Run an mpinb call every rank of ``comm`` makes (``mpinb.keras.fit``, ``KMeans.fit``) named
    ``name``: ``with collective_call("mpinb.keras.fit", comm):``, with ``comm`` resolved.

    An exception of this rank's own code (TensorFlow's error in a train step, a callback's) that
    escapes the call between two operations would leave the other ranks waiting for its next
    collective: in a script nothing else ends that wait. This rank then revokes the generation at
    the place it will not take (:meth:`~mpinb._collective.channels.Channel.raised_between`), and
    the ranks in the same call raise within their next look at their notices, naming this rank and
    its error; a rank that has already left the call (the error came after its last collective)
    runs its next collective on the next generation, where this rank's next one meets it. Errors
    the layer raised (a timeout, an abandoned or mismatched collective, a decision every rank
    raises) were dealt with where they arose, and pass untouched; so do interrupts, which the
    stop flags handle. In a cell the cell's end names the rank instead, and with one rank nothing
    waits.
    """
    chan = channel(comm)
    if chan.size == 1:
        yield
        return
    if chan.depth == 0:
        chan.calls += 1
        chan.scope = (name, chan.calls)
    chan.depth += 1
    try:
        yield
    except Exception as err:
        if not _raised_together(err):
            chan.raised_between(err, name)
        raise
    finally:
        chan.depth -= 1
        if chan.depth == 0:
            chan.scope = None


def _raised_together(err: BaseException) -> bool:
    """Whether the collective layer raised ``err`` (a timeout, an abandoned or mismatched
    collective: every rank concerned was told) or one of its decisions every rank raises alike
    (``check_all``, ``raise_together``, ``on_root``: raised where the decision was read)."""
    from mpinb.errors import CollectiveAbandoned, CollectiveMismatchError, CollectiveTimeout

    if isinstance(err, (CollectiveAbandoned, CollectiveMismatchError, CollectiveTimeout)):
        return True
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    module = "" if tb is None else tb.tb_frame.f_globals.get("__name__", "")
    return module.startswith(_DECIDING)


_DECIDING = ("mpinb._collective", "mpinb.agreement", "mpinb.comm")  # modules whose raises every rank makes


def _no_rows_message(name: str, scalars: list[bool], size: int) -> str:
    ranks = [rank for rank, scalar in enumerate(scalars) if scalar]
    return (f"{name} needs rows along axis 0; got a 0-d value (a scalar) {on_ranks(ranks, size)}. Pass a 1-D "
            "array for a column of scalars (np.atleast_1d(x), or np.empty(0) on a rank without rows).")


_STOP_VOTE = 2  # a cooperative stop rides in the arrival's last vote; the caller's take the others


def _with_stop(votes: tuple[int, ...], stop: StopFlag | None) -> tuple[int, ...]:
    """The caller's ``votes`` with ``stop``'s request in the last place (they keep theirs)."""
    if stop is None:
        return tuple(votes)
    if len(votes) > _STOP_VOTE:
        raise ValueError(f"at most {_STOP_VOTE} votes ride beside a stop flag, not {len(votes)}")
    return tuple(votes) + (0,) * (_STOP_VOTE - len(votes)) + (int(stop.requested),)


def _stopped(call: Op, stop: StopFlag | None) -> bool:
    return stop is not None and call.votes[_STOP_VOTE] > 0


def _stop_together(call: Op, stop: StopFlag | None, where: str) -> None:
    """A cooperative stop: when Ctrl-C reached any rank inside ``stop`` (a
    :class:`~mpinb.interrupt.StopFlag`), its vote rode in the arrival, no data moved, and every
    rank raises ``KeyboardInterrupt`` here, with the message ``stop.raise_interrupt(where)`` gives."""
    if stop is not None and _stopped(call, stop):
        stop.raise_interrupt(where)


_channels: dict[int, Channel] = {}
_world: Channel | None = None
_keyval: Any = None
_IDLE_NOTICES = 0.05  # seconds between looks at notices on an engine idle between cells


def _lookup(comm: Any) -> Channel:
    # By handle: a dict hit, and it calls nothing on ``comm``. An MPI attribute on the communicator
    # drops the entry when it is freed, so a later communicator that reuses the handle starts afresh.
    handle = comm.handle
    chan = _channels.get(handle)
    if chan is None:
        global _keyval
        MPI = PROCESS.mpi  # noqa: N806 - mpi4py's name

        from mpinb._collective import cells
        from mpinb._collective.channels import Channel

        if _keyval is None:
            _keyval = MPI.Comm.Create_keyval(delete_fn=_on_comm_free)
            atexit.register(_close_all)
            if cells.install():
                cells.on_cell(_on_cell)
                cells.on_idle(_on_idle, _IDLE_NOTICES)
        chan = _channels[handle] = Channel(comm)
        MPI.Comm.fromhandle(handle).Set_attr(_keyval, handle)
    return chan


def _on_cell(event: str, cell: Any, error: BaseException | None) -> None:
    for chan in list(_channels.values()):
        try:
            chan.on_cell(event, cell, error)
        except Exception:  # noqa: BLE001 - a hook must never break the user's cell
            pass


def _on_idle() -> None:
    if not PROCESS.mpi.Is_finalized():
        for chan in list(_channels.values()):
            if not chan.closed:
                chan.notices()


def _on_comm_free(comm: Any, keyval: Any, handle: int) -> None:
    chan = _channels.pop(handle, None)
    if chan is not None:
        chan.close()


def _close_all() -> None:
    # Before mpi4py finalizes MPI (it does so after the atexit handlers).
    if PROCESS.mpi.Is_finalized():
        return
    global _world
    for chan in list(_channels.values()):
        chan.close()
        chan.collect()
    _channels.clear()
    _world = None
