"""A shard ready for k-means: the global counts checked against ``n_clusters`` and ``init``, and
the shard's summary computed on the executor the fit will use.

Private to :mod:`mpinb.kmeans`; collective.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mpinb._rows import Shard, Totals
from mpinb.kmeans._kernels import kernels

__all__ = ["kmeans_shard", "relative_tol"]


def kmeans_shard(
    X: np.ndarray, weights: np.ndarray | None, local_sum: np.ndarray, *, n_clusters: int, init: Any,
    comm: Any, name: str,
) -> Shard:
    """This rank's rows summarised for a k-means fit named ``name`` (the estimator's method, which
    names the collectives in errors and timeouts): two passes over the shard and four small
    collectives (counts, mean, variance and norms)."""
    totals = Totals.collect(X, weights, comm=comm, name=f"{name}'s shard summary")
    k, total = n_clusters, totals.n_total
    size = comm.Get_size()
    where = f"across {size} ranks" if size > 1 else "on the only rank"
    # These decisions use allgathered values, so every rank raises the same error.
    if total < k:
        raise ValueError(
            f"n_clusters must be <= the total number of samples ({total:,} {where}); got {k:,}."
        )
    if not totals.weight_sums.sum() > 0:
        raise ValueError(
            "sample_weight sums to 0 over all ranks; at least one sample needs a positive weight."
        )
    if isinstance(init, str) and init == "random" and totals.positive.sum() < k:
        raise ValueError(
            f"init='random' needs at least n_clusters={k} samples with positive weight; there are "
            f"{int(totals.positive.sum())} {where}."
        )
    # The executor from the fit's global size, so every rank takes the same one.
    return Shard.build(X, weights, local_sum, totals, passes=kernels(total * k), comm=comm, name=name)


def relative_tol(data: Shard, tol: float) -> float:
    """scikit-learn's absolute tolerance on the summed squared centre shift: ``tol`` times the
    mean variance of the features. Local."""
    return float(np.mean(data.variance) * tol) if tol else 0.0
