"""The row pass of k-means++ seeding, in both executors of :mod:`._kernels`. Local.

One pass over the shard per use: the squared distances of every row to a few centred points,
scikit-learn's ``euclidean_distances(..., squared=True)`` formula on centred coordinates
(``-2 x'.c' + |c'|^2 + |x'|^2``, clipped at zero), folded straight into what k-means++ needs of
them, so no distance block, centred copy of the shard or per-row norm array outlives a chunk:

- ``mode`` 0: ``closest = d(x, points[0])`` (the first centre);
- ``mode`` 1: ``pots[j] += w * min(d(x, points[j]), closest)`` (the candidates' potentials);
- ``mode`` 2: ``closest = min(closest, d(x, points[0]))`` (the chosen centre).

``c_sq`` holds ``|c'|^2`` per point, computed once by the caller so both executors add the same
values. The compiled pass centres each chunk into a float64 buffer that stays in cache, takes
``x'.c'`` from one BLAS GEMM per chunk and does the rest row by row while the chunk is in cache;
the NumPy pass does the same with whole-chunk operations. They differ only in summation order
(of the GEMM, of ``|x'|^2`` and of the potentials), so a k-means++ draw can differ between them only
where a threshold falls within round-off of a boundary of the cumulative sum.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["compiled_pass", "numpy_pass"]


def numpy_pass(X, mean, points, c_sq, closest, w, weighted, pots, mode, block):
    n = X.shape[0]
    c2 = -2.0 * points  # times -2 is exact: the same values as -2 (c'.x')
    for s in range(0, n, block):
        e = min(n, s + block)
        xc = np.subtract(X[s:e], mean, dtype=np.float64)
        dist = c2 @ xc.T
        dist += c_sq[:, None]
        dist += np.einsum("ij,ij->i", xc, xc)[None, :]
        np.maximum(dist, 0.0, out=dist)
        if mode == 0:
            closest[s:e] = dist[0]
        elif mode == 1:
            np.minimum(dist, closest[s:e], out=dist)
            pots += dist @ w[s:e] if weighted else dist.sum(axis=1)
        else:
            np.minimum(closest[s:e], dist[0], out=closest[s:e])


def compiled_pass(numba: Any) -> Any:
    # Reassociation lets LLVM vectorise the reductions (|x'|^2 over the features, the potentials
    # over the rows): as sequential chains of dependent adds they made the pass compute bound at
    # about three times the time of reading the rows.
    @numba.njit(cache=True, nogil=True, boundscheck=False, fastmath={"reassoc", "contract"})
    def seed_distances(X, mean, points, c_sq, closest, w, weighted, pots, mode, block):
        """See the module docstring. Per block, the potentials are added up in a local partial
        first, so a long shard's sum is not one running total."""
        n, d = X.shape
        p = points.shape[0]
        c2t = np.ascontiguousarray((-2.0 * points).T)
        xc = np.empty((min(block, max(n, 1)), d))
        g = np.empty((xc.shape[0], p))
        part = np.zeros(p)
        for s in range(0, n, block):
            e = min(n, s + block)
            m = e - s
            for i in range(m):
                for t in range(d):
                    xc[i, t] = X[s + i, t] - mean[t]
            if m == xc.shape[0]:
                np.dot(xc, c2t, g)
                out = g
            else:
                out = np.dot(xc[:m], c2t)
            part[:] = 0.0
            for i in range(m):
                x_sq = 0.0
                for t in range(d):
                    x_sq += xc[i, t] * xc[i, t]
                if mode == 1:
                    wi = w[s + i] if weighted else 1.0
                    near = closest[s + i]
                    for j in range(p):
                        v = max(out[i, j] + c_sq[j] + x_sq, 0.0)
                        part[j] += wi * min(v, near)
                else:
                    v = max(out[i, 0] + c_sq[0] + x_sq, 0.0)
                    if mode == 0 or v < closest[s + i]:
                        closest[s + i] = v
            for j in range(p):
                pots[j] += part[j]

    return seed_distances
