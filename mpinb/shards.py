"""Balanced, contiguous, deterministic partitioning of rows across ranks."""

from __future__ import annotations

from typing import Any

import numpy as np

from mpinb._checks import check_int, default_comm
from mpinb.agreement import check_same

__all__ = ["shard", "shard_bounds"]


def shard_bounds(n: int, *, rank: int, size: int) -> tuple[int, int]:
    """The ``[start, stop)`` rows that ``rank`` of ``size`` owns out of ``n``.

    Local. Shards are contiguous and balanced: the first ``n % size`` ranks get one extra row, so
    sizes differ by at most one and concatenating the shards in rank order gives back all ``n``
    rows. A rank may own zero rows when ``n < size``.

    Parameters
    ----------
    n : int
        Number of rows, ``n >= 0``.
    rank, size : int
        The rank (``0 <= rank < size``) and the number of ranks.

    Returns
    -------
    (int, int)
        ``start`` and ``stop``, usable as ``X[start:stop]``.

    Examples
    --------
    >>> [mpinb.shard_bounds(10, rank=r, size=4) for r in range(4)]
    [(0, 3), (3, 6), (6, 8), (8, 10)]
    """
    for name, value in (("n", n), ("rank", rank), ("size", size)):
        check_int(value, name)
    if n < 0:
        raise ValueError(f"n must be >= 0; got {n}.")
    if size < 1:
        raise ValueError(f"size must be >= 1; got {size}.")
    if not 0 <= rank < size:
        raise ValueError(f"rank must satisfy 0 <= rank < size={size}; got {rank}.")
    base, extra = divmod(int(n), int(size))
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def shard(*arrays: Any, comm: Any = None) -> Any:
    """This rank's contiguous slice of each array, cut along axis 0 by :func:`shard_bounds`.

    Collective: every rank passes the same full arrays (loaded or generated identically on each
    rank), and one small check makes every rank raise the same error if their lengths differ
    between ranks. Slices are views, not copies.

    Parameters
    ----------
    *arrays : array_like
        Arrays of equal length along axis 0.
    comm : mpi4py.MPI.Comm, optional
        Defaults to ``MPI.COMM_WORLD``.

    Returns
    -------
    numpy.ndarray or tuple of numpy.ndarray
        One slice per input, as a tuple when more than one array is given.

    Examples
    --------
    >>> X_local, y_local = mpinb.shard(X, y)
    """
    if not arrays:
        raise TypeError("shard() needs at least one array.")
    values = [np.asarray(a) if not hasattr(a, "shape") else a for a in arrays]
    for i, v in enumerate(values):
        if len(v.shape) == 0:
            raise ValueError(f"shard() cuts along axis 0, but array {i} is 0-d.")
    lengths = [int(v.shape[0]) for v in values]
    if len(set(lengths)) > 1:
        raise ValueError(f"shard() needs arrays of equal length along axis 0; got lengths {lengths}.")
    comm = default_comm(comm)
    check_same(lengths[0], "the length of the arrays passed to shard()", comm=comm)
    start, stop = shard_bounds(lengths[0], rank=comm.Get_rank(), size=comm.Get_size())
    pieces = tuple(v[start:stop] for v in values)
    return pieces[0] if len(pieces) == 1 else pieces
