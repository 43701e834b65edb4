"""The initial centres of a mini-batch fit: scikit-learn's sample sizes, its ``n_init`` starts
compared on a validation sample, and each start chosen from a sample gathered to every rank.

Private to :mod:`mpinb.kmeans`; collective unless a function says local.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from mpinb import _collective
from mpinb._digest import digest
from mpinb.agreement import check_same, raise_together
from mpinb.kmeans._distances import local_inertia, nearest
from mpinb.kmeans._init import callable_result, initial_centers
from mpinb.kmeans._shard import KMeansShard, kmeans_shard

__all__ = ["best_start", "sample_sizes", "start_from_sample"]


def sample_sizes(params: Any, n: int) -> tuple[int, int]:
    """scikit-learn's effective batch and init sample sizes for ``n`` rows in all. Local."""
    k = params.n_clusters
    batch = min(params.batch_size, n)
    init_size = params.init_size
    if init_size is None:
        init_size = 3 * batch
        if init_size < k:
            init_size = 3 * k
    elif init_size < k:
        warnings.warn(
            f"init_size={init_size} should be larger than n_clusters={k}. Setting it to "
            "min(3*n_clusters, n_samples)",
            RuntimeWarning,
            stacklevel=3,  # the user's call: here <- fit or partial_fit <- user
        )
        init_size = 3 * k
    return batch, min(init_size, n)


def best_start(data: KMeansShard, params: Any, rng: np.random.RandomState, init_size: int) -> np.ndarray:
    """scikit-learn's initialisation of ``fit``: a validation sample, then ``n_init`` starts,
    each from its own ``init_size`` sample, compared by their inertia on the validation sample
    (one Allreduce for all of them; skipped for a single start unless ``verbose`` reports it)."""
    n = data.n_total
    validation = rng.randint(0, n, init_size)
    starts = []
    report = bool(params.verbose) and data.rank == 0  # scikit-learn's verbose lines, on rank 0
    for i in range(params.n_init):
        if report:
            print(f"Init {i + 1}/{params.n_init} with method {params.init}")
        idx = rng.randint(0, n, init_size) if init_size < n else None
        starts.append(start_from_sample(data, idx, params, rng))
    if len(starts) == 1 and not params.verbose:
        return starts[0]
    _, local = data.layout.mine(validation)
    rows = data.X[local]
    w = None if data.weights is None else data.weights[local]
    inertias = np.array([local_inertia(rows, w, c, nearest(rows, c)) for c in starts])
    _collective.reduce_in_place([inertias], comm=data.comm, name=f"{data.name}'s validation inertia")
    for i, inertia in enumerate(inertias if report else ()):
        print(f"Inertia for init {i + 1}/{params.n_init}: {inertia}")
    return starts[int(np.argmin(inertias))]  # the first of equal inertias, as scikit-learn


def start_from_sample(
    data: KMeansShard, idx: np.ndarray | None, params: Any, rng: np.random.RandomState
) -> np.ndarray:
    """Initial centres (float64, raw coordinates) chosen from the global rows ``idx`` (all rows
    when ``None``), which are gathered to every rank; identical on every rank."""
    init, k = params.init, params.n_clusters
    d = data.X.shape[1]
    if isinstance(init, np.ndarray):
        return init.astype(data.out_dtype).astype(np.float64)
    index = np.arange(data.n_total) if idx is None else idx
    name = f"{data.name}'s init sample"
    sample, w = data.layout.rows(data.X, data.weights, index, data.out_dtype, name=name)
    w = w.astype(data.out_dtype)
    # Every rank chooses from the same rows with the same generator; an error on one (memory,
    # a callable that fails) must still be raised on all.
    with raise_together(comm=data.comm):
        if callable(init):
            centers = callable_result(init(sample, k, random_state=rng), k, d).astype(data.out_dtype)
        elif init == "k-means++":
            from sklearn.cluster import kmeans_plusplus

            centers, _ = kmeans_plusplus(sample, k, sample_weight=w, random_state=rng)
        elif init == "random":
            centers = sample[rng.choice(sample.shape[0], size=k, replace=False, p=w / w.sum())]
        else:
            centers = _kmeans_parallel_on(sample, w, k, rng, data.name)
    centers = np.asarray(centers, dtype=np.float64)
    if callable(init):
        check_same((digest(centers), digest(rng)),
                   "what init(X_sample, n_clusters, random_state) returned and left random_state in "
                   "(it gets the same sample and generator on every rank)", comm=data.comm)
    return centers


def _kmeans_parallel_on(sample: np.ndarray, w: np.ndarray, k: int, rng: np.random.RandomState, name: str) -> np.ndarray:
    """mpinb's k-means|| over the sample, on this process alone."""
    from mpi4py import MPI

    sub = kmeans_shard(sample, w.astype(np.float64), sample.sum(axis=0, dtype=np.float64), n_clusters=k,
                       init="k-means||", comm=MPI.COMM_SELF, name=f"{name}'s k-means|| init")
    return initial_centers(sub, "k-means||", k, rng, None) + sub.mean
