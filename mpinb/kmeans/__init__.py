"""Distributed k-means: scikit-learn shaped estimators whose ranks each keep their own rows.

Collective: every rank of the communicator fits on its own shard and ends with the same centres.
The pieces behind the estimator are private: :mod:`._init` (initial centres by global row index),
:mod:`._lloyd` (the iterations, one Allreduce each) and :mod:`._kernels` (compiled row passes).
"""

from __future__ import annotations

from mpinb.kmeans._estimator import KMeans

__all__ = ["KMeans"]
