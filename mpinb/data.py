"""Data on the ranks: bundled datasets, synthetic data generated per shard, ``.npy`` shard loading,
and file sharding for training from many files.

Each rank reads or generates only its own rows, so bulk data never passes through the notebook
client and memory per rank is proportional to its shard. Shards follow :func:`mpinb.shard_bounds`:
contiguous and balanced, so gathering them in rank order (``mpinb.gather_rows``) gives back exactly
the data set one process would have loaded, whatever the number of ranks. Data kept in many files
(TFRecord, ``.npz`` parts) is sharded by whole files instead: :func:`shard_files` gives each rank a
contiguous run of the sorted file list, and :func:`shard_dataset` shards a ``tf.data`` pipeline.
"""

from __future__ import annotations

import glob
import os
import stat
import sys
from collections.abc import Iterable
from typing import Any, NamedTuple

import numpy as np

from mpinb import _collective
from mpinb._digest import digest
from mpinb.errors import _check_int, _is_int, _resolve, check_same, raise_together
from mpinb.shards import shard_bounds

__all__ = [
    "Split",
    "load_breast_cancer",
    "load_digits",
    "load_iris",
    "load_npy",
    "load_wine",
    "make_blobs",
    "make_classification",
    "shard_dataset",
    "shard_files",
]

# Synthetic rows are drawn in blocks of this many rows, block b from its own stream seeded by
# (random_state, b). It is part of the data's definition: changing it changes every data set, but
# no choice of it makes the data depend on the number of ranks. A rank holds one block's draws at a
# time, which bounds its overhead independently of n_samples.
_BLOCK_ROWS = 1024
# spawn_key prefixes that keep the streams of shared draws (centres) and per-block draws apart.
_KEY_SHARED = 0
_KEY_BLOCK = 1


class Split(NamedTuple):
    """A train/test split, unpacked like scikit-learn's ``train_test_split``.

    ``X_train, X_test, y_train, y_test = mpinb.data.load_digits()``. With ``shard=True`` each field
    holds this rank's rows only.
    """

    X_train: np.ndarray
    X_test: np.ndarray
    y_train: np.ndarray
    y_test: np.ndarray


# --------------------------------------------------------------------------------------------------
# Bundled scikit-learn datasets


def load_digits(
    *, shard: bool = True, test_size: float | int = 0.25, random_state: int | None = 0, comm: Any = None
) -> Split:
    """The 8×8 handwritten digits (1,797 samples, 64 features, 10 classes), split and sharded.

    Collective when ``shard=True``: every rank of ``comm`` calls it with the same arguments. Each
    rank reads the file that ships with scikit-learn (no network), makes the same stratified split
    as ``train_test_split(X, y, test_size=test_size, random_state=random_state, stratify=y)``, and
    keeps its :func:`~mpinb.shard_bounds` slice of the training and of the test set. A rank that
    cannot load the data, or whose data differ from the others' (different scikit-learn versions
    across nodes), makes every rank raise the same error. With ``shard=False`` it is local: nothing
    is communicated and the whole split is returned, so it is safe in the notebook client too.

    Parameters
    ----------
    shard : bool, default True
        Keep only this rank's rows of each part; ``False`` returns all rows.
    test_size : float or int, default 0.25
        Fraction (``0 < test_size < 1``) or number of samples held out for testing, as in
        scikit-learn.
    random_state : int or None, default 0
        Seed of the split. ``None`` draws a fresh seed on rank 0 and broadcasts it, so the ranks
        still agree.
    comm : mpi4py.MPI.Comm, optional
        Defaults to ``MPI.COMM_WORLD``; unused when ``shard=False``.

    Returns
    -------
    Split
        ``(X_train, X_test, y_train, y_test)``: float64 features of shape ``(n, 64)`` with pixel
        values 0–16, int64 labels 0–9.

    Examples
    --------
    >>> X_train, X_test, y_train, y_test = mpinb.data.load_digits()   # this rank's rows
    >>> km = mpinb.KMeans(n_clusters=10).fit(X_train)
    """
    return _bundled("load_digits", shard, test_size, random_state, comm)


def load_iris(
    *, shard: bool = True, test_size: float | int = 0.25, random_state: int | None = 0, comm: Any = None
) -> Split:
    """The iris flowers (150 samples, 4 features, 3 classes), split and sharded.

    Collective when ``shard=True``; local with ``shard=False``. See :func:`load_digits` for the
    split, the sharding and the parameters.

    Returns
    -------
    Split
        ``(X_train, X_test, y_train, y_test)``; float64 features, int64 labels 0–2.
    """
    return _bundled("load_iris", shard, test_size, random_state, comm)


def load_wine(
    *, shard: bool = True, test_size: float | int = 0.25, random_state: int | None = 0, comm: Any = None
) -> Split:
    """The wine recognition data (178 samples, 13 features, 3 classes), split and sharded.

    Collective when ``shard=True``; local with ``shard=False``. See :func:`load_digits` for the
    split, the sharding and the parameters.

    Returns
    -------
    Split
        ``(X_train, X_test, y_train, y_test)``; float64 features, int64 labels 0–2.
    """
    return _bundled("load_wine", shard, test_size, random_state, comm)


def load_breast_cancer(
    *, shard: bool = True, test_size: float | int = 0.25, random_state: int | None = 0, comm: Any = None
) -> Split:
    """The Wisconsin breast cancer data (569 samples, 30 features, 2 classes), split and sharded.

    Collective when ``shard=True``; local with ``shard=False``. See :func:`load_digits` for the
    split, the sharding and the parameters.

    Returns
    -------
    Split
        ``(X_train, X_test, y_train, y_test)``; float64 features, int64 labels 0–1.
    """
    return _bundled("load_breast_cancer", shard, test_size, random_state, comm)


# --------------------------------------------------------------------------------------------------
# Synthetic data, generated per shard


def make_blobs(
    n_samples: int,
    n_features: int = 2,
    centers: int | Any = 3,
    *,
    cluster_std: float | Any = 1.0,
    center_box: tuple[float, float] = (-10.0, 10.0),
    random_state: int | None = 0,
    dtype: Any = np.float64,
    shard: bool = True,
    comm: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Isotropic Gaussian blobs for clustering, generating only this rank's rows.

    Collective when ``shard=True``: every rank of ``comm`` calls it with the same arguments and
    generates rows ``shard_bounds(n_samples, rank, size)`` of one global data set. Rows are drawn
    in fixed blocks of 1,024, each from its own stream seeded by ``(random_state, block)``, so the
    data are byte-identical whatever the number of ranks (and the first rows do not change when
    ``n_samples`` grows), and a rank's memory is its shard plus one block. The centres are drawn from the seed alone, identically on every rank. With
    ``shard=False`` it is local and returns all rows.

    Each row picks its cluster uniformly at random (so clusters hold about ``n_samples / k`` rows
    each and the rows come shuffled) and adds ``N(0, cluster_std²)`` noise to that cluster's
    centre. The distribution matches :func:`sklearn.datasets.make_blobs`; the numbers differ.

    Parameters
    ----------
    n_samples : int
        Total number of rows across all ranks.
    n_features : int, default 2
        Columns; ignored when ``centers`` is an array (its width is used).
    centers : int or array_like of shape (k, n_features), default 3
        The number of clusters, whose centres are drawn uniformly in ``center_box``, or the centres.
    cluster_std : float or array_like of shape (k,), default 1.0
        Standard deviation of each cluster.
    center_box : (float, float), default (-10.0, 10.0)
        Bounds of the random centres.
    random_state : int or None, default 0
        Seed. ``None`` draws a fresh seed on rank 0 and broadcasts it.
    dtype : dtype, default float64
        Dtype of ``X`` (``float32`` for Keras); the draws are made in float64 and then cast.
    shard : bool, default True
        Generate only this rank's rows; ``False`` generates all of them.
    comm : mpi4py.MPI.Comm, optional
        Defaults to ``MPI.COMM_WORLD``; unused when ``shard=False``.

    Returns
    -------
    X : numpy.ndarray of shape (n_local, n_features)
    y : numpy.ndarray of shape (n_local,), int64
        The cluster of each row.

    Examples
    --------
    >>> X_local, y_local = mpinb.data.make_blobs(1_000_000, n_features=2, centers=5)
    >>> km = mpinb.KMeans(n_clusters=5).fit(X_local)
    """
    n_samples = _check_int(n_samples, "n_samples", minimum=0)
    if _is_int(centers):
        k = _check_int(centers, "centers", minimum=1)
        n_features = _check_int(n_features, "n_features", minimum=1)
        given_centers = None
    else:
        given_centers = np.array(centers, dtype=np.float64)
        if given_centers.ndim != 2 or given_centers.shape[0] < 1 or given_centers.shape[1] < 1:
            raise ValueError(
                "centers must be a number of clusters or an array of shape (n_clusters, n_features); "
                f"got an array of shape {given_centers.shape}."
            )
        if not np.isfinite(given_centers).all():
            raise ValueError("centers must be finite; got NaN or infinity.")
        k, n_features = given_centers.shape
    std = np.array(cluster_std, dtype=np.float64)
    if std.ndim == 0:
        std = np.full(k, float(std))
    if std.shape != (k,) or not np.isfinite(std).all() or (std < 0).any():
        raise ValueError(
            f"cluster_std must be a non-negative number or one per cluster (shape ({k},)); got {cluster_std!r}."
        )
    low, high = (float(v) for v in center_box)
    if not low <= high:
        raise ValueError(f"center_box must be (low, high) with low <= high; got {center_box!r}.")
    out_dtype = _float_dtype(dtype)
    seed = _seed(random_state, shard, comm)
    if given_centers is None:
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(_KEY_SHARED,)))
        centres = rng.uniform(low, high, size=(k, n_features))
    else:
        centres = given_centers

    def block(rng: np.random.Generator, rows: int) -> tuple[np.ndarray, np.ndarray]:
        labels = rng.integers(k, size=rows)
        noise = rng.standard_normal((rows, n_features))
        noise *= std[labels, None]
        noise += centres[labels]
        return noise, labels

    return _generate(block, n_samples, n_features, out_dtype, seed, shard, comm)


def make_classification(
    n_samples: int,
    n_features: int = 20,
    n_classes: int = 2,
    *,
    n_informative: int = 2,
    class_sep: float = 1.0,
    flip_y: float = 0.0,
    random_state: int | None = 0,
    dtype: Any = np.float32,
    shard: bool = True,
    comm: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """A Gaussian classification problem for Keras demos, generating only this rank's rows.

    Collective when ``shard=True``: every rank of ``comm`` calls it with the same arguments and
    generates rows ``shard_bounds(n_samples, rank, size)`` of one global data set, drawn in seeded
    blocks exactly as in :func:`make_blobs` (byte-identical whatever the number of ranks; memory per
    rank ∝ its shard). With ``shard=False`` it is local and returns all rows.

    The model, simpler than :func:`sklearn.datasets.make_classification`: each row's class is
    uniform over ``n_classes``; the first ``n_informative`` features are the class mean plus
    ``N(0, 1)`` noise, the class means being distinct vertices of the hypercube
    ``[-class_sep, class_sep]^n_informative`` chosen from the seed; the other features are pure
    ``N(0, 1)`` noise. A fraction ``flip_y`` of the labels is then replaced by a uniformly random
    class. With the defaults (two classes, two informative features) the best possible accuracy is
    84–92 % depending on the seed, so training curves have something to show.

    Parameters
    ----------
    n_samples : int
        Total number of rows across all ranks.
    n_features : int, default 20
        Columns of ``X``.
    n_classes : int, default 2
        Number of classes; labels are ``0 .. n_classes - 1``.
    n_informative : int, default 2
        How many leading features carry the class signal; ``1 <= n_informative <= n_features``
        and ``n_classes <= 2**n_informative``.
    class_sep : float, default 1.0
        Half the side of the hypercube whose vertices are the class means; larger separates the
        classes more.
    flip_y : float, default 0.0
        Fraction of rows whose label is replaced at random (label noise), ``0 <= flip_y <= 1``.
    random_state : int or None, default 0
        Seed. ``None`` draws a fresh seed on rank 0 and broadcasts it.
    dtype : dtype, default float32
        Dtype of ``X``; float32 is what Keras computes in.
    shard : bool, default True
        Generate only this rank's rows; ``False`` generates all of them.
    comm : mpi4py.MPI.Comm, optional
        Defaults to ``MPI.COMM_WORLD``; unused when ``shard=False``.

    Returns
    -------
    X : numpy.ndarray of shape (n_local, n_features)
    y : numpy.ndarray of shape (n_local,), int64

    Examples
    --------
    >>> X_local, y_local = mpinb.data.make_classification(100_000, n_features=20)
    >>> model.fit(X_local, y_local, epochs=5)   # with mpinb.keras's distributed optimizer
    """
    n_samples = _check_int(n_samples, "n_samples", minimum=0)
    n_features = _check_int(n_features, "n_features", minimum=1)
    n_classes = _check_int(n_classes, "n_classes", minimum=2)
    n_informative = _check_int(n_informative, "n_informative", minimum=1)
    if n_informative > n_features:
        raise ValueError(
            f"n_informative must be <= n_features ({n_features}); got {n_informative}. "
            "Raise n_features or lower n_informative."
        )
    if n_informative < 63 and n_classes > 1 << n_informative:
        raise ValueError(
            f"n_classes ({n_classes}) must be <= 2**n_informative ({1 << n_informative}), so each class "
            "gets its own hypercube vertex; raise n_informative."
        )
    class_sep = float(class_sep)
    if not (np.isfinite(class_sep) and class_sep >= 0):
        raise ValueError(f"class_sep must be a finite number >= 0; got {class_sep!r}.")
    flip_y = float(flip_y)
    if not 0.0 <= flip_y <= 1.0:
        raise ValueError(f"flip_y must be between 0 and 1; got {flip_y!r}.")
    out_dtype = _float_dtype(dtype)
    seed = _seed(random_state, shard, comm)
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(_KEY_SHARED,)))
    means = class_sep * _vertices(rng, n_classes, n_informative)

    def block(rng: np.random.Generator, rows: int) -> tuple[np.ndarray, np.ndarray]:
        labels = rng.integers(n_classes, size=rows)
        x = rng.standard_normal((rows, n_features))
        x[:, :n_informative] += means[labels]
        if flip_y > 0:
            flip = rng.random(rows) < flip_y
            labels[flip] = rng.integers(n_classes, size=int(flip.sum()))
        return x, labels

    return _generate(block, n_samples, n_features, out_dtype, seed, shard, comm)


# --------------------------------------------------------------------------------------------------
# .npy files


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
        ndim = _check_int(ndim, "ndim", minimum=1)
    comm = _resolve(comm)
    with raise_together(comm=comm):
        shape, dtype, fortran, offset = _npy_header(path, ndim)
    check_same((shape, dtype.str, fortran), f"the shape, dtype and order of {os.fspath(path)!r}", comm=comm)
    start, stop = shard_bounds(shape[0], rank=comm.Get_rank(), size=comm.Get_size())
    local: np.ndarray | None = None
    with raise_together(comm=comm):
        local = _read_rows(path, shape, dtype, fortran, offset, start, stop)
    return local


# --------------------------------------------------------------------------------------------------
# Many files: whole files per rank


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
    comm = _resolve(comm)
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
    comm = _resolve(comm)
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


# --------------------------------------------------------------------------------------------------
# Private workers


def _bundled(name: str, shard: bool, test_size: float | int, random_state: int | None, comm: Any) -> Split:
    _check_test_size(test_size)
    if random_state is not None and _check_int(random_state, "random_state", minimum=0) >= 1 << 32:
        raise ValueError(f"random_state must be < 2**32 (scikit-learn's limit); got {random_state}.")
    if not shard:
        return Split(*_load_and_split(name, test_size, random_state))
    comm = _resolve(comm)
    seed = _seed(random_state, True, comm)
    parts: tuple[np.ndarray, ...] = ()
    with raise_together(comm=comm):
        parts = _load_and_split(name, test_size, seed)
    if comm.Get_size() > 1:
        # The split is made independently on each rank; a different scikit-learn on another node
        # could ship different data or split differently, which would silently duplicate rows.
        check_same(digest(*parts), f"the {name} data and split (check scikit-learn versions)", comm=comm)
    rank, size = comm.Get_rank(), comm.Get_size()
    out = []
    for part in parts:
        start, stop = shard_bounds(len(part), rank=rank, size=size)
        out.append(part[start:stop].copy())
    return Split(*out)


def _load_and_split(name: str, test_size: float | int, seed: int | None) -> tuple[np.ndarray, ...]:
    import sklearn.datasets
    from sklearn.model_selection import train_test_split

    bunch = getattr(sklearn.datasets, name)()
    X = np.ascontiguousarray(bunch.data, dtype=np.float64)
    y = np.ascontiguousarray(bunch.target, dtype=np.int64)
    X_train, X_test, y_train, y_test = train_test_split(
        X, y, test_size=test_size, random_state=seed, stratify=y
    )
    return tuple(np.ascontiguousarray(a) for a in (X_train, X_test, y_train, y_test))


def _check_test_size(test_size: Any) -> None:
    if isinstance(test_size, bool):
        ok = False
    elif _is_int(test_size):
        ok = test_size >= 1
    elif isinstance(test_size, (float, np.floating)):
        ok = 0.0 < test_size < 1.0
    else:
        ok = False
    if not ok:
        raise ValueError(
            "test_size must be a fraction between 0 and 1 (exclusive) or a number of samples >= 1; "
            f"got {test_size!r}."
        )


def _generate(
    block: Any, n_samples: int, n_features: int, dtype: np.dtype, seed: int, shard: bool, comm: Any
) -> tuple[np.ndarray, np.ndarray]:
    """Fill this rank's rows from the global blocks that overlap them."""
    if shard:
        comm = _resolve(comm)
        start, stop = shard_bounds(n_samples, rank=comm.Get_rank(), size=comm.Get_size())
    else:
        start, stop = 0, n_samples
    X = np.empty((stop - start, n_features), dtype=dtype)
    y = np.empty(stop - start, dtype=np.int64)
    if stop == start:
        return X, y
    for b in range(start // _BLOCK_ROWS, (stop - 1) // _BLOCK_ROWS + 1):
        lo = b * _BLOCK_ROWS
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(_KEY_BLOCK, b)))
        # The whole block is always drawn, even when this rank keeps part of it or it runs past
        # n_samples, so each row's values depend neither on where the shard boundaries fall nor
        # on n_samples (more rows extend a data set; its first rows stay the same).
        xb, yb = block(rng, _BLOCK_ROWS)
        keep_lo, keep_hi = max(lo, start), min(lo + _BLOCK_ROWS, stop)
        X[keep_lo - start : keep_hi - start] = xb[keep_lo - lo : keep_hi - lo]
        y[keep_lo - start : keep_hi - start] = yb[keep_lo - lo : keep_hi - lo]
    return X, y


def _seed(random_state: Any, shard: bool, comm: Any) -> int:
    """An int seed every rank agrees on; ``None`` is drawn on rank 0 and broadcast."""
    if random_state is not None:
        return _check_int(random_state, "random_state", minimum=0)
    # 32 bits: scikit-learn accepts seeds below 2**32 only.
    fresh = int(np.random.SeedSequence().entropy) % (1 << 32)
    if not shard:
        return fresh
    comm = _resolve(comm)
    if comm.Get_size() == 1:
        return fresh
    return int(_collective.bcast(fresh, comm=comm, name="a shared random seed"))


def _vertices(rng: np.random.Generator, k: int, dim: int) -> np.ndarray:
    """``k`` distinct vertices of the cube ``[-1, 1]^dim``, as float64 rows."""
    if dim <= 30:
        codes = rng.choice(1 << dim, size=k, replace=False)
        bits = (codes[:, None] >> np.arange(dim)) & 1
        return (2.0 * bits - 1.0).astype(np.float64)
    while True:
        # Duplicates among 2**31 or more vertices are vanishingly rare; redraw if one happens.
        signs = rng.integers(2, size=(k, dim)) * 2.0 - 1.0
        if len(np.unique(signs, axis=0)) == k:
            return signs


def _float_dtype(dtype: Any) -> np.dtype:
    dt = np.dtype(dtype)
    if dt.kind != "f":
        raise TypeError(f"dtype must be a floating-point dtype such as float32 or float64; got {dt}.")
    return dt


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
    repeated = sorted({a for a, b in zip(paths, paths[1:]) if a == b})
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
