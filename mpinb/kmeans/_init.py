"""Initial centres for distributed k-means: k-means++, k-means|| and random, by global row index,
and a user's callable, checked to agree across ranks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from mpinb import _collective
from mpinb._chunks import SUM_ELEMENTS
from mpinb._rows import owners
from mpinb.interrupt import StopFlag
from mpinb.kmeans._distances import BLOCK_ELEMENTS, NO_WEIGHTS, sq_distances
from mpinb.kmeans._kernels import chunk_rows, chunks, kernels
from mpinb.kmeans._lloyd import lloyd
from mpinb.kmeans._shard import KMeansShard, kmeans_shard, relative_tol

__all__ = ["callable_result", "initial_centers", "kmeans_plusplus", "resolve_random_state"]

# k-means||: candidates drawn per round (times n_clusters) and rounds, as in Bahmani et al. (2012).
_OVERSAMPLING = 2.0
_ROUNDS = 5
_RECLUSTER_MAX_ITER = 100


def resolve_random_state(random_state: Any, comm: Any, name: str) -> np.random.RandomState:
    """The generator every rank draws from in step: seeded identically on all ranks.

    Collective only for ``None`` (rank 0 draws a fresh seed and shares it, in a collective named
    after the estimator's method ``name``).
    """
    if isinstance(random_state, np.random.RandomState):
        return random_state
    if random_state is None:
        seed = int(np.random.default_rng().integers(2**32)) if comm.Get_rank() == 0 else None
        return np.random.RandomState(_collective.bcast(seed, comm=comm, name=f"{name}'s random state"))
    return np.random.RandomState(int(random_state))


def initial_centers(
    data: KMeansShard, init: Any, k: int, rng: np.random.RandomState, stop: StopFlag | None
) -> np.ndarray:
    """Centred initial centres (k, n_features), identical on every rank. Collective."""
    if callable(init):
        return _from_callable(data, init, k, rng)
    if not isinstance(init, str):
        return np.asarray(init, dtype=data.out_dtype).astype(np.float64) - data.mean
    if init == "k-means++":
        return kmeans_plusplus(data, k, rng, stop)
    if init == "random":
        return _random_rows(data, k, rng)
    return _kmeans_parallel(data, k, rng, stop)


def _from_callable(
    data: KMeansShard, init: Callable[..., Any], k: int, rng: np.random.RandomState
) -> np.ndarray:
    """``init(X_local, k, random_state=rng)`` on every rank, checked to agree. Collective.

    Each rank passes a read-only view of its own shard (raw coordinates, as given) and the
    generator every rank holds in the same state, as scikit-learn passes its ``RandomState``. An
    exception or a malformed result on any rank is raised on every rank (one collective); then
    one allgather compares digests of the centres and of the generator's state afterwards, so
    centres that depend on which rows a rank holds raise :class:`CollectiveMismatchError` on
    every rank instead of silently depending on the number of ranks.
    """
    from mpinb._digest import digest
    from mpinb.agreement import raise_together
    from mpinb.errors import CollectiveMismatchError

    d = data.X.shape[1]
    shard = data.X.view()
    shard.flags.writeable = False
    with raise_together(comm=data.comm):
        centers = callable_result(init(shard, k, random_state=rng), k, d).astype(data.out_dtype)
    digests = (digest(centers), digest(rng))
    table = _collective.allgather(digests, comm=data.comm, name=f"{data.name}'s init callable check")
    for part, (what, fix) in enumerate(_CALLABLE_MISMATCH):
        groups: dict[str, list[int]] = {}
        for rank, row in enumerate(table):
            groups.setdefault(row[part], []).append(rank)
        if len(groups) > 1:
            listing = " | ".join(", ".join(map(str, ranks)) for ranks in groups.values())
            raise CollectiveMismatchError(
                f"init(X_local, n_clusters, random_state) {what} on different ranks (ranks that "
                f"agree: {listing}). A callable init is called on every rank with that rank's "
                f"shard and the same random_state; {fix}"
            )
    return centers.astype(np.float64) - data.mean


_CALLABLE_MISMATCH = (
    (
        "returned different centres",
        "its centres must not depend on the rows of X_local: return fixed centres or draw them "
        "from random_state only, or compute them beforehand and pass init as an array.",
    ),
    (
        "left random_state in different states",
        "it must draw the same random numbers on every rank (the number of draws must not "
        "depend on X_local).",
    ),
)


def callable_result(result: Any, k: int, d: int) -> np.ndarray:
    """The callable's centres as a float64 array of shape (k, d), or a clear local error."""
    if hasattr(result, "toarray"):
        result = result.toarray()
    arr = np.asarray(result)
    if arr.dtype.kind not in "biuf":
        raise TypeError(
            f"init(X_local, n_clusters, random_state) must return an array of real numbers of shape "
            f"(n_clusters, n_features) = ({k}, {d}); got {type(result).__name__} with dtype {arr.dtype}."
        )
    if arr.shape != (k, d):
        raise ValueError(
            f"init(X_local, n_clusters, random_state) returned an array of shape {arr.shape}, but it "
            f"must be (n_clusters, n_features) = ({k}, {d})."
        )
    arr = arr.astype(np.float64)
    if not np.isfinite(arr).all():
        raise ValueError(
            "init(X_local, n_clusters, random_state) returned NaN or infinity; it must return finite centres."
        )
    return arr


def kmeans_plusplus(
    data: KMeansShard, k: int, rng: np.random.RandomState, stop: StopFlag | None
) -> np.ndarray:
    """scikit-learn's greedy k-means++ (``2 + log k`` trials per centre) over distributed rows.

    Every rank draws the same random numbers, in the same order as scikit-learn; each draw is a
    position on the global cumulative sum of ``weight * distance^2`` in rank order, resolved by
    the rank that holds it. Per centre: one Allreduce for the candidate rows, one allgather of each
    rank's potential per candidate (and the stop flag), and two passes over the shard (the
    executor's ``seed_distances``: the candidates' potentials, then the chosen centre's distances;
    keeping every candidate's distances instead, as scikit-learn does, would hold
    ``trials x n_local`` floats to save the second, cheaper pass).
    """
    d = data.X.shape[1]
    trials = 2 + int(np.log(k))
    centers = np.empty((k, d))
    first, _ = _pick(data, data.weight_slice, data.weight_sums,
                     np.array([rng.random_sample() * data.weight_sums.sum()]), "right")
    centers[0] = first[0]
    closest = np.empty(data.n_local)
    # One executor for the whole seeding, from global sizes (the same on every rank), as the fit.
    run_on = kernels(data.n_total * k)
    w = NO_WEIGHTS if data.weights is None else data.weights
    block = min(chunk_rows(d), chunk_rows(trials, BLOCK_ELEMENTS))

    def distances(points: np.ndarray, mode: int, pots: np.ndarray) -> None:
        c_sq = np.einsum("ij,ij->i", points, points)
        run_on.seed_distances(data.X, data.mean, points, c_sq, closest, w, data.weights is not None, pots, mode, block)

    unused = np.zeros(1)
    distances(centers[:1], 0, unused)
    rank_pots = _gather_pots(data, np.array([_weighted_sum(data, closest)]), stop)[:, 0]
    current = rank_pots.sum()
    for c in range(1, k):
        thresholds = rng.uniform(size=trials) * current
        candidates, _ = _pick(data, _weighted_values(data, closest), rank_pots, thresholds, "left")
        pots = np.zeros(trials)
        distances(candidates, 1, pots)
        table = _gather_pots(data, pots, stop)
        totals = table.sum(axis=0)
        best = int(np.argmin(totals))
        current, rank_pots = totals[best], table[:, best]
        centers[c] = candidates[best]
        if c < k - 1:
            distances(centers[c : c + 1], 2, unused)
    return centers


def _random_rows(data: KMeansShard, k: int, rng: np.random.RandomState) -> np.ndarray:
    """``RandomState.choice(n, k, replace=False, p=w / w.sum())`` over distributed rows.

    The same rounds as NumPy: draw the missing number of points, drop repeats, zero the weight of
    the points found, repeat. One Allreduce per round.
    """
    d = data.X.shape[1]
    found_rows = np.empty((0, d))
    found_idx = np.empty(0, dtype=np.int64)
    found_w = np.empty(0)
    while found_idx.size < k:
        draws = rng.rand(k - found_idx.size)
        owners = data.layout.owner(found_idx)
        totals = data.weight_sums - np.bincount(owners, weights=found_w, minlength=data.size)
        _, local = data.layout.mine(found_idx)

        def values(s: int, e: int, local: np.ndarray = local) -> np.ndarray:  # this round's rows, bound now
            w = data.weight_slice(s, e).copy()
            hit = local[(local >= s) & (local < e)]
            w[hit - s] = 0.0
            return w

        rows, extra = _pick(data, values, totals, draws * totals.sum(), "right")
        new = extra[:, 0].astype(np.int64)
        _, first = np.unique(new, return_index=True)
        first.sort()
        found_rows = np.concatenate([found_rows, rows[first]])
        found_idx = np.concatenate([found_idx, new[first]])
        found_w = np.concatenate([found_w, extra[first, 1]])
    return found_rows


def _kmeans_parallel(
    data: KMeansShard, k: int, rng: np.random.RandomState, stop: StopFlag | None
) -> np.ndarray:
    """k-means|| (Bahmani et al.): ``2k`` expected candidates per round for 5 rounds, weighted by
    the points closest to each, then reclustered on rank 0 by weighted k-means++ and Lloyd.

    A row is kept in a round when a uniform number keyed by (round, *global* row index) falls
    below ``2k * w * d^2 / phi``, so the candidates -- and the result -- do not depend on how
    the rows are split over ranks.
    """
    from mpinb.comm import gather_rows, on_root

    d = data.X.shape[1]
    first, _ = _pick(data, data.weight_slice, data.weight_sums,
                     np.array([rng.random_sample() * data.weight_sums.sum()]), "right")
    candidates = first
    # Squared distances only steer the sampling and the candidate weights, so float32 halves the
    # memory at no cost in quality -- unless the data are so large that they would overflow it.
    small = 4.0 * (data.max_sq_norm + float(data.mean @ data.mean)) < 1e37
    closest = np.full(data.n_local, np.inf, dtype=np.float32 if small else np.float64)
    nearest = np.zeros(data.n_local, dtype=np.int32)
    _update_nearest(data, candidates, 0, closest, nearest)
    for _ in range(_ROUNDS):
        phi = np.array([_weighted_sum(data, closest)])
        _collective.reduce_in_place([phi], comm=data.comm, name=f"{data.name}'s k-means|| round", stop=stop,
                                    where=f"mpinb.{data.name} (k-means|| initialisation)")
        if phi[0] <= 0:
            break
        key = int(rng.randint(0, 2**62, dtype=np.int64))
        picked = []
        for s, e in chunks(data.n_local, chunk_rows(d)):
            u = _uniform_by_index(key, data.offset + s, data.offset + e)
            odds = _OVERSAMPLING * k * np.multiply(data.weight_slice(s, e), closest[s:e])
            keep = np.flatnonzero(u * float(phi[0]) < odds)
            if keep.size:
                rows = np.empty((keep.size, d + 1))
                np.subtract(data.X[s + keep], data.mean, out=rows[:, :d], dtype=np.float64)
                rows[:, d] = data.offset + s + keep
                picked.append(rows)
        mine = np.concatenate(picked) if picked else np.empty((0, d + 1))
        new = gather_rows(mine, root=None, comm=data.comm)[:, :d]
        if new.shape[0]:
            _update_nearest(data, new, candidates.shape[0], closest, nearest)
            candidates = np.concatenate([candidates, new])
    weights = np.zeros(candidates.shape[0])
    for s, e in chunks(data.n_local, SUM_ELEMENTS):
        w = None if data.weights is None else data.weights[s:e]
        weights += np.bincount(nearest[s:e], weights=w, minlength=candidates.shape[0])
    _collective.reduce_in_place([weights], comm=data.comm, name=f"{data.name}'s k-means|| weights")
    seed = int(rng.randint(0, 2**31 - 1))
    return on_root(_recluster, candidates, weights, k, seed, data.name, comm=data.comm)


def _recluster(candidates: np.ndarray, weights: np.ndarray, k: int, seed: int, name: str) -> np.ndarray:
    """Weighted k-means++ then Lloyd over the k-means|| candidates, on one process."""
    from mpi4py import MPI

    sub = kmeans_shard(
        candidates, weights, candidates.sum(axis=0), n_clusters=min(k, candidates.shape[0]), init="k-means++",
        comm=MPI.COMM_SELF, name=f"{name}'s k-means|| reclustering",
    )
    start = kmeans_plusplus(sub, k, np.random.RandomState(seed), None)
    if candidates.shape[0] > k:
        start = lloyd(sub, start, _RECLUSTER_MAX_ITER, relative_tol(sub, 1e-4), None).centers
    # Back to the coordinates of the candidates (centred on the full data's mean).
    return start + sub.mean


# ----------------------------------------------------------------------------------------------
# Distributed sampling by cumulative sums


def _pick(
    data: KMeansShard,
    values: Callable[[int, int], np.ndarray],
    rank_totals: np.ndarray,
    thresholds: np.ndarray,
    side: Literal["left", "right"],
) -> tuple[np.ndarray, np.ndarray]:
    """Rows at positions ``thresholds`` of the global cumulative sum of ``values`` in rank order.

    Collective (one Allreduce). ``side`` follows ``np.searchsorted``; positions past the end
    take the last row, as scikit-learn clips. Returns the centred rows (m, n_features) and, per
    row, its global index and weight (m, 2).
    """
    d = data.X.shape[1]
    m = thresholds.size
    ends = np.cumsum(rank_totals)
    starts = ends - rank_totals
    owner = owners(ends, thresholds, data.counts > 0, side)
    out = np.zeros((m, d + 2))
    mine = np.flatnonzero(owner == data.rank)
    if mine.size:
        order = mine[np.argsort(thresholds[mine], kind="stable")]
        local = np.full(order.size, data.n_local - 1, dtype=np.int64)
        running = starts[data.rank]
        pos = 0
        for s, e in chunks(data.n_local, 1 << 16):
            # Prepending the running total makes the chunked cumsum the same sequential sum as
            # one np.cumsum over all rows.
            cum = np.cumsum(np.concatenate(([running], values(s, e))))[1:]
            at = np.searchsorted(cum, thresholds[order[pos:]], side=side)
            hit = at < cum.size
            count = int(np.argmin(hit)) if not hit.all() else hit.size
            local[pos : pos + count] = s + at[:count]
            pos += count
            running = cum[-1]
            if pos == order.size:
                break
        out[order, :d] = np.subtract(data.X[local], data.mean, dtype=np.float64)
        out[order, d] = data.offset + local
        out[order, d + 1] = data.weight_slice(0, data.n_local)[local] if data.weights is not None else 1.0
    _collective.reduce_in_place([out], comm=data.comm, name=f"{data.name}'s initial centres")
    return out[:, :d], out[:, d:]


def _weighted_values(data: KMeansShard, closest: np.ndarray) -> Callable[[int, int], np.ndarray]:
    weights = data.weights
    if weights is None:
        return lambda s, e: closest[s:e]
    return lambda s, e: weights[s:e] * closest[s:e]


def _weighted_sum(data: KMeansShard, closest: np.ndarray) -> float:
    if data.weights is None:
        return float(closest.sum(dtype=np.float64))
    total = 0.0
    for s, e in chunks(data.n_local, SUM_ELEMENTS):
        total += float(closest[s:e] @ data.weights[s:e])
    return total


def _gather_pots(data: KMeansShard, pots: np.ndarray, stop: StopFlag | None) -> np.ndarray:
    """Each rank's potentials (size, len(pots)); a stop rides in the same allgather's arrival."""
    rows = _collective.allgather(pots, comm=data.comm, name=f"{data.name}'s k-means++ potentials", stop=stop,
                                 where=f"mpinb.{data.name} (k-means++ initialisation)")
    return np.array(rows)


def _min_distances(
    data: KMeansShard, points: np.ndarray, visit: Callable[[int, int, np.ndarray], None]
) -> None:
    """Call ``visit(s, e, dist)`` with the squared distances (len(points), e - s) of each chunk."""
    d = data.X.shape[1]
    # Both the centred copy of the chunk (d columns) and its distance block (one row per point)
    # stay bounded.
    step = min(chunk_rows(d), chunk_rows(points.shape[0], BLOCK_ELEMENTS))
    for s, e in chunks(data.n_local, step):
        xc = np.subtract(data.X[s:e], data.mean, dtype=np.float64)
        visit(s, e, sq_distances(xc, points))


def _update_nearest(
    data: KMeansShard, points: np.ndarray, first: int, closest: np.ndarray, nearest: np.ndarray
) -> None:
    def visit(s: int, e: int, dist: np.ndarray) -> None:
        best = dist.argmin(axis=0)
        value = dist[best, np.arange(e - s)]
        better = value < closest[s:e]
        closest[s:e][better] = value[better]
        nearest[s:e][better] = first + best[better]

    _min_distances(data, points, visit)


def _uniform_by_index(key: int, start: int, stop: int) -> np.ndarray:
    """Uniform numbers in [0, 1) for global rows [start, stop): SplitMix64 of (key, row index)."""
    z = np.arange(start, stop, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(key)
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    uniform: np.ndarray = (z >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
    return uniform
