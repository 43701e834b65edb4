"""Synthetic data sets generated per shard: each rank draws only its own rows, in seeded blocks, so
the data are the same whatever the number of ranks."""

from __future__ import annotations

from typing import Any

import numpy as np

from mpinb import _collective
from mpinb._checks import check_int, default_comm, is_int
from mpinb.shards import shard_bounds

__all__ = ["make_blobs", "make_classification", "shared_seed"]

# Synthetic rows are drawn in blocks of this many rows, block b from its own stream seeded by
# (random_state, b). It is part of the data's definition: changing it changes every data set, but
# no choice of it makes the data depend on the number of ranks. A rank holds one block's draws at a
# time, which bounds its overhead independently of n_samples.
_BLOCK_ROWS = 1024
# spawn_key prefixes that keep the streams of shared draws (centres) and per-block draws apart.
_KEY_SHARED = 0
_KEY_BLOCK = 1


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
    ``n_samples`` grows), and a rank's memory is its shard plus one block. The centres are drawn from the seed
    alone, identically on every rank. With ``shard=False`` it is local and returns all rows.

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
    n_samples = check_int(n_samples, "n_samples", minimum=0)
    if is_int(centers):
        k = check_int(centers, "centers", minimum=1)
        n_features = check_int(n_features, "n_features", minimum=1)
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
    seed = shared_seed(random_state, shard, comm)
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
    dtype: Any = np.float32,
    random_state: int | None = 0,
    shard: bool = True,
    comm: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """A Gaussian classification problem for Keras demos, generating only this rank's rows.

    Collective when ``shard=True`` and local with ``shard=False``, like :func:`make_blobs`: each
    rank generates its rows ``shard_bounds(n_samples, rank, size)`` of one global data set, drawn in
    the same seeded blocks (byte-identical whatever the number of ranks; memory per rank ∝ its
    shard), and every rank of ``comm`` calls it with the same arguments.

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
    dtype : dtype, default float32
        Dtype of ``X``; float32 is what Keras computes in.
    random_state, shard, comm
        As in :func:`make_blobs`.

    Returns
    -------
    X : numpy.ndarray of shape (n_local, n_features)
    y : numpy.ndarray of shape (n_local,), int64

    Examples
    --------
    >>> X_local, y_local = mpinb.data.make_classification(100_000, n_features=20)
    >>> model.fit(X_local, y_local, epochs=5)   # with mpinb.keras's distributed optimizer  # doctest: +SKIP
    """
    n_samples = check_int(n_samples, "n_samples", minimum=0)
    n_features = check_int(n_features, "n_features", minimum=1)
    n_classes = check_int(n_classes, "n_classes", minimum=2)
    n_informative = check_int(n_informative, "n_informative", minimum=1)
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
    seed = shared_seed(random_state, shard, comm)
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


def _generate(
    block: Any, n_samples: int, n_features: int, dtype: np.dtype, seed: int, shard: bool, comm: Any
) -> tuple[np.ndarray, np.ndarray]:
    """Fill this rank's rows from the global blocks that overlap them."""
    if shard:
        comm = default_comm(comm)
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


def shared_seed(random_state: Any, shard: bool, comm: Any) -> int:
    """An int seed every rank agrees on; ``None`` is drawn on rank 0 and broadcast."""
    if random_state is not None:
        return check_int(random_state, "random_state", minimum=0)
    # 32 bits: scikit-learn accepts seeds below 2**32 only.
    fresh = int(np.random.SeedSequence().entropy) % (1 << 32)  # type: ignore[arg-type]  # an int when drawn
    if not shard:
        return fresh
    comm = default_comm(comm)
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
