"""Soak: many consecutive small fits on one MPI engine cluster; engine memory, descriptors, zombies.

    python benchmarks/soak.py [--fits 200] [--np 2] [--out benchmarks/results/soak.json]

Alternates a distributed ``KMeans.fit`` and a one-epoch ``mpinb.keras.fit`` of the same model (what
a notebook user re-running cells does). Rebuilding a Keras model for every fit is left out on
purpose: TensorFlow itself keeps ~3.7 MB per rebuilt model even after ``clear_session()``, with
plain ``model.fit`` exactly as with ``mpinb.keras.fit`` (measured 637 -> 859 MB vs 631 -> 866 MB over
60 rebuilds at 2 ranks), so it would measure TensorFlow, not mpinb. After a warm-up of 10 fits it records each
engine's resident memory and open file descriptors, then again at the end, plus zombie processes
under the cluster. ``tests/cluster/test_soak.py`` runs a shortened version.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import psutil

import mpinb

SETUP = """
import gc, numpy as np, keras, mpinb, mpinb.keras
from mpinb.data import make_blobs, make_classification
Xk, _ = make_blobs(20_000, n_features=8, centers=6, random_state=0)
Xc, yc = make_classification(2_048, n_features=16, random_state=0)
model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                          keras.layers.Dense(2, activation="softmax")])
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
def one_fit(i):
    if i % 2 == 0:
        return float(mpinb.KMeans(6, random_state=i).fit(Xk).inertia_)
    h = mpinb.keras.fit(model, Xc, yc, batch_size=128, epochs=1, verbose=0)
    gc.collect()
    return h["loss"][-1]
"""


def measure(cluster: mpinb.MPICluster) -> dict[str, list[int]]:
    procs = [psutil.Process(pid) for pid in cluster._engine_pids]
    return {"rss": [p.memory_info().rss for p in procs], "fds": [p.num_fds() for p in procs]}


def zombies(cluster: mpinb.MPICluster) -> int:
    count = 0
    for pid in cluster._tracked_pids():
        try:
            count += psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.Error:
            pass
    return count


def soak(fits: int, n: int, warmup: int = 10) -> dict:
    with mpinb.MPICluster(n=n) as cluster:
        cluster.view.execute(SETUP)
        t0 = time.perf_counter()
        for i in range(warmup):
            cluster.view.execute(f"last = one_fit({i})")
        start = measure(cluster)
        for i in range(warmup, warmup + fits):
            cluster.view.execute(f"last = one_fit({i})")
        end = measure(cluster)
        seconds = time.perf_counter() - t0
        growth = [e / s - 1 for s, e in zip(start["rss"], end["rss"], strict=True)]
        return {
            "fits": fits, "ranks": n, "warmup_fits": warmup, "seconds": seconds,
            "rss_mib_start": [r / 2**20 for r in start["rss"]], "rss_mib_end": [r / 2**20 for r in end["rss"]],
            "rss_growth_fraction": growth, "max_rss_growth_fraction": max(growth),
            "fds_start": start["fds"], "fds_end": end["fds"],
            "fd_growth": max(e - s for s, e in zip(start["fds"], end["fds"], strict=True)),
            "zombies": zombies(cluster),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fits", type=int, default=200)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "soak.json"))
    args = parser.parse_args()
    result = soak(args.fits, args.np)
    # Imported here: tests/cluster/test_soak.py loads this file for soak() without benchmarks/ on the path.
    from _machine import write_report

    write_report(args.out, result)
    print(json.dumps({k: v for k, v in result.items() if not isinstance(v, list)}, indent=1))


if __name__ == "__main__":
    main()
