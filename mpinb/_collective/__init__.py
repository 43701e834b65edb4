"""The collective layer: the one part of mpinb that calls MPI communication.

Every mpinb collective is an *operation* (:mod:`.ops`) on the *channel* (:mod:`.channel`) of a user
communicator. An operation begins with an arrival that checks every rank called the same collective,
from the same cell, at the same place in the sequence; its data then move with non-blocking calls.
Every wait polls (:mod:`.wait`): the deadline, Ctrl-C, notices from other ranks, and whether a rank
it waits for has ended the cell (:mod:`.cells`, :mod:`.board`). A rank that gives up revokes the
channel's generation; the others learn of it, and every rank moves to a fresh communicator, so the
next cell works and engine state survives. The error texts live in :mod:`.texts`.

Nothing here imports ``mpi4py.MPI`` until a channel is made, so ``import mpinb`` never starts MPI.
"""

from __future__ import annotations

import atexit
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from mpinb.deadline import DEFAULT

if TYPE_CHECKING:
    from mpinb._collective.channels import Channel
    from mpinb._collective.ops import Op

__all__ = ["allgather", "barrier", "bcast", "channel", "collective", "reduce_in_place"]


def channel(comm: Any = None) -> Channel:
    """The channel of ``comm`` (default ``COMM_WORLD``), made on first use.

    Creating it communicates nothing: the set-up exchange runs inside the first operation.
    """
    if comm is None:
        global _world
        if _world is None:
            from mpi4py import MPI

            _world = _lookup(MPI.COMM_WORLD)
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


def reduce_in_place(buffers: Sequence[np.ndarray], op: str | Sequence[str] = "sum", *, comm: Any = None, name: str,
                    timeout: Any = DEFAULT, votes: tuple[int, int] = (0, 0)) -> Op:
    """Reduce each contiguous buffer over the ranks, in place: one operation, a message a buffer.

    ``op`` is one op for every buffer or one per buffer. ``votes`` ride in the arrival (see
    :func:`collective`): a stop decision costs no message of its own. Returns the finished
    operation, whose ``votes`` and ``waited`` the caller may read.
    """
    ops = [op] * len(buffers) if isinstance(op, str) else list(op)
    layout = (tuple(ops), tuple((b.shape, b.dtype.str) for b in buffers))
    with collective(comm, name, layout, timeout=timeout, votes=votes, what=f"{name}'s buffers") as call:
        for kind in dict.fromkeys(ops):
            call.allreduce([b for b, o in zip(buffers, ops) if o == kind], kind)
    return call


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


_channels: dict[int, Channel] = {}
_world: Channel | None = None
_keyval: Any = None


def _lookup(comm: Any) -> Channel:
    # By handle: a dict hit, and it calls nothing on ``comm``. An MPI attribute on the communicator
    # drops the entry when it is freed, so a later communicator that reuses the handle starts afresh.
    handle = comm.handle
    chan = _channels.get(handle)
    if chan is None:
        global _keyval
        from mpi4py import MPI

        from mpinb._collective import cells
        from mpinb._collective.channels import Channel

        if _keyval is None:
            _keyval = MPI.Comm.Create_keyval(delete_fn=_on_comm_free)
            atexit.register(_close_all)
            if cells.install():
                cells.on_cell(_on_cell)
        chan = _channels[handle] = Channel(comm)
        MPI.Comm.fromhandle(handle).Set_attr(_keyval, handle)
    return chan


def _on_cell(event: str, cell: Any, error: BaseException | None) -> None:
    for chan in list(_channels.values()):
        try:
            chan.on_cell(event, cell, error)
        except Exception:  # noqa: BLE001 - a hook must never break the user's cell
            pass


def _on_comm_free(comm: Any, keyval: Any, handle: int) -> None:
    chan = _channels.pop(handle, None)
    if chan is not None:
        chan.close()


def _close_all() -> None:
    # Before mpi4py finalizes MPI (it does so after the atexit handlers).
    from mpi4py import MPI

    if MPI.Is_finalized():
        return
    global _world
    for chan in list(_channels.values()):
        chan.close()
        chan.collect()
    _channels.clear()
    _world = None
