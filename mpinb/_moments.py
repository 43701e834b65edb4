"""Weighted moments of rows spread over ranks: count, weight, mean and centred second moments --
per feature (a scaler) or the full scatter matrix (PCA) -- from two passes over each rank's rows
and two small Allreduces, and the merge of such summaries (``partial_fit``).

The second moments are taken about the *global* mean, known to every rank after the first
Allreduce, plus the correction term of the corrected two-pass algorithm (Chan, Golub and LeVeque
1983, as scikit-learn's ``_incremental_mean_and_var``): no sum of raw squares, whose cancellation
loses every digit when the mean is large next to the spread.

Private; collective unless a function says local.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mpinb import _collective
from mpinb._chunks import chunk_rows, chunks

__all__ = ["Moments", "add_second", "merge", "moments"]


@dataclass
class Moments:
    """What all ranks' rows sum to (identical on every rank)."""

    n: int  # rows over all ranks
    weight: float  # their total weight (n for unit weights)
    mean: np.ndarray  # weighted mean of each feature
    m2: np.ndarray | None  # sum of w (x - mean)^2 per feature, or the scatter matrix (None: not taken)
    all_float32: bool  # every rank passed float32 rows


def moments(
    X: np.ndarray, weights: np.ndarray | None, local_sum: np.ndarray, *, comm: Any, name: str, what: str,
) -> Moments:
    """The count, total weight and mean of every rank's rows: one Allreduce. ``local_sum`` holds
    this rank's float64 column sums of ``weights * X`` (:func:`mpinb._inputs.finite_sums`);
    ``name`` names the collective, ``what`` (the estimator's method, "StandardScaler.fit") the
    errors: no rows on any rank, or a total weight of 0, raise the same ``ValueError`` on every
    rank (the decision is taken on reduced values)."""
    d = X.shape[1]
    n_local = X.shape[0]
    first = np.empty(3 + d)
    first[:3] = n_local, float(n_local) if weights is None else float(weights.sum()), X.dtype != np.float32
    first[3:] = local_sum
    _collective.reduce_in_place([first], comm=comm, name=f"{name}'s sums")
    n, weight, wide = int(first[0]), float(first[1]), first[2]
    if n == 0:
        raise ValueError(f"{what} got 0 rows on every rank; pass at least one row on some rank.")
    if not weight > 0:
        raise ValueError(
            "sample_weight sums to 0 over all ranks; at least one sample needs a positive weight."
        )
    return Moments(n, weight, first[3:] / weight, None, wide == 0)


def add_second(
    m: Moments, X: np.ndarray, weights: np.ndarray | None, *, outer: bool = False, comm: Any, name: str
) -> Moments:
    """``m`` with its second moments about its mean -- ``sum w (x - mean)^2`` per feature, or the
    (d, d) scatter matrix when ``outer`` -- from a second pass over the rows and one Allreduce."""
    assert m.mean is not None
    m2, correction = _centred(X, weights, m.mean, outer)
    _collective.reduce_in_place([m2, correction], comm=comm, name=f"{name}'s second moments")
    # The correction term: zero in exact arithmetic, it removes the first-order error of the mean.
    m2 -= (np.outer(correction, correction) if outer else correction**2) / m.weight
    if outer:
        m2 = (m2 + m2.T) * 0.5  # exactly symmetric, whatever the summation order of the products
    m.m2 = m2
    return m


def merge(
    n_a: float, mean_a: np.ndarray, m2_a: np.ndarray | None,
    n_b: float, mean_b: np.ndarray, m2_b: np.ndarray | None,
) -> tuple[float, np.ndarray, np.ndarray | None]:
    """Two summaries -- weight, mean, per-feature sum of squared deviations (or ``None``) -- as
    one, by Chan, Golub and LeVeque's pairwise update. Local."""
    n = n_a + n_b
    if n_a == 0:
        return n, mean_b.copy(), None if m2_b is None else m2_b.copy()
    delta = mean_b - mean_a
    mean = mean_a + delta * (n_b / n)
    m2 = None if m2_a is None or m2_b is None else m2_a + m2_b + delta**2 * (n_a * n_b / n)
    return n, mean, m2


def _centred(
    X: np.ndarray, weights: np.ndarray | None, mean: np.ndarray, outer: bool
) -> tuple[np.ndarray, np.ndarray]:
    """This rank's ``sum w (x - mean)^2`` (per feature, or the scatter matrix) and ``sum w (x - mean)``,
    in chunks (the centred copy of a chunk is the only temporary)."""
    d = X.shape[1]
    m2 = np.zeros((d, d) if outer else d)
    correction = np.zeros(d)
    for s, e in chunks(X.shape[0], chunk_rows(d)):
        xc = np.subtract(X[s:e], mean, dtype=np.float64)
        wxc = xc if weights is None else xc * weights[s:e, None]
        correction += wxc.sum(axis=0)
        if outer:
            m2 += wxc.T @ xc
        else:
            m2 += np.einsum("ij,ij->j", wxc, xc)
    return m2, correction
