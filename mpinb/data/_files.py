"""Data kept in many files, sharded by whole files: a contiguous run of the sorted list per rank,
and ``tf.data`` pipelines sharded by element."""

from __future__ import annotations

import glob
import os
import stat
import sys
from collections.abc import Iterable
from typing import Any

from mpinb._checks import default_comm
from mpinb.agreement import check_same, raise_together
from mpinb.shards import shard_bounds

__all__ = ["shard_dataset", "shard_files"]


def shard_files(
    files: str | os.PathLike[str] | Iterable[str | os.PathLike[str]], *, comm: Any = None
) -> list[str]:
    """This rank's share of a list of files: a contiguous, balanced run of the sorted list.

    Collective: every rank of ``comm`` calls it, and every rank must see the same files. ``files``
    is a glob pattern (expanded with :func:`glob.glob`, ``recursive=True`` so ``**`` descends into
    directories) or a list of paths; either way the paths are sorted, and the sorted list must be
    identical on every rank, or every rank raises :class:`mpinb.CollectiveMismatchError` showing
    where the lists differ (node-local copies are fine as long as the names agree). Rank ``r`` gets
    ``sorted_files[start:stop]`` with ``(start, stop) = mpinb.shard_bounds(len(files), rank=r,
    size=size)``, so the ranks' lists concatenated in rank order are the sorted list, each file read
    by exactly one rank. Unlike most collectives, the result differs from rank to rank. Each rank
    then checks that its own files exist and are readable; a missing file makes every rank raise
    the same error naming the file and the rank that owns it.

    Every rank must get at least one file: data-parallel training runs the same number of steps
    on every rank (the fewest any rank can run), so a rank without files would stop everyone's
    training at zero steps. Fewer files than ranks is therefore an error, on every rank, raised
    before any file is checked. File counts differ by at most one between ranks; with files of equal size, a
    multiple of the number of ranks wastes nothing. For one big array, shard rows instead with
    :func:`load_npy` (a memory-mapped ``.npy`` file, each rank reading its rows), or
    :func:`mpinb.shard` for arrays already in memory.

    Parameters
    ----------
    files : str, os.PathLike or iterable of str or os.PathLike
        A glob pattern such as ``"/scratch/train/part-*.tfrecord"``, or the paths themselves. Paths
        are sorted as strings, so number them with zero padding (``part-00002`` before
        ``part-00010``). Relative paths and patterns are taken relative to each rank's working
        directory. A path listed twice is an error.
    comm : mpi4py.MPI.Comm, optional
        Defaults to ``MPI.COMM_WORLD``.

    Returns
    -------
    list of str
        This rank's paths, in sorted order, never empty.

    Raises
    ------
    TypeError
        On every rank, when ``files`` is not a pattern or an iterable of paths.
    ValueError
        On every rank, when the pattern matches nothing, the list is empty or names a file twice,
        or there are fewer files than ranks.
    mpinb.CollectiveMismatchError
        When the sorted lists differ between ranks.
    FileNotFoundError, IsADirectoryError, PermissionError, OSError
        On every rank, when some rank cannot read one of its files.

    Examples
    --------
    With ``tf.data`` (TFRecord files): each rank opens only its own files.

    >>> files = mpinb.data.shard_files("/scratch/train/part-*.tfrecord")
    >>> ds = tf.data.TFRecordDataset(files).map(parse).shuffle(10_000).batch(64)

    With ``.npz`` parts and a generator of this rank's batches:

    >>> def batches(files=mpinb.data.shard_files("/scratch/train/*.npz")):
    ...     for path in files:
    ...         with np.load(path) as part:
    ...             for i in range(0, len(part["y"]), 64):
    ...                 yield part["X"][i : i + 64], part["y"][i : i + 64]
    """
    comm = default_comm(comm)
    paths: list[str] = []
    # Expansion and listing can fail on some ranks only (a node-local directory, a list built
    # from os.listdir): decided together, so no rank is left waiting in check_same.
    with raise_together(comm=comm):
        paths = _expand_files(files)
    check_same(paths, "the sorted list of files passed to shard_files", comm=comm)
    size = comm.Get_size()
    # The list is the same everywhere now, so this check fails identically on every rank.
    if len(paths) < size:
        raise ValueError(
            f"shard_files needs at least as many files as ranks, so that every rank reads data and "
            f"all run the same number of training steps; got {len(paths)} "
            f"file{'' if len(paths) == 1 else 's'} for {size} ranks. Write the data as at least "
            f"{size} files (a multiple of {size} balances them), or shard rows instead with "
            "mpinb.data.load_npy, mpinb.shard or mpinb.data.shard_dataset."
        )
    mine = _files_for(paths, comm.Get_rank(), size)
    with raise_together(comm=comm):
        _check_readable(mine)
    return mine


def shard_dataset(dataset: Any, *, comm: Any = None) -> Any:
    """This rank's shard of a ``tf.data.Dataset``: every ``size``-th element, from this rank on.

    Local: nothing is communicated; ``comm`` only says which rank this is and how many there are.
    It returns ``dataset.shard(num_shards=size, index=rank)``: element ``i`` goes to rank
    ``i % size``, so the shards are disjoint, their union is the dataset, and their sizes differ by
    at most one element. With one rank the dataset is returned unchanged. Every rank must build
    the same pipeline, with the same element order, for the shards to fit together.

    Shard *first*, right after the source and before ``shuffle``, ``repeat``, ``batch`` and random
    augmentation: sharding a shuffled dataset with a different shuffle on each rank would repeat
    some elements and drop others, and sharding batches deals out whole batches. ``shard`` still
    makes every rank read the whole source and discard ``(size - 1) / size`` of it; for data in
    files, give each rank its own files instead, ``tf.data.TFRecordDataset(shard_files(pattern))``,
    and each rank reads only those. For one ``.npy`` array, :func:`load_npy` reads just this rank's
    rows (and :func:`mpinb.shard` slices arrays already in memory).

    Parameters
    ----------
    dataset : tf.data.Dataset
        The unsharded pipeline, identical on every rank.
    comm : mpi4py.MPI.Comm, optional
        Defaults to ``MPI.COMM_WORLD``.

    Returns
    -------
    tf.data.Dataset
        This rank's elements, in the dataset's order.

    Raises
    ------
    TypeError
        When ``dataset`` is not a ``tf.data.Dataset``.
    ValueError
        When the dataset has a known number of elements smaller than the number of ranks, so some
        rank would get none.

    Examples
    --------
    >>> ds = tf.data.Dataset.from_tensor_slices((X, y))          # the same X, y on every rank
    >>> ds = mpinb.data.shard_dataset(ds).shuffle(10_000).batch(64)  # shard, then shuffle and batch
    """
    # A tf.data.Dataset can only exist once TensorFlow is imported, so a wrong argument is rejected
    # without paying TensorFlow's import.
    tf = sys.modules.get("tensorflow")
    if tf is None or not isinstance(dataset, tf.data.Dataset):
        kind = type(dataset)
        name = kind.__qualname__
        if kind.__module__ != "builtins":
            name = f"{kind.__module__}.{name}"
        raise TypeError(
            f"shard_dataset needs a tf.data.Dataset; got {name}. For NumPy arrays use mpinb.shard; a "
            "keras.utils.PyDataset or a generator should read only this rank's files "
            "(mpinb.data.shard_files) or rows (mpinb.data.load_npy)."
        )
    comm = default_comm(comm)
    rank, size = comm.Get_rank(), comm.Get_size()
    n = int(dataset.cardinality())
    if 0 <= n < size:
        raise ValueError(
            f"shard_dataset needs at least one element per rank; the dataset has {n} "
            f"element{'' if n == 1 else 's'} for {size} ranks. If it is batched, shard before batch()."
        )
    if size == 1:
        return dataset
    return dataset.shard(num_shards=size, index=rank)


def _expand_files(files: Any) -> list[str]:
    """The sorted paths of a glob pattern or an iterable of paths, checked for emptiness and repeats."""
    if isinstance(files, (str, os.PathLike)):
        pattern = os.fspath(files)
        if not isinstance(pattern, str):
            raise TypeError(f"shard_files needs str paths or patterns; got {pattern!r}.")
        paths = sorted(glob.glob(pattern, recursive=True))
        if not paths:
            where = "" if os.path.isabs(pattern) else f" (relative to {os.getcwd()!r})"
            raise ValueError(
                f"shard_files found no files matching {pattern!r}{where}; check the pattern, "
                "and that every rank sees the directory."
            )
        return paths
    if isinstance(files, bytes) or not isinstance(files, Iterable):
        raise TypeError(
            "shard_files needs a glob pattern (str or os.PathLike) or an iterable of paths; "
            f"got {type(files).__name__}."
        )
    paths = []
    for i, item in enumerate(files):
        path = os.fspath(item) if isinstance(item, (str, os.PathLike)) else None
        if not isinstance(path, str):
            raise TypeError(f"shard_files needs str or os.PathLike paths; item {i} is {item!r}.")
        paths.append(path)
    if not paths:
        raise ValueError("shard_files needs at least one file; got an empty list.")
    paths.sort()
    repeated = sorted({a for a, b in zip(paths, paths[1:], strict=False) if a == b})
    if repeated:
        raise ValueError(
            f"shard_files needs each file once, or its data would be read twice; "
            f"{_some_paths(repeated)} {'is' if len(repeated) == 1 else 'are'} listed more than once."
        )
    return paths


def _files_for(paths: list[str], rank: int, size: int) -> list[str]:
    start, stop = shard_bounds(len(paths), rank=rank, size=size)
    return paths[start:stop]


def _check_readable(paths: list[str]) -> None:
    """Raise if any of ``paths`` is missing, not a regular file or unreadable (the first one's kind)."""
    problems: list[tuple[str, type[OSError], str]] = []
    for path in paths:
        try:
            mode = os.stat(path).st_mode
        except OSError as err:
            problems.append((path, type(err), err.strerror or str(err)))
            continue
        if stat.S_ISDIR(mode):
            problems.append((path, IsADirectoryError, "is a directory"))
        elif not stat.S_ISREG(mode):
            problems.append((path, OSError, "is not a regular file"))
        elif not os.access(path, os.R_OK):
            problems.append((path, PermissionError, "permission denied"))
    if problems:
        shown = ", ".join(f"{p!r} ({why})" for p, _, why in problems[:3])
        more = f" and {len(problems) - 3} more" if len(problems) > 3 else ""
        raise problems[0][1](
            f"shard_files cannot read {len(problems)} of this rank's {len(paths)} files: {shown}{more}."
        )


def _some_paths(paths: list[str], limit: int = 3) -> str:
    shown = ", ".join(repr(p) for p in paths[:limit])
    return shown + (f" and {len(paths) - limit} more" if len(paths) > limit else "")
