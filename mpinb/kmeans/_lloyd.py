"""Lloyd's algorithm over rows spread across ranks: the shard's global summary, the iterations
(one Allreduce each) and the assignment and update steps behind them.

Private to :mod:`mpinb.kmeans` and :mod:`mpinb.kmeans._init`; everything here is collective
unless it says local.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from mpinb import _collective
from mpinb.interrupt import StopFlag
from mpinb.kmeans._kernels import SUM_ELEMENTS, chunk_rows, chunks, kernels

# Rows per chunk of a (rows, k) distance block outside the fit (transform, initialisation).
BLOCK_ELEMENTS = 1 << 16
# Rows per chunk of the assignment step: the (rows, k) GEMM output stays at about 128 KiB,
# which measured faster than larger blocks (it is scanned again by the argmin kernel while cached).
_ASSIGN_BLOCK_ELEMENTS = 1 << 14
# Most rows in one distance block, however few the clusters.
_MAX_BLOCK_ROWS = 8192
# Below this fraction of changed labels, the cluster sums are updated from the changed rows only.
_INCREMENTAL_FRACTION = 0.2
# euclidean() recomputes from differences the squared distances below this fraction of
# |x'|^2 + |c'|^2, where the GEMM formula's cancellation dominates them.
_REFINE_FRACTION = 2.0**-20
# Stands in for unit weights in the executors' passes (which take a flag instead of None).
_NO_WEIGHTS = np.empty(0)


# ----------------------------------------------------------------------------------------------
# The shard and its global summary


@dataclass
class Shard:
    """This rank's rows and the global facts every step needs (identical on all ranks)."""

    X: np.ndarray
    weights: np.ndarray | None  # None means unit weights, without an n-row array of ones
    comm: Any
    rank: int
    size: int
    counts: np.ndarray  # rows per rank
    weight_sums: np.ndarray  # weight per rank
    positive: np.ndarray  # rows with positive weight per rank
    offset: int  # global index of this rank's first row
    mean: np.ndarray  # global unweighted mean, the centring point
    max_sq_norm: float  # max over all rows of |x - mean|^2
    sq_norm_total: float  # sum over all rows of weight * |x - mean|^2
    tol: float  # absolute tolerance on the summed squared centre shift
    out_dtype: np.dtype

    @property
    def n_local(self) -> int:
        return int(self.X.shape[0])

    @property
    def n_total(self) -> int:
        return int(self.counts.sum())

    def weight_slice(self, s: int, e: int) -> np.ndarray:
        if self.weights is None:
            return np.ones(e - s)
        return self.weights[s:e]

    @classmethod
    def build(
        cls,
        X: np.ndarray,
        weights: np.ndarray | None,
        local_sum: np.ndarray,
        *,
        n_clusters: int,
        init: Any,
        tol: float,
        comm: Any,
        name: str = "KMeans.fit",
    ) -> Shard:
        """Two passes over the shard and four small collectives: counts, mean, variance, norms.
        ``name`` (the estimator's method) names the collectives in errors and timeouts."""
        n, d = X.shape
        wsum = float(n) if weights is None else float(weights.sum())
        npos = n if weights is None else int(np.count_nonzero(weights > 0))
        table = np.array(_collective.allgather((n, wsum, npos, X.dtype == np.float32), comm=comm,
                                               name=f"{name}'s shard summary"), dtype=np.float64)
        counts, weight_sums, positive = table[:, 0].astype(np.int64), table[:, 1], table[:, 2].astype(np.int64)
        rank, size = comm.Get_rank(), comm.Get_size()
        k, total = n_clusters, int(counts.sum())
        where = f"across {size} ranks" if size > 1 else "on the only rank"
        # These decisions use allgathered values, so every rank raises the same error.
        if total < k:
            raise ValueError(
                f"n_clusters must be <= the total number of samples ({total:,} {where}); got {k:,}."
            )
        if not weight_sums.sum() > 0:
            raise ValueError(
                "sample_weight sums to 0 over all ranks; at least one sample needs a positive weight."
            )
        if isinstance(init, str) and init == "random" and positive.sum() < k:
            raise ValueError(
                f"init='random' needs at least n_clusters={k} samples with positive weight; there are "
                f"{int(positive.sum())} {where}."
            )
        sums = local_sum.copy()
        _collective.reduce_in_place([sums], comm=comm, name=f"{name}'s mean")
        mean = sums / total
        # Second pass, centred: per-feature variance (for tol), the largest squared norm (the
        # initialisation's overflow guard) and the weighted total (for the per-iteration inertia).
        stats = np.zeros(d + 1)
        biggest = np.zeros(1)
        unit = weights is None
        run = kernels(total * k)
        biggest[0] = run.centred_stats(X, mean, _NO_WEIGHTS if unit else weights, not unit, stats)
        with _collective.collective(comm, f"{name}'s variance", (stats.shape, biggest.shape)) as call:
            call.allreduce([stats], "sum")
            call.allreduce([biggest], "max")
        tol = float(np.mean(stats[:d] / total) * tol) if tol else 0.0
        return cls(
            X=X,
            weights=weights,
            comm=comm,
            rank=rank,
            size=size,
            counts=counts,
            weight_sums=weight_sums,
            positive=positive,
            offset=int(counts[:rank].sum()),
            mean=mean,
            max_sq_norm=float(biggest[0]),
            sq_norm_total=float(stats[d]),
            tol=tol,
            out_dtype=np.dtype(np.float32) if table[:, 3].all() else np.dtype(np.float64),
        )


# ----------------------------------------------------------------------------------------------
# Lloyd iterations


@dataclass
class Run:
    centers: np.ndarray  # centred coordinates
    labels: np.ndarray
    inertia: float
    n_iter: int
    history: list[float]
    counts: np.ndarray  # global number of rows per cluster


def lloyd(
    data: Shard,
    centers: np.ndarray,
    max_iter: int,
    tol: float,
    stop: StopFlag | None,
    hook: Callable[[dict[str, Any]], None] | None = None,
    run: int = 0,
) -> Run:
    """scikit-learn's ``_kmeans_single_lloyd`` over distributed rows, one Allreduce per iteration."""
    X, comm, mean = data.X, data.comm, data.mean
    k, d = centers.shape
    n = data.n_local
    labels = np.full(n, -1, dtype=np.int32)
    limit = int(_INCREMENTAL_FRACTION * n)
    track = (np.empty(limit, dtype=np.int32 if n < 2**31 else np.int64), np.empty(limit, dtype=np.int32))
    sums = np.zeros((k, d))  # local, raw coordinates
    weights = np.zeros(k)
    members = np.zeros(k)  # local rows with positive weight, exact in float64
    # The one buffer reduced per iteration: [sums | weights | members | changed | stop].
    packed = np.empty(k * d + 2 * k + 2)
    history: list[float] = []
    strict = False
    centers = np.array(centers, dtype=np.float64)
    # One executor for the whole fit, from global sizes: the same on every rank.
    run_on = kernels(data.n_total * k)
    i = 0
    for i in range(max_iter):  # noqa: B007 - i is the iteration count after the loop
        changes = assign(X, centers, mean, labels, track=track, run_on=run_on)
        _update_sums(run_on, data, labels, changes, sums, weights, members)
        packed[: k * d] = sums.reshape(-1)
        packed[k * d : k * d + k] = weights
        packed[k * d + k : k * d + 2 * k] = members
        packed[-2] = changes.n_changed
        packed[-1] = 0.0 if stop is None else stop.value
        _collective.reduce_in_place([packed], comm=comm, name="KMeans.fit's Lloyd iteration")
        if packed[-1] > 0:
            assert stop is not None
            stop.raise_interrupt(f"mpinb.KMeans.fit (run {run + 1}, iteration {i + 1})")
        g_weights = packed[k * d : k * d + k].copy()
        g_members = packed[k * d + k : k * d + 2 * k]
        n_changed = int(packed[-2])
        # Centred sums: sum w (x - mean) = sum w x - W mean.
        g_sums = packed[: k * d].reshape(k, d) - g_weights[:, None] * mean
        empty = g_members == 0
        g_weights[empty] = 0.0
        g_sums[empty] = 0.0
        inertia = data.sq_norm_total - 2.0 * float(np.sum(centers * g_sums)) + float(
            g_weights @ np.einsum("ij,ij->i", centers, centers)
        )
        history.append(max(inertia, 0.0))
        if empty.any():
            _relocate_empty(data, centers, labels, g_sums, g_weights)
        new_centers = g_sums.copy()
        full = g_weights > 0
        new_centers[full] *= (1.0 / g_weights[full])[:, None]
        if not full.all():
            # Still empty after relocation (more clusters than distinct points, or a relocated
            # point of zero weight): scikit-learn's _average_centers puts such a centre on the
            # heaviest cluster's, not at the origin. So with duplicates it stops moving and the
            # centre shift can reach 0 (scikit-learn issue 28055: stop after one iteration).
            new_centers[~full] = new_centers[int(np.argmax(g_weights))]
        shift = float(np.sum((new_centers - centers) ** 2))
        centers = new_centers
        if hook is not None:
            hook(
                {
                    "run": run,
                    "iteration": i + 1,
                    "inertia": history[-1],
                    "n_changed": n_changed,
                    "center_shift": shift,
                    "centers": centers + mean,
                    "stop": stop,
                }
            )
        if n_changed == 0:
            strict = True
            break
        if shift <= tol:
            break
    if not strict:
        # Labels must match the final centres.
        assign(X, centers, mean, labels, run_on=run_on)
    final = np.zeros(k + 1)
    unit = data.weights is None
    w = _NO_WEIGHTS if unit else data.weights
    final[k] = run_on.inertia_counts(X, w, not unit, centers + mean, labels, final[:k])
    _collective.reduce_in_place([final], comm=comm, name="KMeans.fit's inertia")
    return Run(centers, labels, float(final[k]), i + 1, history, final[:k])


def same_clustering(a: Run, b: Run, data: Shard) -> bool:
    """scikit-learn's ``_is_same_clustering`` (a's labels map onto b's), decided over all ranks."""
    k = a.centers.shape[0]
    mapping = np.full(k, -1, dtype=np.int64)
    ok = True
    for s, e in chunks(a.labels.size, SUM_ELEMENTS):
        la, lb = a.labels[s:e], b.labels[s:e]
        seen, first = np.unique(la, return_index=True)
        unset = mapping[seen] < 0
        mapping[seen[unset]] = lb[first[unset]]
        if not np.array_equal(mapping[la], lb):
            ok = False
            break
    verdicts = _collective.allgather((ok, mapping), comm=data.comm, name="KMeans.fit's clustering comparison")
    if not all(flag for flag, _ in verdicts):
        return False
    merged = np.full(k, -1, dtype=np.int64)
    for _, m in verdicts:
        both = (merged >= 0) & (m >= 0)
        if np.any(merged[both] != m[both]):
            return False
        merged[m >= 0] = m[m >= 0]
    return True


@dataclass
class _Changes:
    n_changed: int
    rows: np.ndarray | None  # local indices of changed rows, or None when too many to track
    old: np.ndarray | None


def assign(
    X: np.ndarray,
    centers: np.ndarray,
    mean: np.ndarray,
    labels: np.ndarray,
    track: tuple[np.ndarray, np.ndarray] | None = None,
    run_on: Any = None,
) -> _Changes:
    """Nearest centre of every row, in chunks, writing ``labels`` in place. Local.

    ``centers`` are centred (``c - mean``). Per chunk, one GEMM in the data's precision gives
    ``-2 x.c'`` and the executor's argmin adds ``q = |c'|^2 + 2 mean.c'`` in float64, so the
    block is ``|x' - c'|^2 - |x'|^2`` (``x`` is used uncentred in the product, which needs no
    centred copy of the rows). With ``track=(rows, old)`` buffers, the changed rows and their
    old labels are recorded there (for an incremental update of the sums) until the buffers are
    full. ``run_on`` is the executor (:func:`kernels`), by default chosen from this call's size.
    """
    n = X.shape[0]
    k = centers.shape[0]
    if run_on is None:
        run_on = kernels(n * k)
    gemm_dtype = np.float32 if X.dtype == np.float32 else np.float64
    c2t = np.ascontiguousarray((-2.0 * centers).T, dtype=gemm_dtype)
    q = np.ascontiguousarray(np.einsum("ij,ij->i", centers, centers) + 2.0 * (centers @ mean))
    block = chunk_rows(k, _ASSIGN_BLOCK_ELEMENTS, maximum=_MAX_BLOCK_ROWS)
    if track is None:
        rows, old = np.empty(0, dtype=np.int32), np.empty(0, dtype=np.int32)
        recorded = -1
    else:
        (rows, old), recorded = track, 0
    n_changed, recorded = run_on.assign_rows(X, c2t, q, labels, rows, old, recorded, block)
    if track is None or recorded < 0:
        return _Changes(n_changed, None, None)
    return _Changes(n_changed, rows[:recorded], old[:recorded])


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


def _update_sums(
    run_on: Any, data: Shard, labels: np.ndarray, changes: _Changes, sums: np.ndarray, weights: np.ndarray,
    members: np.ndarray,
) -> None:
    """Local per-cluster sums (raw coordinates, float64), weights and positive-weight members.

    After the first iterations only a few labels change, so the sums are updated from the changed
    rows alone (added to the new cluster, removed from the old); with many changes they are
    recomputed. A cluster left without members is reset to exact zeros so round-off cannot
    accumulate there.
    """
    w = data.weights
    wv = _NO_WEIGHTS if w is None else w
    if changes.rows is None:
        sums[:] = 0.0
        weights[:] = 0.0
        members[:] = 0.0
        run_on.sums_full(data.X, wv, w is not None, labels, sums, weights, members)
        return
    run_on.sums_delta(data.X, wv, w is not None, changes.rows, changes.old, labels, sums, weights, members)
    gone = members == 0
    sums[gone] = 0.0
    weights[gone] = 0.0


def _relocate_empty(
    data: Shard, centers: np.ndarray, labels: np.ndarray, sums: np.ndarray, weights: np.ndarray
) -> None:
    """Move each empty cluster to one of the points farthest from their centre, over all ranks.

    Collective (one allgather, only in iterations that found an empty cluster). Mirrors
    scikit-learn's ``_relocate_empty_clusters_dense`` on the centred sums; the farthest points are
    taken in decreasing distance, ties by global row index.
    """
    empty = np.flatnonzero(weights == 0)
    n_empty = empty.size
    X, mean = data.X, data.mean
    d = X.shape[1]
    n = data.n_local
    # Local candidates: the n_empty farthest rows from their assigned (old) centre.
    best_dist = np.empty(0)
    best_rows = np.empty(0, dtype=np.int64)
    for s, e in chunks(n, chunk_rows(d)):
        diff = np.subtract(X[s:e], mean, dtype=np.float64)
        diff -= centers[labels[s:e]]
        dist = np.einsum("ij,ij->i", diff, diff)
        best_dist = np.concatenate([best_dist, dist])
        best_rows = np.concatenate([best_rows, np.arange(s, e)])
        if best_dist.size > n_empty:
            keep = np.argpartition(-best_dist, n_empty - 1)[:n_empty]
            best_dist, best_rows = best_dist[keep], best_rows[keep]
    rows = np.subtract(X[best_rows], mean, dtype=np.float64).reshape(-1, d)
    local_w = np.ones(best_rows.size) if data.weights is None else data.weights[best_rows]
    mine = (best_dist, best_rows + data.offset, local_w, labels[best_rows].astype(np.int64), rows)
    gathered = _collective.allgather(mine, comm=data.comm, name="KMeans.fit's empty-cluster candidates")
    dist = np.concatenate([g[0] for g in gathered])
    if dist.size == 0 or dist.max() == 0:
        # More clusters than distinct points: relocating is pointless (as in scikit-learn).
        return
    gidx = np.concatenate([g[1] for g in gathered])
    w = np.concatenate([g[2] for g in gathered])
    old = np.concatenate([g[3] for g in gathered])
    xs = np.concatenate([g[4] for g in gathered])
    order = np.lexsort((gidx, -dist))[:n_empty]
    for new_id, far in zip(empty, order):
        sums[old[far]] -= xs[far] * w[far]
        sums[new_id] = xs[far] * w[far]
        weights[new_id] = w[far]
        weights[old[far]] -= w[far]


def local_inertia(X: np.ndarray, weights: np.ndarray | None, centers: np.ndarray, labels: np.ndarray) -> float:
    """Local weighted sum of squared distances to the assigned centres (raw coordinates): the
    executors' ``inertia_counts`` pass, on the executor for this call's size."""
    k = centers.shape[0]
    w = _NO_WEIGHTS if weights is None else weights
    run_on = kernels(X.shape[0] * k)
    return float(run_on.inertia_counts(X, w, weights is not None, np.asarray(centers, dtype=np.float64), labels, np.zeros(k)))


# ----------------------------------------------------------------------------------------------
# Small helpers


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
