"""Distributed k-means: scikit-learn shaped estimators whose ranks each keep their own rows.

Collective: every rank of the communicator fits on its own shard and ends with the same centres.
The pieces behind the estimators are private: :mod:`._base` (the parameters both declare and the
fit prologue they share), :mod:`._estimator` (``KMeans``) with :mod:`._lloyd` (its iterations, one
Allreduce each) and :mod:`._init` (initial centres by global row index), :mod:`._minibatch`
(``MiniBatchKMeans``) with :mod:`._batches` (its mini-batches, one Allreduce each),
:mod:`._sampling` (where their rows are) and :mod:`._starts` (its initial centres),
:mod:`._fitted` (``predict``, ``transform`` and ``score`` of both), :mod:`._shard` (a shard checked
and summarised for k-means, on :mod:`mpinb._rows`), :mod:`._distances` (rows to centres) and
:mod:`._kernels` (the row passes, in a NumPy and a compiled executor).
"""

from __future__ import annotations

from mpinb.kmeans._estimator import KMeans
from mpinb.kmeans._minibatch import MiniBatchKMeans

__all__ = ["KMeans", "MiniBatchKMeans"]
