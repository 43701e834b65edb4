"""The demo's engine-side work, identical under ipyparallel and plain ``mpiexec``.

Run by ``mpinb demo`` (on engines) and ``mpinb demo --batch`` (``mpiexec -n N python -m
mpinb.jobs.demo OUT.pkl EPOCHS``, where rank 0 pickles its result to ``OUT.pkl``). Collective: every
rank calls :func:`run`; rank 0's return value holds everything the client needs to plot.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np

import mpinb


def run(*, n_rows: int = 200_000, n_clusters: int = 5, epochs: int = 12, seed: int = 0,
        comm: Any = None) -> dict[str, Any]:
    """Distributed k-means on synthetic blobs, then sharded Keras training on the digits.

    Collective. Returns a summary on every rank (plot data only on rank 0).
    """
    w = mpinb.world(comm)
    threads = mpinb.limit_threads(comm=w.comm)  # before TensorFlow starts its thread pools
    from mpinb.data import load_digits, make_blobs

    # --- distributed k-means: every rank generates and keeps its own rows ----------------------
    X_local, _ = make_blobs(n_rows, n_features=2, centers=n_clusters, cluster_std=1.0, random_state=seed, comm=w.comm)
    t0 = time.perf_counter()
    km = mpinb.KMeans(n_clusters=n_clusters, random_state=seed, comm=w.comm).fit(X_local)
    kmeans_seconds = time.perf_counter() - t0
    step = max(1, n_rows // 20_000)  # plot a subsample: every step-th global row
    lo, _ = mpinb.shard_bounds(n_rows, rank=w.rank, size=w.size)
    keep = np.arange((-lo) % step, len(X_local), step)
    X_plot = mpinb.gather_rows(X_local[keep], comm=w.comm)
    labels_plot = mpinb.gather_rows(km.labels_[keep], comm=w.comm)

    # --- sharded Keras training on scikit-learn's handwritten digits ---------------------------
    t0 = time.perf_counter()
    import keras

    from mpinb.keras import evaluate as keras_evaluate
    from mpinb.keras import fit as keras_fit

    X_train, X_test, y_train, y_test = load_digits(test_size=0.25, random_state=seed, comm=w.comm)
    X_train, X_test = X_train / 16.0, X_test / 16.0
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [keras.Input((64,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10, activation="softmax")]
    )
    model.compile(optimizer=keras.optimizers.Adam(2e-3), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    # A fixed global batch makes the result independent of the number of ranks (when it divides).
    global_batch = 64 if 64 % w.size == 0 else 16 * w.size
    history = keras_fit(
        model, X_train, y_train, batch_size=global_batch, epochs=epochs, validation_data=(X_test, y_test),
        seed=seed, verbose=0, comm=w.comm,
    )
    scores = keras_evaluate(model, X_test, y_test, comm=w.comm)
    keras_seconds = time.perf_counter() - t0

    summary: dict[str, Any] = {
        "ranks": w.size,
        "threads_per_rank": threads,
        "kmeans": {
            "n_rows": n_rows,
            "n_clusters": n_clusters,
            "inertia": float(km.inertia_),
            "n_iter": int(km.n_iter_),
            "seconds": kmeans_seconds,
            "inertia_history": [float(v) for v in km.inertia_history_],
            "centers": km.cluster_centers_.tolist(),
        },
        "keras": {
            "epochs": epochs,
            "global_batch": global_batch,
            "test_accuracy": float(scores["accuracy"]),
            "test_loss": float(scores["loss"]),
            "seconds": keras_seconds,
            "history": _plain(history),
        },
    }
    if w.is_root:
        summary["plot"] = {"X": X_plot, "labels": labels_plot}
    return summary


def _plain(history: dict[str, Any]) -> dict[str, Any]:
    """JSON-friendly copy of fit's history (arrays to lists)."""
    out = {}
    for key, value in history.items():
        if isinstance(value, np.ndarray):
            out[key] = value.tolist()
        elif isinstance(value, (list, tuple)):
            out[key] = [v.tolist() if isinstance(v, np.ndarray) else v for v in value]
        elif isinstance(value, (int, float, str, dict)) or value is None:
            out[key] = value
    return out


if __name__ == "__main__":
    import pickle

    result = run(**({"epochs": int(sys.argv[2])} if len(sys.argv) > 2 else {}))
    if mpinb.world().is_root:
        with open(sys.argv[1], "wb") as fh:
            pickle.dump(result, fh)
