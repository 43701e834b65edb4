"""Compiled per-row kernels of mpinb.KMeans (numba), with ``None`` meaning: use the NumPy path.

The distance GEMM stays in BLAS (the caller runs it per chunk); what numba replaces are the
passes NumPy cannot fuse: the argmin over a chunk's distance block with change tracking, the
per-cluster sums, and the centring statistics. Each kernel reads its rows once, so a chunk is
still in cache when it is scanned. ``numba`` is optional: :func:`kernels` returns ``None`` when
it is missing (or ``MPINB_NUMBA=0``) and :mod:`mpinb.kmeans` keeps its NumPy implementation.
Kernels are compiled on first use and cached on disk (``cache=True``).
"""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

from mpinb import _numba

__all__ = ["kernels"]


@functools.cache
def kernels() -> Any:
    """The compiled kernels as a namespace, or ``None`` when numba is unavailable or disabled."""
    numba = _numba.load()
    return None if numba is None else _compile(numba)


def _compile(numba: Any) -> SimpleNamespace:
    jit = numba.njit(cache=True, nogil=True, boundscheck=False)

    @jit
    def argmin_rows(dist, q, labels, start, track_rows, track_old, recorded):
        """Nearest centre of each row of ``dist + q`` (lowest index on ties), written to
        ``labels``; changed rows (global index ``start + i``) and their old labels are appended
        to the track buffers from position ``recorded`` until they are full (then -1).
        Returns (number of changed labels, new ``recorded``)."""
        m, k = dist.shape
        changed = 0
        limit = track_rows.size
        for i in range(m):
            best = dist[i, 0] + q[0]
            arg = 0
            for j in range(1, k):
                # Branch-free selects: the winner is data dependent, so a branch mispredicts.
                v = dist[i, j] + q[j]
                lower = v < best
                best = v if lower else best
                arg = j if lower else arg
            old = labels[i]
            if arg != old:
                changed += 1
                if recorded >= 0:
                    if recorded < limit:
                        track_rows[recorded] = start + i
                        track_old[recorded] = old
                        recorded += 1
                    else:
                        recorded = -1
                labels[i] = arg
        return changed, recorded

    @jit
    def sums_full(X, w, weighted, labels, sums, weights, members):
        """Add every row (times its weight) to its cluster's sums, weights and member count."""
        n, d = X.shape
        for i in range(n):
            c = labels[i]
            wi = w[i] if weighted else 1.0
            for t in range(d):
                sums[c, t] += wi * X[i, t]
            weights[c] += wi
            if wi > 0:
                members[c] += 1.0

    @jit
    def sums_delta(X, w, weighted, rows, old, labels, sums, weights, members):
        """Move each changed row's contribution from its old cluster to its new one."""
        d = X.shape[1]
        for r in range(rows.size):
            i = rows[r]
            a = labels[i]
            b = old[r]
            wi = w[i] if weighted else 1.0
            for t in range(d):
                x = wi * X[i, t]
                sums[a, t] += x
                sums[b, t] -= x
            weights[a] += wi
            weights[b] -= wi
            if wi > 0:
                members[a] += 1.0
                members[b] -= 1.0

    @jit
    def centred_stats(X, mean, w, weighted, stats):
        """Accumulate per-feature sums of squares of ``x - mean`` into ``stats[:d]``, the
        weighted sum of squared norms into ``stats[d]``; return the largest squared norm."""
        n, d = X.shape
        biggest = 0.0
        for i in range(n):
            sq = 0.0
            for t in range(d):
                v = X[i, t] - mean[t]
                stats[t] += v * v
                sq += v * v
            stats[d] += w[i] * sq if weighted else sq
            if sq > biggest:
                biggest = sq
        return biggest

    @jit
    def inertia_counts(X, w, weighted, centers, labels, counts):
        """Weighted sum of squared distances to the assigned (raw) centres; rows per label are
        added to ``counts``."""
        n, d = X.shape
        total = 0.0
        for i in range(n):
            c = labels[i]
            sq = 0.0
            for t in range(d):
                v = X[i, t] - centers[c, t]
                sq += v * v
            total += w[i] * sq if weighted else sq
            counts[c] += 1.0
        return total

    return SimpleNamespace(
        argmin_rows=argmin_rows,
        sums_full=sums_full,
        sums_delta=sums_delta,
        centred_stats=centred_stats,
        inertia_counts=inertia_counts,
    )
