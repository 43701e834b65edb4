"""Distributed k-means: scikit-learn shaped estimators whose ranks each keep their own rows.

Collective: every rank of the communicator fits on its own shard and ends with the same centres.
The pieces behind the estimators are private: :mod:`._init` (initial centres by global row index),
:mod:`._lloyd` (the iterations, one Allreduce each), :mod:`._kernels` (compiled row passes) and
:mod:`._minibatch` (mini-batches drawn by global row index, one Allreduce each).
"""

from __future__ import annotations

from mpinb.kmeans._estimator import KMeans
from mpinb.kmeans._minibatch import MiniBatchKMeans

__all__ = ["KMeans", "MiniBatchKMeans"]
