"""A shard ready for k-means: the global counts checked against ``n_clusters`` and ``init``, and
the shard's k-means summary (the centring point, the feature variances, the norms) computed on the
executor the fit will use.

Private to :mod:`mpinb.kmeans`; collective unless a function says local.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mpinb import _collective
from mpinb._rows import Shard, Totals
from mpinb.kmeans._distances import NO_WEIGHTS
from mpinb.kmeans._kernels import kernels

__all__ = ["KMeansShard", "kmeans_shard", "relative_tol"]


@dataclass
class KMeansShard(Shard):
    """A :class:`mpinb._rows.Shard` with what every k-means step needs (identical on all ranks)."""

    mean: np.ndarray  # global unweighted mean, the centring point
    variance: np.ndarray  # global unweighted variance of each feature
    max_sq_norm: float  # max over all rows of |x - mean|^2
    sq_norm_total: float  # sum over all rows of weight * |x - mean|^2

    @classmethod
    def build(
        cls, X: np.ndarray, weights: np.ndarray | None, local_sum: np.ndarray, totals: Totals, *, passes: Any,
        comm: Any, name: str,
    ) -> KMeansShard:
        """The summary of the rows ``totals`` counted: a pass over the shard and two small
        collectives (mean, then variance and norms). ``local_sum`` holds this rank's float64 column
        sums; ``passes`` is the executor of the row passes (its ``centred_stats``), chosen from
        global sizes so every rank takes the same one."""
        d = X.shape[1]
        total = totals.n_total
        sums = local_sum.copy()
        _collective.reduce_in_place([sums], comm=comm, name=f"{name}'s mean")
        mean = sums / total
        # Second pass, centred: per-feature variance, the largest squared norm (an overflow guard)
        # and the weighted total (from which an iteration's inertia follows without another pass).
        stats = np.zeros(d + 1)
        biggest = np.zeros(1)
        unit = weights is None
        biggest[0] = passes.centred_stats(X, mean, NO_WEIGHTS if unit else weights, not unit, stats)
        _collective.reduce_in_place([stats, biggest], ["sum", "max"], comm=comm, name=f"{name}'s variance")
        return cls(
            **Shard.facts(X, weights, totals, comm=comm, name=name),
            mean=mean,
            variance=stats[:d] / total,
            max_sq_norm=float(biggest[0]),
            sq_norm_total=float(stats[d]),
        )


def kmeans_shard(
    X: np.ndarray, weights: np.ndarray | None, local_sum: np.ndarray, *, n_clusters: int, init: Any,
    comm: Any, name: str,
) -> KMeansShard:
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
    return KMeansShard.build(X, weights, local_sum, totals, passes=kernels(total * k), comm=comm, name=name)


def relative_tol(data: KMeansShard, tol: float) -> float:
    """scikit-learn's absolute tolerance on the summed squared centre shift: ``tol`` times the
    mean variance of the features. Local."""
    return float(np.mean(data.variance) * tol) if tol else 0.0
