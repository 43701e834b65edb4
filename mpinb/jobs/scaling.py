"""Engine-side scaling measurements for ``mpinb bench`` and the scaling tutorial.

Run as ``mpiexec -n N python -m mpinb.jobs.scaling OUT.json [JSON-PARAMS]``. Collective: every rank
measures; rank 0 writes the medians.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any

import numpy as np

import mpinb
from mpinb import _collective


def measure(
    *,
    n_rows: int = 400_000,
    n_features: int = 16,
    n_clusters: int = 16,
    kmeans_iters: int = 10,
    train_rows: int = 16_384,
    global_batch: int = 512,
    epochs: int = 3,
    hidden: int = 256,
    keras: bool = True,
    threads: int = 1,
    comm: Any = None,
) -> dict[str, Any]:
    """Time one k-means iteration and one training step on this world. Collective.

    One thread per rank by default, so N ranks use N cores and speed-ups compare like with like.
    """
    w = mpinb.world(comm)
    threads = mpinb.limit_threads(threads, comm=w.comm)
    from mpinb.data import make_blobs, make_classification

    result: dict[str, Any] = {"ranks": w.size, "threads_per_rank": threads}

    X, _ = make_blobs(n_rows, n_features=n_features, centers=n_clusters, random_state=0, comm=w.comm)
    init = np.random.default_rng(0).normal(size=(n_clusters, n_features))
    timings = []
    for _ in range(3):
        _collective.barrier(comm=w.comm, name="scaling's start line")
        t0 = time.perf_counter()
        km = mpinb.KMeans(n_clusters, init=init, n_init=1, max_iter=kmeans_iters, tol=0.0, comm=w.comm).fit(X)
        timings.append((time.perf_counter() - t0) / max(km.n_iter_, 1))
    # The slowest rank sets the pace of a collective loop.
    (per_iter,) = mpinb.allreduce([statistics.median(timings)], op="max", comm=w.comm)
    result["kmeans"] = {"rows": n_rows, "features": n_features, "clusters": n_clusters,
                        "seconds_per_iteration": float(per_iter), "rows_per_rank": len(X)}

    if keras:
        import keras as K

        from mpinb.keras import fit

        Xc, yc = make_classification(train_rows, n_features=64, n_classes=10, n_informative=8, random_state=0,
                                     comm=w.comm)
        K.utils.set_random_seed(0)
        model = K.Sequential([K.Input((64,)), K.layers.Dense(hidden, activation="relu"),
                              K.layers.Dense(hidden, activation="relu"), K.layers.Dense(10, activation="softmax")])
        model.compile(optimizer=K.optimizers.SGD(0.01, momentum=0.9), loss="sparse_categorical_crossentropy")
        history = fit(model, Xc, yc, batch_size=global_batch, epochs=epochs, seed=0, verbose=0, comm=w.comm)
        steps = history["steps"][-1]
        # Epoch 1 includes tracing the step function: measure the later ones.
        compute = [max(c) / steps for c in history["compute_seconds"][1:]]
        comm_time = [max(c) / steps for c in history["comm_seconds"][1:]]
        # The rank that waited longest for the others: how much of a step the slowest rank costs.
        wait = [max(w) / steps for w in history["wait_seconds"][1:]]
        result["keras"] = {
            "global_batch": global_batch, "steps_per_epoch": steps,
            "seconds_per_step": statistics.median(c + m for c, m in zip(compute, comm_time, strict=True)),
            "compute_per_step": statistics.median(compute),
            "comm_per_step": statistics.median(comm_time),
            "wait_per_step": min(statistics.median(wait), statistics.median(comm_time)),
        }
    return result


if __name__ == "__main__":
    params = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    out = measure(**params)
    if mpinb.world().is_root:
        with open(sys.argv[1], "w") as fh:
            json.dump(out, fh)
