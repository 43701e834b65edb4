"""Distributed k-means: scikit-learn shaped estimators whose ranks each keep their own rows.

Collective: every rank of the communicator fits on its own shard and ends with the same centres.
The pieces behind the estimators are private: :mod:`._estimator` (``KMeans``), :mod:`._minibatch`
(``MiniBatchKMeans``: mini-batches drawn by global row index, one Allreduce each), :mod:`._fitted`
(``predict``, ``transform`` and ``score`` of both), :mod:`._init` (initial centres by global row
index), :mod:`._lloyd` (the iterations, one Allreduce each) and :mod:`._kernels` (the row passes,
in a NumPy and a compiled executor).
"""

from __future__ import annotations

from mpinb.kmeans._estimator import KMeans
from mpinb.kmeans._minibatch import MiniBatchKMeans

__all__ = ["KMeans", "MiniBatchKMeans"]
