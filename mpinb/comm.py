"""Rank-aware communication helpers: the world, fused collectives, ordered output, thread budgets.

Every collective here with ``comm=None`` raises ``RuntimeError`` in the notebook's kernel while an
``MPICluster`` runs there, before MPI is imported: the ranks are the engines, and the call belongs
in a ``%%px`` cell (``mpinb._roles`` has the rule; an explicit ``comm`` is never refused).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

from mpinb import _collective
from mpinb._checks import check_int, is_int
from mpinb._collective.exceptions import record
from mpinb._collective.fused import OPS
from mpinb.deadline import DEFAULT

__all__ = [
    "World",
    "allreduce",
    "bcast",
    "gather_rows",
    "limit_threads",
    "on_root",
    "rprint",
    "world",
]



@dataclass(frozen=True)
class World:
    """Where this process sits: its rank in a communicator and on its node."""

    rank: int
    size: int
    host: str
    local_rank: int
    local_size: int
    comm: Any

    @property
    def is_root(self) -> bool:
        """True on rank 0, the rank that owns root-only side effects."""
        return self.rank == 0

    def __repr__(self) -> str:
        return (
            f"World(rank={self.rank}, size={self.size}, host={self.host!r}, "
            f"local_rank={self.local_rank}, local_size={self.local_size})"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # Without the communicator: a World pulled to the notebook must not import mpi4py.MPI there.
        return (World, (self.rank, self.size, self.host, self.local_rank, self.local_size, None))


def world(comm: Any = None, *, timeout: Any = DEFAULT) -> World:
    """Describe this rank: rank, size, host and its place among the ranks on the same node.

    Collective: the first time it meets ``comm``, mpinb sets up its private communicators and
    the status board that lets a rank name the missing ranks when a collective times out, even the
    first one (``MPICluster`` calls it when the engines start). Local afterwards.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm, optional
        Defaults to ``MPI.COMM_WORLD``.
    timeout : float or None, optional
        Seconds to wait for the other ranks before raising :class:`~mpinb.CollectiveTimeout`; by
        default :func:`mpinb.get_collective_timeout`, and ``None`` waits forever.

    Returns
    -------
    World
        ``rank``, ``size``, ``is_root``, ``host``, ``local_rank``, ``local_size`` and ``comm``
        (``None`` in a copy pulled to the client).

    Examples
    --------
    >>> w = mpinb.world()
    >>> w.rank, w.size, w.local_size   # on rank 0 of four ranks on one host  # doctest: +SKIP
    (0, 4, 4)
    >>> 0 <= w.rank < w.size and w.is_root == (w.rank == 0)
    True
    """
    chan = _collective.channel(comm)
    chan.ensure_ready(timeout)
    local = chan.local_ranks()
    return World(
        rank=chan.rank,
        size=chan.size,
        host=chan.host,
        local_rank=local.index(chan.rank),
        local_size=len(local),
        comm=chan.parent,
    )


def allreduce(arrays: Sequence[Any], *, op: str = "sum", out: Sequence[np.ndarray] | None = None, comm: Any = None,
              timeout: Any = DEFAULT) -> list[Any]:
    """Reduce a list of arrays and scalars over all ranks with one buffer collective per dtype.

    Collective. Small arrays of the same dtype are packed into one buffer and reduced with a single
    message, which is what makes many small arrays (a model's gradients, k-means sums and counts)
    cheap; arrays from 64 KiB travel on their own, straight from the input into the result, with
    no packing copy. The wire buffers are reused from call to call once the results of an earlier
    call are dropped (MPI is several times faster on memory it has used before); pass ``out`` to
    reduce into arrays of your own, e.g. ``out=arrays`` to reduce in place. The arrival message that starts every
    mpinb collective also checks that every rank passed the same shapes, dtypes and ``op``; if not,
    every rank raises :class:`~mpinb.CollectiveMismatchError` before any data moves and the
    communicator stays usable.

    Parameters
    ----------
    arrays : sequence of array_like
        NumPy arrays and scalars, of any shapes and dtypes. A lone array is reduced as a
        one-element list.
    op : {"sum", "mean", "min", "max"}, default "sum"
        ``"mean"`` divides the sum by the number of ranks (integers become float64, as in NumPy).
        Booleans are summed as int64, and ``"min"``/``"max"`` act as logical and/or on them.
    out : sequence of numpy.ndarray, optional
        One array per input, of its result's shape and dtype, that receives the result (it may be
        the input itself). Local: it changes nothing that goes over the wire.
    comm : mpi4py.MPI.Comm, optional
        Defaults to ``MPI.COMM_WORLD``.
    timeout : float or None, optional
        Seconds to wait for the other ranks before raising :class:`~mpinb.CollectiveTimeout`; by
        default :func:`mpinb.get_collective_timeout`, and ``None`` waits forever.

    Returns
    -------
    list
        The reduced values in input order, with their shapes: arrays for arrays, NumPy scalars
        for scalars; with ``out``, the arrays of ``out``.

    Examples
    --------
    >>> sums, counts = mpinb.allreduce([X_local.sum(axis=0), len(X_local)])
    >>> mean = sums / counts
    """
    if op not in OPS:
        raise ValueError(f"op must be one of {', '.join(map(repr, OPS))}; got {op!r}.")
    if isinstance(arrays, np.ndarray):
        arrays = [arrays]
    return _collective.allreduce(list(map(np.asarray, arrays)), op, out=out, comm=comm, name="allreduce",
                                 timeout=timeout)


def bcast(obj: Any, *, root: int = 0, comm: Any = None, timeout: Any = DEFAULT) -> Any:
    """Broadcast ``obj`` from ``root``: NumPy arrays by buffer, anything else by pickle.

    Collective. Non-root ranks may pass anything (``None`` is customary); they receive root's
    object. If ``obj`` cannot be pickled on root, every rank raises the same ``TypeError``.

    Parameters
    ----------
    obj : object
        The value on ``root``; ignored elsewhere.
    root : int, default 0
        The sending rank.
    comm : mpi4py.MPI.Comm, optional
        Defaults to ``MPI.COMM_WORLD``.
    timeout : float or None, optional
        Seconds to wait for the other ranks before raising :class:`~mpinb.CollectiveTimeout`; by
        default :func:`mpinb.get_collective_timeout`, and ``None`` waits forever.

    Returns
    -------
    object
        Root's ``obj`` on every rank (root gets its own object back, not a copy).
    """
    chan = _collective.channel(comm)
    _check_root(root, chan.size)
    return _collective.bcast(obj, root=root, comm=comm, name="bcast", timeout=timeout)


@overload
def gather_rows(local: Any, *, root: None, comm: Any = ..., timeout: Any = ...) -> np.ndarray: ...
@overload
def gather_rows(local: Any, *, root: int = ..., comm: Any = ..., timeout: Any = ...) -> np.ndarray | None: ...
def gather_rows(local: Any, *, root: int | None = 0, comm: Any = None, timeout: Any = DEFAULT) -> np.ndarray | None:
    """Concatenate each rank's rows in rank order; ranks may hold different numbers of rows.

    Collective. The arrival message checks the trailing shape and dtype, so a rank whose rows have
    a different width or dtype makes every rank raise :class:`~mpinb.CollectiveMismatchError`
    instead of corrupting the result. The row counts are then gathered, and the rows move with one
    ``Gatherv`` (or ``Allgatherv``) using counts and displacements.

    Parameters
    ----------
    local : array_like
        This rank's rows (axis 0). A 1-D array is a column of scalars. Zero rows are allowed; a
        0-d value (a scalar) is not: pass ``np.atleast_1d(x)``.
    root : int or None, default 0
        The rank that receives the result; ``None`` gathers to every rank.
    comm : mpi4py.MPI.Comm, optional
        Defaults to ``MPI.COMM_WORLD``.
    timeout : float or None, optional
        Seconds to wait for the other ranks before raising :class:`~mpinb.CollectiveTimeout`; by
        default :func:`mpinb.get_collective_timeout`, and ``None`` waits forever.

    Returns
    -------
    numpy.ndarray or None
        All rows in rank order on ``root`` (on every rank when ``root=None``); ``None`` elsewhere.

    Raises
    ------
    ValueError
        On every rank, when ``local`` is 0-d on any rank (the message names those ranks).
    """
    chan = _collective.channel(comm)
    if root is not None:
        _check_root(root, chan.size)
    # Not ascontiguousarray: it makes a 0-d value 1-d, one row. A 0-d value on any rank is
    # refused on every rank by the collective itself (the check is data-dependent).
    arr = np.asarray(local, order="C")
    return _collective.gather_rows(arr, root=root, comm=comm, name="gather_rows", timeout=timeout)


def on_root(fn: Callable[..., Any], *args: Any, comm: Any = None, timeout: Any = DEFAULT, **kwargs: Any) -> Any:
    """Call ``fn(*args, **kwargs)`` on rank 0 only and give its result (or exception) to every rank.

    Collective. Use it for root-only side effects whose outcome every rank must know: reading a
    config file, writing a checkpoint, drawing shared random numbers. If ``fn`` raises on root,
    the same exception type and message is raised on every rank (``RuntimeError`` naming the type
    where some rank cannot import it by name: exceptions cross as module, name and message). ``timeout``
    (seconds, default :func:`mpinb.get_collective_timeout`, ``None`` waits forever) bounds the whole call,
    ``fn``'s run on root included; past it the waiting ranks raise :class:`~mpinb.CollectiveTimeout`.

    Returns
    -------
    object
        ``fn``'s return value on every rank (broadcast with :func:`bcast`).
    """
    chan = _collective.channel(comm)
    result: Any = None
    error: Exception | None = None
    if chan.rank == 0:
        try:
            result = fn(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - re-raised on every rank below (one rank included)
            error = err
    failed = _collective.failures(None if error is None else record(error), root=0, comm=comm, name="on_root",
                                  timeout=timeout)
    if not failed:
        return _collective.bcast(result, root=0, comm=comm, name="on_root's result", timeout=timeout)
    raised = _collective.common_exception(*failed[0], comm=comm, name="on_root's exception", timeout=timeout)
    raised.add_note(f"raised on rank 0 by {getattr(fn, '__qualname__', repr(fn))} (mpinb.on_root)")
    raise raised from error


def rprint(
    *args: Any, comm: Any = None, root_only: bool = False, sep: str = " ", file: Any = None, timeout: Any = DEFAULT
) -> None:
    """Print from every rank in rank order, each line prefixed ``[rank r/n]``.

    Collective: the lines are gathered and printed by rank 0, so they come out in order even where
    each rank's stdout travels separately (ipyparallel, ``mpiexec``). With ``root_only=True`` only
    rank 0 prints and nothing is communicated. ``timeout`` as in :func:`allreduce`.
    """
    chan = _collective.channel(comm)
    rank, size = chan.rank, chan.size
    text = sep.join(map(str, args))
    stream = sys.stdout if file is None else file
    if root_only:
        if rank == 0:
            print(_prefix(text, 0, size), file=stream, flush=True)
        return
    texts = _collective.gather(text, root=0, comm=comm, name="rprint", timeout=timeout)
    if texts is not None:  # on rank 0
        print("\n".join(_prefix(t, r, size) for r, t in enumerate(texts)), file=stream, flush=True)


def limit_threads(n: int | None = None, *, comm: Any = None, timeout: Any = DEFAULT) -> int:
    """Set this rank's BLAS/OpenMP (and TensorFlow) thread budget so ranks do not oversubscribe cores.

    Collective: the first time it meets ``comm`` (as :func:`world`). With ``n=None`` the ranks on
    each node share the cores their CPU affinity allows, ``max(1, cores // ranks_on_node)`` each,
    from the hosts and affinities mpinb exchanged when it set up. Sets the variables
    read by libraries loaded later (``OMP_NUM_THREADS`` and friends, ``TF_NUM_*_THREADS``), limits
    already-loaded BLAS/OpenMP pools with threadpoolctl, and configures TensorFlow when it is
    imported and not yet initialised.

    Parameters
    ----------
    n : int, optional
        Threads per rank; computed from the node when omitted.
    comm : mpi4py.MPI.Comm, optional
        Defaults to ``MPI.COMM_WORLD``.
    timeout : float or None, optional
        Seconds to wait for the other ranks before raising :class:`~mpinb.CollectiveTimeout`; by
        default :func:`mpinb.get_collective_timeout`, and ``None`` waits forever.

    Returns
    -------
    int
        The number of threads this rank now uses.
    """
    if n is not None:
        check_int(n, "n", minimum=1, unit="number of threads")
    if n is None:
        n = _default_threads(comm, timeout)
    n = int(n)
    global _chosen_threads
    _chosen_threads = n
    os.environ.update(thread_env(n))
    from threadpoolctl import threadpool_limits

    # Keeping a reference is unnecessary: threadpool_limits applies at construction and the limits
    # persist until someone restores them.
    threadpool_limits(limits=n)
    _limit_tensorflow(n)
    return n


_chosen_threads: int | None = None  # the budget limit_threads last set in this process


def threads_chosen() -> bool:
    """Whether this rank already has a thread budget: set by :func:`limit_threads`, or given in
    its environment (``mpinb.MPICluster``'s engines have one from the start; ``mpinb.client.launch``
    gives one when asked for ``threads_per_rank``).

    Local. Helpers that would pick a budget for the user (``mpinb.keras.fit``) do so only when
    this is false, so they never undo the user's choice.
    """
    return _chosen_threads is not None or any(v in os.environ for v in ("OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS"))


def thread_env(n: int) -> dict[str, str]:
    """The environment variables that size every thread pool a rank meets, for ``n`` threads each.

    Local: the one list, used by :func:`limit_threads` on the ranks and by ``mpinb.client.launch``
    for the processes it starts. BLAS and OpenMP pools get ``n`` threads; TensorFlow ``n`` inside
    an operation and one across operations (more would oversubscribe the rank's cores).
    """
    pools = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
             "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS", "TF_NUM_INTRAOP_THREADS")
    return {**{var: str(n) for var in pools}, "TF_NUM_INTEROP_THREADS": "1"}




def _check_root(root: int, size: int) -> None:
    if not is_int(root) or not 0 <= root < size:
        raise ValueError(f"root must be a rank between 0 and {size - 1}; got {root!r}.")


def _prefix(text: str, rank: int, size: int) -> str:
    tag = f"[rank {rank}/{size}] "
    return "\n".join(tag + line for line in (text.splitlines() or [""]))


def _default_threads(comm: Any, timeout: Any) -> int:
    chan = _collective.channel(comm)
    chan.ensure_ready(timeout)
    return max(1, min(len(chan.affinity[chan.rank]), len(chan.host_cores()) // len(chan.local_ranks())))


def _limit_tensorflow(n: int) -> None:
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return
    try:
        tf.config.threading.set_intra_op_parallelism_threads(n)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    except RuntimeError:
        # TensorFlow fixes its pools when its runtime starts; later calls are refused. The
        # environment variables above still apply to processes started from here.
        import warnings

        warnings.warn(
            "TensorFlow is already initialised, so its thread pools keep their size; call "
            "mpinb.limit_threads() before building the first model.",
            RuntimeWarning,
            stacklevel=3,
        )
