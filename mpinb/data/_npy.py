"""Row shards of one ``.npy`` file: each rank memory-maps it and copies only its own rows."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from mpinb._checks import check_int, default_comm
from mpinb.agreement import check_same, raise_together
from mpinb.shards import shard_bounds

__all__ = ["load_npy"]


def load_npy(path: str | os.PathLike[str], *, ndim: int | None = None, comm: Any = None) -> np.ndarray:
    """This rank's rows of a ``.npy`` file, read through a memory map.

    Collective: every rank of ``comm`` calls it with the same path (on a shared filesystem, or a
    copy of the same file on each node). The file is memory-mapped and each rank copies only its
    :func:`~mpinb.shard_bounds` slice of rows, so memory per rank is its shard, never the whole
    file, and the map is closed before returning. If the file is missing, unreadable, not a
    ``.npy`` file, truncated, 0-d, of the wrong number of dimensions, or differs in shape or dtype
    between ranks, every rank raises the same error, naming the ranks that failed. This is row
    sharding of one file; for data written as many files, :func:`shard_files` gives each rank whole
    files instead.

    Parameters
    ----------
    path : str or os.PathLike
        The ``.npy`` file, as written by :func:`numpy.save`.
    ndim : int, optional
        Require this many dimensions (``ndim=2`` for a feature matrix ``X``, ``1`` for labels).
    comm : mpi4py.MPI.Comm, optional
        Defaults to ``MPI.COMM_WORLD``.

    Returns
    -------
    numpy.ndarray
        Rows ``start:stop`` of the array, C-contiguous, owned by this rank (not a view of the file).

    Raises
    ------
    FileNotFoundError, PermissionError, IsADirectoryError, OSError
        On every rank, when some rank cannot open the file.
    ValueError
        On every rank, when the file is not a valid ``.npy`` array with rows (or not ``ndim``-D).
    mpinb.CollectiveMismatchError
        When the ranks see files of different shapes or dtypes.

    Examples
    --------
    >>> X_local = mpinb.data.load_npy("/scratch/features.npy", ndim=2)
    >>> y_local = mpinb.data.load_npy("/scratch/labels.npy", ndim=1)
    """
    if ndim is not None:
        ndim = check_int(ndim, "ndim", minimum=1)
    comm = default_comm(comm)
    with raise_together(comm=comm):
        shape, dtype, fortran, offset = _npy_header(path, ndim)
    check_same((shape, dtype.str, fortran), f"the shape, dtype and order of {os.fspath(path)!r}", comm=comm)
    start, stop = shard_bounds(shape[0], rank=comm.Get_rank(), size=comm.Get_size())
    local: np.ndarray | None = None
    with raise_together(comm=comm):
        local = _read_rows(path, shape, dtype, fortran, offset, start, stop)
    return local


def _npy_header(path: Any, ndim: int | None) -> tuple[tuple[int, ...], np.dtype, bool, int]:
    """Read and validate a ``.npy`` header: (shape, dtype, fortran_order, data offset)."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise TypeError(f"load_npy needs a path (str or os.PathLike); got {type(path).__name__}.")
    shown = os.fspath(path)
    fmt = np.lib.format
    # open() raises FileNotFoundError/PermissionError/IsADirectoryError with the path in the text.
    with open(path, "rb") as f:
        try:
            version = fmt.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = fmt.read_array_header_1_0(f)
            else:
                shape, fortran, dtype = fmt.read_array_header_2_0(f)
        except ValueError as err:
            raise ValueError(f"{shown!r} is not a valid .npy file ({err}); write it with numpy.save.") from None
        offset = f.tell()
        size = os.fstat(f.fileno()).st_size
    if dtype.hasobject:
        raise ValueError(
            f"{shown!r} holds Python objects (dtype {dtype}), which cannot be memory-mapped; "
            "save a numeric array instead."
        )
    if len(shape) == 0:
        raise ValueError(f"{shown!r} holds a 0-d array (a scalar), which has no rows to shard.")
    if ndim is not None and len(shape) != ndim:
        raise ValueError(f"{shown!r} must hold a {ndim}-D array; got shape {shape}.")
    need = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if size < need:
        raise ValueError(
            f"{shown!r} is truncated: its header promises {need:,} bytes but the file has {size:,}."
        )
    return tuple(int(s) for s in shape), dtype, bool(fortran), offset


def _read_rows(
    path: Any, shape: tuple[int, ...], dtype: np.dtype, fortran: bool, offset: int, start: int, stop: int
) -> np.ndarray:
    if stop == start or int(np.prod(shape, dtype=np.int64)) == 0:
        # numpy refuses to map zero bytes.
        return np.empty((stop - start, *shape[1:]), dtype=dtype)
    mm = np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape, order="F" if fortran else "C")
    # A copy, in C order: once ``mm`` goes out of scope nothing references the map and it closes.
    return np.array(mm[start:stop], order="C", copy=True)
