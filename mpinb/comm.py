"""Rank-aware communication helpers: the world, fused collectives, ordered output, thread budgets."""

from __future__ import annotations

import os
import pickle
import socket
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from mpinb import deadline as _deadline
from mpinb.deadline import DEFAULT
from mpinb.errors import CollectiveMismatchError, _check_same, _resolve

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

_OPS = ("sum", "mean", "min", "max")


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


def world(comm: Any = None, *, timeout: Any = DEFAULT) -> World:
    """Describe this rank: rank, size, host and its place among the ranks on the same node.

    Collective: it splits ``comm`` by shared-memory node to count the ranks on this node, and frees
    that communicator before returning.

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
        ``rank``, ``size``, ``is_root``, ``host``, ``local_rank``, ``local_size`` and ``comm``.

    Examples
    --------
    >>> w = mpinb.world()
    >>> w.rank, w.size, w.local_size
    (0, 4, 4)
    """
    comm = _resolve(comm)
    with _deadline.begin(comm, "world", timeout) as call:
        # MPI has no non-blocking split: under a deadline, first make sure every rank is here.
        call.barrier()
        node = _node_comm(comm)
    try:
        local_rank, local_size = node.Get_rank(), node.Get_size()
    finally:
        node.Free()
    return World(
        rank=comm.Get_rank(),
        size=comm.Get_size(),
        host=socket.gethostname(),
        local_rank=local_rank,
        local_size=local_size,
        comm=comm,
    )


def allreduce(arrays: Sequence[Any], *, op: str = "sum", comm: Any = None, timeout: Any = DEFAULT) -> list[Any]:
    """Reduce a list of arrays and scalars over all ranks with one buffer collective per dtype.

    Collective. Arrays of the same dtype are packed into one persistent buffer and reduced with a
    single ``Allreduce``, which is what makes many small arrays (a model's gradients, k-means
    sums and counts) cheap; payloads above 8 MiB go in 4 MiB segments, which MPI reduces faster
    than one huge message. Before any data moves, one two-integer ``Allreduce`` checks that every
    rank passed the same shapes, dtypes and ``op``; if not, every rank raises
    :class:`~mpinb.CollectiveMismatchError` and the communicator stays usable.

    Parameters
    ----------
    arrays : sequence of array_like
        NumPy arrays and scalars, of any shapes and dtypes. A lone array is reduced as a
        one-element list.
    op : {"sum", "mean", "min", "max"}, default "sum"
        ``"mean"`` divides the sum by the number of ranks (integers become float64, as in NumPy).
        Booleans are summed as int64, and ``"min"``/``"max"`` act as logical and/or on them.
    comm : mpi4py.MPI.Comm, optional
        Defaults to ``MPI.COMM_WORLD``.
    timeout : float or None, optional
        Seconds to wait for the other ranks before raising :class:`~mpinb.CollectiveTimeout`; by
        default :func:`mpinb.get_collective_timeout`, and ``None`` waits forever.

    Returns
    -------
    list
        The reduced values in input order, with their shapes: arrays for arrays, NumPy scalars
        for scalars.

    Examples
    --------
    >>> sums, counts = mpinb.allreduce([X_local.sum(axis=0), len(X_local)])
    >>> mean = sums / counts
    """
    if op not in _OPS:
        raise ValueError(f"op must be one of {', '.join(map(repr, _OPS))}; got {op!r}.")
    if isinstance(arrays, np.ndarray):
        arrays = [arrays]
    values = [np.asarray(a) for a in arrays]
    for i, v in enumerate(values):
        if v.dtype.kind not in "biufc":
            raise TypeError(f"allreduce reduces numbers and booleans; item {i} has dtype {v.dtype}.")
        if v.dtype.kind == "c" and op in ("min", "max"):
            raise TypeError(f"op={op!r} is undefined for complex numbers (item {i}).")
    comm = _resolve(comm)
    with _deadline.begin(comm, "allreduce", timeout) as call:
        return _allreduce(values, op, call)


def _allreduce(values: list[np.ndarray], op: str, call: Any) -> list[Any]:
    _check_same((op, [(v.shape, v.dtype.str) for v in values]), "allreduce's shapes, dtypes and op", call)

    plans = [_wire(v.dtype, op) for v in values]
    groups: dict[np.dtype, list[int]] = {}
    for i, (wire, _) in enumerate(plans):
        groups.setdefault(wire, []).append(i)

    from mpi4py import MPI

    mpi_op = {"sum": MPI.SUM, "mean": MPI.SUM, "min": MPI.MIN, "max": MPI.MAX}[op]
    size = call.state.size
    out: list[Any] = [None] * len(values)
    # Iterating a dict keyed in first-appearance order gives every rank the same collective order,
    # because the shape/dtype check above has proven the inputs identical in layout.
    for wire, members in groups.items():
        total = sum(values[i].size for i in members)
        buf = _scratch(wire, total)
        offset = 0
        for i in members:
            n = values[i].size
            buf[offset : offset + n] = values[i].reshape(-1)
            offset += n
        if size > 1 and total:
            try:
                _allreduce_segmented(call, buf, mpi_op)
            except BaseException:
                # A timed-out or interrupted reduction may still write into this buffer later.
                _scratch_local.buffers.pop(wire, None)
                raise
        offset = 0
        for i in members:
            v, n = values[i], values[i].size
            result_dtype = plans[i][1]
            chunk = buf[offset : offset + n]
            if op == "mean":
                reduced = (chunk / size).astype(result_dtype, copy=False)
            else:
                reduced = chunk.astype(result_dtype, copy=True)
            reduced = reduced.reshape(v.shape)
            out[i] = reduced[()] if v.ndim == 0 else reduced
            offset += n
    return out


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
    comm = _resolve(comm)
    _check_root(root, comm)
    with _deadline.begin(comm, "bcast", timeout) as call:
        return _bcast(obj, root, call)


def _bcast(obj: Any, root: int, call: Any) -> Any:
    if call.state.size == 1:
        return obj
    is_root = call.state.rank == root
    header: tuple[Any, ...] | None = None
    if is_root:
        if isinstance(obj, np.ndarray) and obj.dtype.kind in "biufc":
            header = ("array", obj.shape, obj.dtype.str)
        else:
            try:
                header = ("pickle", pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
            except Exception as err:  # noqa: BLE001 - reported on every rank below
                header = ("error", f"bcast could not pickle {type(obj).__name__} on rank {root}: {err}")
    header = call.bcast(header, root)
    kind = header[0]
    if kind == "error":
        raise TypeError(header[1])
    if kind == "pickle":
        return obj if is_root else pickle.loads(header[1])
    _, shape, dtype = header
    buf = np.ascontiguousarray(obj) if is_root else np.empty(shape, dtype=dtype)
    call.bcast_buf(buf, root)
    return obj if is_root else buf


def gather_rows(local: Any, *, root: int | None = 0, comm: Any = None, timeout: Any = DEFAULT) -> np.ndarray | None:
    """Concatenate each rank's rows in rank order; ranks may hold different numbers of rows.

    Collective. Row counts and trailing shapes are exchanged first (one small allgather), so a
    rank whose rows have a different width or dtype makes every rank raise
    :class:`~mpinb.CollectiveMismatchError` instead of corrupting the result. The rows then move
    with one ``Gatherv`` (or ``Allgatherv``) using counts and displacements.

    Parameters
    ----------
    local : array_like
        This rank's rows (axis 0). A 1-D array is a column of scalars. Zero rows are allowed.
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
    """
    comm = _resolve(comm)
    if root is not None:
        _check_root(root, comm)
    arr = np.ascontiguousarray(np.asarray(local))
    if arr.ndim == 0:
        raise ValueError(f"gather_rows needs rows along axis 0; got a 0-d value {arr!r}.")
    with _deadline.begin(comm, "gather_rows", timeout) as call:
        return _gather_rows(arr, root, call)


def _gather_rows(arr: np.ndarray, root: int | None, call: Any) -> np.ndarray | None:
    meta = call.allgather((arr.shape[0], arr.shape[1:], arr.dtype.str))
    layouts = {(trailing, dtype) for _, trailing, dtype in meta}
    if len(layouts) > 1:
        raise CollectiveMismatchError(
            _layout_mismatch([(trailing, dtype) for _, trailing, dtype in meta])
        )
    if arr.dtype.kind not in "biufc":
        # Objects and strings have no fixed-size MPI type; small, so pickling is fine here.
        parts = call.allgather(arr) if root is None else call.gather(arr, root)
        return None if parts is None else np.concatenate(parts)
    row = int(np.prod(arr.shape[1:], dtype=np.int64))
    counts = np.array([n * row for n, _, _ in meta], dtype=np.int64)
    displs = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
    total_rows = sum(n for n, _, _ in meta)
    if root is None or call.state.rank == root:
        result = np.empty((total_rows, *arr.shape[1:]), dtype=arr.dtype)
        recv = [result.reshape(-1), (counts, displs)]
    else:
        result, recv = None, None
    if root is None:
        call.allgatherv(arr.reshape(-1), recv)
    else:
        call.gatherv(arr.reshape(-1), recv, root)
    return result


def on_root(fn: Callable[..., Any], *args: Any, comm: Any = None, timeout: Any = DEFAULT, **kwargs: Any) -> Any:
    """Call ``fn(*args, **kwargs)`` on rank 0 only and give its result (or exception) to every rank.

    Collective. Use it for root-only side effects whose outcome every rank must know: reading a
    config file, writing a checkpoint, drawing shared random numbers. If ``fn`` raises on root,
    the same exception type and message is raised on every rank. ``timeout`` (seconds, default
    :func:`mpinb.get_collective_timeout`, ``None`` waits forever) bounds the whole call, ``fn``'s
    run on root included; past it the waiting ranks raise :class:`~mpinb.CollectiveTimeout`.

    Returns
    -------
    object
        ``fn``'s return value on every rank (broadcast with :func:`bcast`).
    """
    comm = _resolve(comm)
    with _deadline.begin(comm, "on_root", timeout) as call:
        return _on_root(fn, args, kwargs, call)


def _on_root(fn: Callable[..., Any], args: Any, kwargs: Any, call: Any) -> Any:
    result: Any = None
    error: Exception | None = None
    if call.state.rank == 0:
        try:
            result = fn(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - re-raised on every rank below
            error = err
    if call.state.size == 1:
        if error is not None:
            raise error
        return result
    verdict = call.bcast(None if error is None else (type(error), str(error)), 0)
    if verdict is None:
        return _bcast(result, 0, call)
    if error is not None:
        raise error
    from mpinb.errors import _instantiate

    kind, message = verdict
    raised = _instantiate(kind, message)
    raised.add_note(f"raised on rank 0 by {getattr(fn, '__qualname__', repr(fn))} (mpinb.on_root)")
    raise raised


def rprint(
    *args: Any, comm: Any = None, root_only: bool = False, sep: str = " ", file: Any = None, timeout: Any = DEFAULT
) -> None:
    """Print from every rank in rank order, each line prefixed ``[rank r/n]``.

    Collective: the lines are gathered and printed by rank 0, so they come out in order even where
    each rank's stdout travels separately (ipyparallel, ``mpiexec``). With ``root_only=True`` only
    rank 0 prints and nothing is communicated. ``timeout`` as in :func:`allreduce`.
    """
    comm = _resolve(comm)
    rank, size = comm.Get_rank(), comm.Get_size()
    text = sep.join(map(str, args))
    stream = sys.stdout if file is None else file
    if root_only:
        if rank == 0:
            print(_prefix(text, 0, size), file=stream, flush=True)
        return
    with _deadline.begin(comm, "rprint", timeout) as call:
        texts = call.gather(text, 0)
    if rank == 0:
        print("\n".join(_prefix(t, r, size) for r, t in enumerate(texts)), file=stream, flush=True)


def limit_threads(n: int | None = None, *, comm: Any = None, timeout: Any = DEFAULT) -> int:
    """Set this rank's BLAS/OpenMP (and TensorFlow) thread budget so ranks do not oversubscribe cores.

    Collective: with ``n=None`` the ranks on each node share the cores their CPU affinity allows,
    ``max(1, cores // ranks_on_node)`` each (one small exchange on the node). Sets the variables
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
    if n is not None and (not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1):
        raise ValueError(f"n must be a positive integer number of threads; got {n!r}.")
    comm = _resolve(comm)
    if n is None:
        with _deadline.begin(comm, "limit_threads", timeout) as call:
            call.barrier()  # under a deadline: every rank is here before the blocking split
            n = _default_threads(comm)
    n = int(n)
    for var in _THREAD_VARS:
        os.environ[var] = str(n)
    os.environ["TF_NUM_INTRAOP_THREADS"] = str(n)
    os.environ["TF_NUM_INTEROP_THREADS"] = "1"
    from threadpoolctl import threadpool_limits

    # Keeping a reference is unnecessary: threadpool_limits applies at construction and the limits
    # persist until someone restores them.
    threadpool_limits(limits=n)
    _limit_tensorflow(n)
    return n


_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
                "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")
_scratch_local = threading.local()
_SEGMENT_BYTES = 4 << 20


def _node_comm(comm: Any) -> Any:
    from mpi4py import MPI

    return comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())


def _wire(dtype: np.dtype, op: str) -> tuple[np.dtype, np.dtype]:
    """(dtype reduced on the wire, dtype returned) for one input dtype and op."""
    if dtype.kind == "b":
        return (np.dtype(np.int64), np.dtype(np.int64)) if op in ("sum", "mean") else (np.dtype(np.uint8), dtype)
    if dtype == np.float16:
        # MPI has no half type; reducing in float32 is also more accurate.
        return np.dtype(np.float32), dtype
    if op == "mean" and dtype.kind in "iu":
        return np.dtype(np.int64) if dtype.kind == "i" else np.dtype(np.uint64), np.dtype(np.float64)
    return dtype.newbyteorder("="), dtype.newbyteorder("=")


def _allreduce_segmented(call: Any, buf: np.ndarray, op: Any) -> None:
    """One ``Allreduce`` for payloads up to 8 MiB; 4 MiB segments above.

    MPICH's shared-memory allreduce slows down once a message no longer fits in cache: on a 2-core
    machine one 64 MiB call took 40 ms where sixteen 4 MiB calls took 18 ms (and 4 MiB is where the
    per-call latency stops mattering). Every rank cuts the same buffer the same way, so the calls
    match across ranks.
    """
    step = max(1, _SEGMENT_BYTES // buf.itemsize)
    if buf.size <= 2 * step:
        call.allreduce(buf, op)
        return
    for start in range(0, buf.size, step):
        call.allreduce(buf[start : start + step], op)


def _scratch(dtype: np.dtype, n: int) -> np.ndarray:
    """A reusable per-thread buffer of at least n items; fresh multi-MB buffers per call cost more
    than the reduction itself."""
    cache = getattr(_scratch_local, "buffers", None)
    if cache is None:
        cache = _scratch_local.buffers = {}
    buf = cache.get(dtype)
    if buf is None or buf.size < n:
        buf = np.empty(max(n, 2 * buf.size if buf is not None else n), dtype=dtype)
        cache[dtype] = buf
    return buf[:n]


def _check_root(root: int, comm: Any) -> None:
    size = comm.Get_size()
    if not isinstance(root, (int, np.integer)) or isinstance(root, bool) or not 0 <= root < size:
        raise ValueError(f"root must be a rank between 0 and {size - 1}; got {root!r}.")


def _layout_mismatch(layouts: list[tuple[tuple[int, ...], str]]) -> str:
    groups: dict[tuple[Any, ...], list[int]] = {}
    for rank, layout in enumerate(layouts):
        groups.setdefault(layout, []).append(rank)
    listing = "; ".join(
        f"{'rank' if len(r) == 1 else 'ranks'} {', '.join(map(str, r))}: rows of shape {t} and dtype {np.dtype(d)}"
        for (t, d), r in groups.items()
    )
    return f"gather_rows needs rows of the same shape and dtype on every rank ({listing})."


def _prefix(text: str, rank: int, size: int) -> str:
    tag = f"[rank {rank}/{size}] "
    return "\n".join(tag + line for line in (text.splitlines() or [""]))


def _default_threads(comm: Any) -> int:
    node = _node_comm(comm)
    try:
        mine = _affinity()
        cores = set().union(*node.allgather(mine))
        local_size = node.Get_size()
    finally:
        node.Free()
    return max(1, min(len(mine), len(cores) // local_size))


def _affinity() -> frozenset[int]:
    try:
        return frozenset(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity API
        return frozenset(range(os.cpu_count() or 1))


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
