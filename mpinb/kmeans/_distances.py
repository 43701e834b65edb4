"""Distances of rows to centres, the part of k-means both estimators share: the assignment step
(nearest centre per chunk, by the executor's products, with change tracking), nearest centres, the local
inertia, column sums and the Euclidean distances of ``transform``.

Private to :mod:`mpinb.kmeans`; everything here is local.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mpinb.kmeans._kernels import FOLD_NONE, chunk_rows, chunks, kernels

__all__ = [
    "BLOCK_ELEMENTS", "NO_WEIGHTS", "Changes", "Fold", "assign", "column_sums", "euclidean", "local_inertia",
    "nearest", "rows_per_block",
    "sq_distances",
]

# Rows per chunk of a (rows, k) distance block outside the fit (transform, initialisation).
BLOCK_ELEMENTS = 1 << 16
# Rows per chunk of the assignment step: the (rows, k) GEMM output stays at about 128 KiB,
# which measured faster than larger blocks (it is scanned again by the argmin kernel while cached).
_ASSIGN_BLOCK_ELEMENTS = 1 << 14
# Most rows in one distance block, however few the clusters.
_MAX_BLOCK_ROWS = 8192
# euclidean() recomputes from differences the squared distances below this fraction of
# |x'|^2 + |c'|^2, where the GEMM formula's cancellation dominates them.
_REFINE_FRACTION = 2.0**-20
# Stands in for unit weights in the executors' passes (which take a flag instead of None).
NO_WEIGHTS = np.empty(0)


@dataclass
class Changes:
    n_changed: int
    rows: np.ndarray | None  # local indices of changed rows, or None when too many to track
    old: np.ndarray | None
    inertia: float = 0.0  # with a FOLD_INERTIA fold: the local weighted inertia


@dataclass
class Fold:
    """What :func:`assign` adds up in its pass, with the new labels: ``kind`` FOLD_SUMS adds each
    row (times its weight ``w``, NO_WEIGHTS unless ``weighted``) to ``sums``, ``weights`` and
    ``members``; FOLD_INERTIA adds its squared distance to its raw centre (``centers``) to the
    inertia and 1 to ``members[label]``; FOLD_MOVES (with ``track``) moves each changed row from
    its old cluster's sums to its new one's, while the buffers hold every change (afterwards the
    caller recomputes the sums). Rows are added in order, as the separate passes add them."""

    kind: int
    w: np.ndarray
    weighted: bool
    centers: np.ndarray
    sums: np.ndarray
    weights: np.ndarray
    members: np.ndarray


_NO_FOLD = Fold(FOLD_NONE, NO_WEIGHTS, False, np.zeros((1, 1)), np.zeros((1, 1)), np.zeros(1), np.zeros(1))


def assign(
    X: np.ndarray,
    centers: np.ndarray,
    mean: np.ndarray,
    labels: np.ndarray,
    track: tuple[np.ndarray, np.ndarray] | None = None,
    run_on: Any = None,
    fold: Fold | None = None,
) -> Changes:
    """Nearest centre of every row, in chunks, writing ``labels`` in place. Local.

    ``centers`` are centred (``c - mean``). Per chunk, the products ``-2 x.c'`` in the data's
    precision (a GEMM, or the compiled executor's SIMD kernel) and the argmin adds
    ``q = |c'|^2 + 2 mean.c'`` in the same precision
    (float32 data compare in float32, as scikit-learn's float32 path does: converting every
    distance to float64 cost about 15% of an iteration and decides only near-ties), so the
    block is ``|x' - c'|^2 - |x'|^2`` (``x`` is used uncentred in the product, which needs no
    centred copy of the rows). With ``track=(rows, old)`` buffers, the changed rows and their
    old labels are recorded there (for an incremental update of the sums) until the buffers are
    full. ``run_on`` is the executor (:func:`kernels`), by default chosen from this call's size.
    ``fold`` adds the new labels' cluster sums or inertia in the same pass over the rows (see
    :class:`Fold`); the inertia is returned in ``Changes.inertia``.
    """
    n = X.shape[0]
    k = centers.shape[0]
    if run_on is None:
        run_on = kernels(n * k)
    gemm_dtype = np.float32 if X.dtype == np.float32 else np.float64
    # With SIMD vectors, the centres' matrix is padded to whole vectors by columns of zeros whose
    # offset is +inf (never the nearest): the kernel reads whole vectors only.
    width = run_on.simd_width(k, centers.shape[1], gemm_dtype)
    c2t = np.zeros((centers.shape[1], width or k), dtype=gemm_dtype)
    c2t[:, :k] = (-2.0 * centers).T
    q = np.full(width or k, np.inf, dtype=gemm_dtype)
    q[:k] = np.einsum("ij,ij->i", centers, centers) + 2.0 * (centers @ mean)
    block = chunk_rows(k, _ASSIGN_BLOCK_ELEMENTS, maximum=_MAX_BLOCK_ROWS)
    if track is None:
        rows, old = np.empty(0, dtype=np.int32), np.empty(0, dtype=np.int32)
        recorded = -1
    else:
        (rows, old), recorded = track, 0
    f = _NO_FOLD if fold is None else fold
    n_changed, recorded, inertia = run_on.assign_rows(
        X, c2t, q, labels, rows, old, recorded, block, f.kind, f.w, f.weighted, f.centers, f.sums, f.weights, f.members,
        width > 0,
    )
    if track is None or recorded < 0:
        return Changes(n_changed, None, None, inertia)
    return Changes(n_changed, rows[:recorded], old[:recorded], inertia)


def column_sums(X: np.ndarray, n_clusters: int) -> np.ndarray:
    """Local float64 column sums of ``X`` (non-finite when ``X`` holds NaN or infinity), on the
    executor for ``len(X) * n_clusters``. Local."""
    out = np.zeros(X.shape[1])
    kernels(X.shape[0] * n_clusters).column_sums(X, out)
    return out


def nearest(X: np.ndarray, centers: np.ndarray) -> np.ndarray:
    """Index of the nearest of ``centers`` (raw coordinates) for every row of ``X``. Local.

    The same distances as the fit's assignment step, centred on the centres' mean.
    """
    centers = np.asarray(centers, dtype=np.float64)
    mean = centers.mean(axis=0)
    labels = np.empty(X.shape[0], dtype=np.int32)
    assign(X, centers - mean, mean, labels)
    return labels


def local_inertia(X: np.ndarray, weights: np.ndarray | None, centers: np.ndarray, labels: np.ndarray) -> float:
    """Local weighted sum of squared distances to the assigned centres (raw coordinates): the
    executors' ``inertia_counts`` pass, on the executor for this call's size."""
    k = centers.shape[0]
    w = NO_WEIGHTS if weights is None else weights
    run_on = kernels(X.shape[0] * k)
    centres = np.asarray(centers, dtype=np.float64)
    return float(run_on.inertia_counts(X, w, weights is not None, centres, labels, np.zeros(k)))



def sq_distances(xc: np.ndarray, cc: np.ndarray) -> np.ndarray:
    """Squared distances (len(cc), len(xc)) of centred rows to centred points, as scikit-learn's
    ``euclidean_distances``: ``-2 c.x + |c|^2 + |x|^2``, clipped at zero."""
    dist = -2.0 * (cc @ xc.T)
    dist += np.einsum("ij,ij->i", cc, cc)[:, None]
    dist += np.einsum("ij,ij->i", xc, xc)[None, :]
    return np.maximum(dist, 0.0, out=dist)


def euclidean(X: np.ndarray, centers: np.ndarray) -> np.ndarray:
    """Euclidean distances (len(X), len(centers)) of raw rows to raw centres, in chunks. Local.

    First as :func:`sq_distances` (``|x'|^2 - 2 x'.c' + |c'|^2`` centred on the centres' mean,
    one GEMM per chunk). Where that value is below ``2**-20 (|x'|^2 + max |c'|^2)`` the
    cancellation leaves round-off comparable to it, so those entries are recomputed from the
    differences: a row equal to a centre is at distance exactly 0, and close pairs keep their
    relative accuracy (elsewhere the relative error of a squared distance stays below about
    ``(d + 2) 2**-31``). Only :meth:`KMeans.transform` pays for this, at about the cost of the
    former clipping pass; the assignment step of the fit keeps its single GEMM.
    """
    n = X.shape[0]
    k, d = centers.shape
    mean = centers.mean(axis=0)
    cc = centers - mean
    c2t = np.ascontiguousarray(-2.0 * cc.T)  # times -2 is exact: the same round-off as sq_distances
    c_sq = np.einsum("ij,ij->i", cc, cc)
    c_sq_max = float(c_sq.max())
    out = np.empty((n, k))
    block_rows = rows_per_block(k)
    near = np.empty((min(block_rows, n), k), dtype=bool)
    for s, e in chunks(n, block_rows):
        xc = np.subtract(X[s:e], mean, dtype=np.float64)
        x_sq = np.einsum("ij,ij->i", xc, xc)
        block, close = out[s:e], near[: e - s]
        np.dot(xc, c2t, out=block)
        block += x_sq[:, None]
        block += c_sq[None, :]
        # One threshold per row, from the largest centre norm: a superset of the entries below
        # 2**-20 (|x'|^2 + |c'|^2), and negative round-off falls below it too (no clipping).
        x_sq += c_sq_max
        x_sq *= _REFINE_FRACTION
        np.less_equal(block, x_sq[:, None], out=close)
        if not close.any():
            continue
        rows, cols = np.nonzero(close)
        for a, b in chunks(rows.size, chunk_rows(d)):
            diff = np.subtract(X[s + rows[a:b]], centers[cols[a:b]], dtype=np.float64)
            block[rows[a:b], cols[a:b]] = np.einsum("ij,ij->i", diff, diff)
    return np.sqrt(out, out=out)


def rows_per_block(k: int) -> int:
    """Rows per chunk of a (rows, k) distance block. Local."""
    return chunk_rows(k, BLOCK_ELEMENTS, maximum=_MAX_BLOCK_ROWS)
