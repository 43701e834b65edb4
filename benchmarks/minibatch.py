"""mpinb.MiniBatchKMeans beside mpinb.KMeans at 1 and 2 ranks: time and inertia, and agreement
across rank counts.

    python benchmarks/minibatch.py                  # 10,000,000 x 16 at 1 and 2 ranks (about 6 minutes on 2 cores)
    python benchmarks/minibatch.py --quick          # smoke run: 400,000 rows (about 20 s)
    python benchmarks/minibatch.py --batch-sizes 1024,4096   # also other batch sizes

Writes ``minibatch.json`` to ``--out-dir`` (``benchmarks/results``; a temporary directory with
``--quick``).

The data are ``benchmarks/kmeans.py``'s ``make_rows`` (16 overlapping Gaussian clusters in 16
dimensions, float64), generated on each rank for its own rows by global row blocks:
``--rows`` rows in all (10,000,000: 1.28 GB), k=16. At each of ``--ranks`` (1 and 2), one BLAS
thread each, it times full ``mpinb.KMeans`` (k-means++ init, default ``tol``) and
``mpinb.MiniBatchKMeans`` (default parameters; ``--batch-sizes`` adds runs at other global batch
sizes), interleaved (the order alternates by repeat) with ``random_state=r`` for both estimators
in repeat ``r``; the time of a fit is the slowest rank's wall time of ``fit``. Inertias are the
exact ``inertia_`` of both (MiniBatchKMeans's from ``compute_labels``). Because this data has local
minima that the seed decides for both estimators, each MiniBatchKMeans fit is also followed
(untimed) by a KMeans fit started from its centres: the ratio of the two inertias is the
mini-batch approximation alone, apart from which basin the seed led to.

The JSON also records how far the default MiniBatchKMeans fit of repeat 0 at the first rank count
is from the one at the last (centres, inertia, ``n_steps_``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _machine import write_report

# The same data as kmeans.py. This runs as a script (mpiexec's workers too), so its own folder,
# benchmarks/, is first on sys.path already.
from kmeans import K, make_rows

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # mpinb from this checkout (kmeans.py does the same)

DTYPE = "float64"


# ----------------------------------------------------------------------------------------------
# Worker: runs under mpiexec


def worker(config: dict) -> None:
    from mpi4py import MPI

    import mpinb

    comm = MPI.COMM_WORLD
    mpinb.limit_threads(1)
    lo, hi = mpinb.shard_bounds(config["n"], rank=comm.rank, size=comm.size)
    t0 = time.perf_counter()
    X = make_rows(lo, hi, DTYPE)
    generate = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
    # Warm-up: imports, compiled kernels (both executors' sizes), page faults of the shard.
    mpinb.KMeans(K, random_state=0, max_iter=2).fit(X)
    mpinb.MiniBatchKMeans(K, random_state=0, max_iter=1, max_no_improvement=1).fit(X[: 100_000])
    samples = []
    for fit in config["fits"]:
        if fit["estimator"] == "kmeans":
            est = mpinb.KMeans(K, random_state=fit["seed"])
        else:
            est = mpinb.MiniBatchKMeans(K, random_state=fit["seed"], **fit["params"])
        comm.Barrier()
        wall0, cpu0 = time.perf_counter(), time.process_time()
        est.fit(X)
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        wall = comm.allreduce(wall, op=MPI.MAX)
        cpu = comm.allreduce(cpu, op=MPI.SUM) / comm.size
        sample = dict(fit, wall_s=wall, cpu_s_per_rank=cpu, inertia=est.inertia_,
                      centres=est.cluster_centers_.tolist())
        if fit["estimator"] == "kmeans":
            sample["n_iter"] = est.n_iter_
        else:
            sample["n_steps"], sample["n_iter"] = est.n_steps_, est.n_iter_
            if fit.get("polish"):
                polished = mpinb.KMeans(K, init=est.cluster_centers_).fit(X)
                sample["kmeans_from_these_centres"] = {"inertia": polished.inertia_,
                                                       "n_iter": polished.n_iter_}
        samples.append(sample)
        if comm.rank == 0:
            print(f"[bench] {comm.size} rank(s) {fit['estimator']} seed {fit['seed']} "
                  f"{fit.get('params', {})}: {wall:.2f} s, inertia {est.inertia_:.6e}", flush=True)
    if comm.rank == 0:
        Path(config["out"]).write_text(json.dumps({"generate_s": generate, "samples": samples}))


# ----------------------------------------------------------------------------------------------
# Driver


def _mpi_env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
                MPIR_CVAR_ENABLE_HEAVY_YIELD="1", MPIR_CVAR_POLLS_BEFORE_YIELD="1")


def run_workers(ranks: int, config: dict, tmp: Path, tag: str) -> dict:
    from mpinb.client.launch import run_mpi

    out = tmp / f"{tag}.json"
    proc = run_mpi(ranks, [__file__, "--worker", json.dumps(dict(config, out=str(out)))], timeout=3600,
                   env=_mpi_env(), capture=True)
    if proc.returncode != 0:
        raise RuntimeError(f"worker at {ranks} ranks failed:\n{proc.stdout}")
    print(proc.stdout, end="", flush=True)
    return json.loads(out.read_text())


def summarise(samples: list[dict], batch_sizes: list[int]) -> dict:
    kmeans = [s for s in samples if s["estimator"] == "kmeans"]
    by_seed = {s["seed"]: s for s in kmeans}
    out: dict = {"kmeans": {
        "wall_s_median": statistics.median(s["wall_s"] for s in kmeans),
        "cpu_s_per_rank_median": statistics.median(s["cpu_s_per_rank"] for s in kmeans),
        "inertia_median": statistics.median(s["inertia"] for s in kmeans),
        "n_iter": [s["n_iter"] for s in kmeans],
    }}
    for batch in batch_sizes:
        runs = [s for s in samples
                if s["estimator"] == "minibatch" and s["params"].get("batch_size", 1024) == batch]
        ratios = [s["inertia"] / by_seed[s["seed"]]["inertia"] for s in runs]
        entry = {
            "batch_size": batch,
            "default_parameters": batch == 1024,
            "wall_s_median": statistics.median(s["wall_s"] for s in runs),
            "cpu_s_per_rank_median": statistics.median(s["cpu_s_per_rank"] for s in runs),
            "inertia_median": statistics.median(s["inertia"] for s in runs),
            "n_steps": [s["n_steps"] for s in runs],
            "n_iter": [s["n_iter"] for s in runs],
            "inertia_ratio_to_kmeans_same_seed": ratios,
            "inertia_ratio_to_kmeans_same_seed_median": statistics.median(ratios),
            "inertia_ratio_of_medians":
                statistics.median(s["inertia"] for s in runs) / out["kmeans"]["inertia_median"],
            "within_1_percent_same_seed": [r <= 1.01 for r in ratios],
        }
        polished = [s["inertia"] / s["kmeans_from_these_centres"]["inertia"]
                    for s in runs if "kmeans_from_these_centres" in s]
        if polished:
            entry["inertia_ratio_to_kmeans_from_its_own_centres"] = polished
            entry["inertia_ratio_to_kmeans_from_its_own_centres_median"] = statistics.median(polished)
        entry["speedup_wall_vs_kmeans"] = out["kmeans"]["wall_s_median"] / entry["wall_s_median"]
        out[f"minibatch_batch{batch}"] = entry
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000_000, help="rows in all (split over the ranks)")
    parser.add_argument("--ranks", default="1,2", help="rank counts to compare at, comma-separated")
    parser.add_argument("--repeats", type=int, help="interleaved rounds per rank count (default 5; 1 with --quick)")
    parser.add_argument("--batch-sizes", default="1024",
                        help="global MiniBatchKMeans batch sizes (1024 is the default)")
    parser.add_argument("--no-polish", action="store_true",
                        help="skip the untimed KMeans from each mini-batch result")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out-dir", help="default benchmarks/results (a temporary directory with --quick)")
    args = parser.parse_args()
    if args.worker:
        return worker(json.loads(args.worker))
    if args.quick:
        args.rows = 400_000
    repeats = args.repeats or (1 if args.quick else 5)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    out_dir = Path(args.out_dir) if args.out_dir else (
        Path(tempfile.gettempdir()) / "mpinb-bench-quick" if args.quick else ROOT / "benchmarks" / "results")
    rank_counts = [int(r) for r in args.ranks.split(",")]
    n = args.rows
    fits = []
    for r in range(repeats):
        pair = [{"estimator": "kmeans", "seed": r}]
        pair += [{"estimator": "minibatch", "seed": r, "params": {} if b == 1024 else {"batch_size": b},
                  "polish": not args.no_polish} for b in batch_sizes]
        fits += pair if r % 2 == 0 else pair[::-1]
    t0 = time.perf_counter()
    runs: dict[int, dict] = {}
    with tempfile.TemporaryDirectory(prefix="mpinb-bench-") as tmpdir:
        tmp = Path(tmpdir)
        for ranks in rank_counts:
            print(f"[bench] {ranks} rank(s), {n:,} rows in all, {repeats} repeats", flush=True)
            runs[ranks] = run_workers(ranks, {"n": n, "fits": fits}, tmp, f"ranks{ranks}")
    summary = {f"{ranks} rank{'s' if ranks > 1 else ''}": summarise(run["samples"], batch_sizes)
               for ranks, run in runs.items()}

    def default_fit(ranks: int) -> dict:
        return next(s for s in runs[ranks]["samples"]
                    if s["estimator"] == "minibatch" and s["seed"] == 0 and not s["params"])

    lo, hi = default_fit(rank_counts[0]), default_fit(rank_counts[-1])
    a, b = np.array(lo["centres"]), np.array(hi["centres"])
    report = {
        "setup": {"n": n, "ranks": rank_counts, "d": 16, "k": K, "dtype": DTYPE,
                  "threads_per_rank": 1, "cores": len(os.sched_getaffinity(0)), "repeats": repeats,
                  "kmeans": "mpinb.KMeans(16, random_state=r): k-means++, tol=1e-4, max_iter=300",
                  "minibatch": "mpinb.MiniBatchKMeans(16, random_state=r, batch_size=...), other "
                               "parameters default",
                  "time": "slowest rank's wall time of fit, median over repeats; fits interleaved",
                  "data_generation_s": {str(r): run["generate_s"] for r, run in runs.items()}},
        "results": summary,
        "agreement_across_rank_counts": {
            "ranks": [rank_counts[0], rank_counts[-1]],
            "max_centre_difference_relative": float(np.abs(a - b).max() / np.abs(b).max()),
            "inertia_relative_difference": abs(lo["inertia"] - hi["inertia"]) / hi["inertia"],
            "same_n_steps": lo["n_steps"] == hi["n_steps"],
            "n_steps": [lo["n_steps"], hi["n_steps"]],
        },
        "samples": {str(r): [{k: v for k, v in s.items() if k != "centres"} for s in run["samples"]]
                    for r, run in runs.items()},
        "seconds": round(time.perf_counter() - t0, 1),
    }
    out = out_dir / "minibatch.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_report(out, report)
    for label, table in summary.items():
        km = table["kmeans"]
        print(f"{label}: KMeans {km['wall_s_median']:.2f} s (median), inertia {km['inertia_median']:.6e}, "
              f"n_iter {km['n_iter']}")
        for batch in batch_sizes:
            mb = table[f"minibatch_batch{batch}"]
            same_seed = ", ".join(f"{r:.4f}" for r in mb["inertia_ratio_to_kmeans_same_seed"])
            print(f"{label}: MiniBatchKMeans batch {batch}: {mb['wall_s_median']:.2f} s, "
                  f"{mb['speedup_wall_vs_kmeans']:.1f}x faster; inertia / KMeans (same seed) {same_seed}"
                  + (f"; / KMeans from its own centres "
                     f"{', '.join(f'{r:.4f}' for r in mb['inertia_ratio_to_kmeans_from_its_own_centres'])}"
                     if "inertia_ratio_to_kmeans_from_its_own_centres" in mb else ""))
    agree = report["agreement_across_rank_counts"]
    print(f"{agree['ranks'][0]} vs {agree['ranks'][1]} ranks: centres {agree['max_centre_difference_relative']:.2e} "
          f"(relative), inertia {agree['inertia_relative_difference']:.2e}, same n_steps: {agree['same_n_steps']}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
