"""Lloyd's algorithm over rows spread across ranks: the iterations (one Allreduce each), the
update of the cluster sums and the relocation of empty clusters.

Private to :mod:`mpinb.kmeans`; everything here is collective unless it says local.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from mpinb import _collective
from mpinb._chunks import SUM_ELEMENTS
from mpinb.interrupt import StopFlag
from mpinb.kmeans._distances import NO_WEIGHTS, Changes, Fold, assign
from mpinb.kmeans._kernels import FOLD_INERTIA, FOLD_MOVES, FOLD_SUMS, chunk_rows, chunks, kernels
from mpinb.kmeans._shard import KMeansShard as Shard

__all__ = ["Run", "lloyd", "same_clustering"]

# Below this fraction of changed labels, the cluster sums are updated from the changed rows only.
_INCREMENTAL_FRACTION = 0.2


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
    begin: Callable[[dict[str, Any]], None] | None = None,
) -> Run:
    """scikit-learn's ``_kmeans_single_lloyd`` over distributed rows, one Allreduce per iteration.

    ``hook`` gets each iteration's reduced values after its reduction, ``begin`` the iteration and
    its starting centres before its pass; both must be local (no collective)."""
    X, comm, mean = data.X, data.comm, data.mean
    k, d = centers.shape
    n = data.n_local
    labels = np.full(n, -1, dtype=np.int32)
    limit = int(_INCREMENTAL_FRACTION * n)
    track = (np.empty(limit, dtype=np.int32 if n < 2**31 else np.int64), np.empty(limit, dtype=np.int32))
    sums = np.zeros((k, d))  # local, raw coordinates
    weights = np.zeros(k)
    members = np.zeros(k)  # local rows with positive weight, exact in float64
    # The one buffer reduced per iteration: [sums | weights | members | changed]; a stop rides in
    # the arrival's vote.
    packed = np.empty(k * d + 2 * k + 1)
    history: list[float] = []
    strict = False
    centers = np.array(centers, dtype=np.float64)
    # One executor for the whole fit, from global sizes: the same on every rank.
    run_on = kernels(data.n_total * k)
    i = 0
    unit = data.weights is None
    w = NO_WEIGHTS if data.weights is None else data.weights
    for i in range(max_iter):  # noqa: B007 - i is the iteration count after the loop
        if begin is not None:
            begin({"run": run, "iteration": i + 1, "centers": centers + mean})
        if i == 0:
            # Every label changes in the first iteration (from -1), so its sums are full sums:
            # added in the assignment's pass while each chunk is in cache, not in a second pass.
            fold = Fold(FOLD_SUMS, w, not unit, centers, sums, weights, members)
            changes = assign(X, centers, mean, labels, run_on=run_on, fold=fold)
        else:
            # The changed rows move between the clusters' sums in the assignment's pass.
            fold = Fold(FOLD_MOVES, w, not unit, centers, sums, weights, members)
            changes = assign(X, centers, mean, labels, track=track, run_on=run_on, fold=fold)
            _update_sums(run_on, data, labels, changes, sums, weights, members)
        packed[: k * d] = sums.reshape(-1)
        packed[k * d : k * d + k] = weights
        packed[k * d + k : k * d + 2 * k] = members
        packed[-1] = changes.n_changed
        _collective.reduce_in_place([packed], comm=comm, name=f"{data.name}'s Lloyd iteration", stop=stop,
                                    where=f"mpinb.{data.name} (run {run + 1}, iteration {i + 1})")
        g_weights = packed[k * d : k * d + k].copy()
        g_members = packed[k * d + k : k * d + 2 * k]
        n_changed = int(packed[-1])
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
    final = np.zeros(k + 1)
    if not strict:
        # Labels must match the final centres; the inertia and counts are added in the same pass.
        fold = Fold(FOLD_INERTIA, w, not unit, centers + mean, sums, weights, final[:k])
        final[k] = assign(X, centers, mean, labels, run_on=run_on, fold=fold).inertia
    else:
        final[k] = run_on.inertia_counts(X, w, not unit, centers + mean, labels, final[:k])
    _collective.reduce_in_place([final], comm=comm, name=f"{data.name}'s inertia")
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
    verdicts = _collective.allgather((ok, mapping), comm=data.comm, name=f"{data.name}'s clustering comparison")
    if not all(flag for flag, _ in verdicts):
        return False
    merged = np.full(k, -1, dtype=np.int64)
    for _, m in verdicts:
        both = (merged >= 0) & (m >= 0)
        if np.any(merged[both] != m[both]):
            return False
        merged[m >= 0] = m[m >= 0]
    return True


def _update_sums(
    run_on: Any, data: Shard, labels: np.ndarray, changes: Changes, sums: np.ndarray, weights: np.ndarray,
    members: np.ndarray,
) -> None:
    """Local per-cluster sums (raw coordinates, float64), weights and positive-weight members,
    after an assignment that moved the changed rows between clusters (FOLD_MOVES).

    After the first iterations only a few labels change, so the sums are updated from the changed
    rows alone (added to the new cluster, removed from the old, in the assignment's pass); with
    many changes (the track buffers overflowed) they are recomputed. A cluster left without
    members is reset to exact zeros so round-off cannot accumulate there.
    """
    w = data.weights
    wv = NO_WEIGHTS if w is None else w
    if changes.rows is None:
        sums[:] = 0.0
        weights[:] = 0.0
        members[:] = 0.0
        run_on.sums_full(data.X, wv, w is not None, labels, sums, weights, members)
        return
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
    gathered = _collective.allgather(mine, comm=data.comm, name=f"{data.name}'s empty-cluster candidates")
    dist = np.concatenate([g[0] for g in gathered])
    if dist.size == 0 or dist.max() == 0:
        # More clusters than distinct points: relocating is pointless (as in scikit-learn).
        return
    gidx = np.concatenate([g[1] for g in gathered])
    w = np.concatenate([g[2] for g in gathered])
    old = np.concatenate([g[3] for g in gathered])
    xs = np.concatenate([g[4] for g in gathered])
    order = np.lexsort((gidx, -dist))[:n_empty]
    for new_id, far in zip(empty, order, strict=False):
        sums[old[far]] -= xs[far] * w[far]
        sums[new_id] = xs[far] * w[far]
        weights[new_id] = w[far]
        weights[old[far]] -= w[far]
