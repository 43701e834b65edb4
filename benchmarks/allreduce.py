"""Fused ``mpinb.allreduce`` against per-array ``Allreduce`` and a pre-packed floor, in one run; writes JSON.

    python benchmarks/allreduce.py            # 2 and 4 ranks, 64 KiB-64 MiB (under a minute)
    python benchmarks/allreduce.py --quick    # a smoke run: 64 KiB-16 MiB, 3 repetitions (seconds)

For each world size (``--np``, default 2,4) it launches itself under ``mpiexec`` and times 50
float32 arrays of uneven sizes (like a model's layers) totalling 64 KiB, 1 MiB, 16 MiB and 64 MiB:

- ``fused``      ``mpinb.allreduce(arrays)``: the public API, which returns new arrays;
- ``per_array``  50 buffer calls ``comm.Allreduce(a, out)``, each ``out`` a *fresh*
                 ``np.empty_like(a)`` allocated inside the timed region, so both sides deliver new
                 arrays and leave the inputs untouched (what a user replacing ``mpinb.allreduce``
                 with a loop would write);
- ``prepacked``  one ``comm.Allreduce(packed, out)`` of the same total bytes, already packed in one
                 buffer, into a preallocated ``out``: the floor (no packing, no allocation, one call).

Each repetition runs all three, in an order that rotates from one repetition to the next, so drift
in machine load hits every method alike; the time of one call is the slowest rank's, after a
barrier. The JSON holds medians (and the raw times), the ratios fused/per_array and
fused/prepacked, and bus bandwidth ``2 (p - 1) / p * bytes / time`` (the ring-allreduce convention)
beside a memcpy bandwidth measured in the same run: on one node every byte an allreduce moves goes
through memory, so memcpy is the physical ceiling.

Targets (printed as PASS/FAIL, informational; the exit status is 0 either way): fused <= 0.5 x
per_array at 64 KiB and fused <= 1.0 x per_array at 16 MiB, at every world size.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

N_ARRAYS = 50
DTYPE = np.float32
PAYLOADS = [64 << 10, 1 << 20, 16 << 20, 64 << 20]
QUICK_PAYLOADS = [64 << 10, 1 << 20, 16 << 20]
METHODS = ("fused", "per_array", "prepacked")
TARGETS = {64 << 10: 0.5, 16 << 20: 1.0}  # payload -> the most fused/per_array may be
RESULTS = Path(__file__).resolve().parent / "results" / "allreduce.json"


def make_arrays(nbytes: int, seed: int = 0) -> list[np.ndarray]:
    """50 float32 arrays of uneven sizes summing to ``nbytes``; the layout is the same on every
    rank, the values depend on ``seed``."""
    itemsize = np.dtype(DTYPE).itemsize
    weights = np.random.default_rng(12345).uniform(0.2, 1.8, N_ARRAYS)
    counts = np.maximum(1, np.floor(weights / weights.sum() * nbytes / itemsize)).astype(int)
    counts[0] += nbytes // itemsize - counts.sum()
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(c, dtype=DTYPE) for c in counts]


def repeats_for(nbytes: int, quick: bool) -> int:
    if quick:
        return 3
    return 201 if nbytes <= 64 << 10 else 101 if nbytes <= 1 << 20 else 31 if nbytes <= 16 << 20 else 15


def memcpy_bandwidth(nbytes: int = 64 << 20, repeats: int = 7) -> float:
    src = np.ones(nbytes // 8)
    dst = np.empty_like(src)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t)
    return nbytes / statistics.median(times)


# ----------------------------------------------------------------------------------------------
# Worker: runs under mpiexec


def worker(out: str, payloads: list[int], quick: bool) -> None:
    from mpi4py import MPI

    import mpinb

    comm = MPI.COMM_WORLD
    rank, p = comm.Get_rank(), comm.Get_size()
    results = []
    for nbytes in payloads:
        arrays = make_arrays(nbytes, seed=rank)
        packed = np.concatenate(arrays)
        packed_out = np.empty_like(packed)

        def per_array(arrays: list[np.ndarray] = arrays) -> list[np.ndarray]:
            outs = []
            for a in arrays:
                o = np.empty_like(a)
                comm.Allreduce(a, o, op=MPI.SUM)
                outs.append(o)
            return outs

        runs = {
            "fused": lambda arrays=arrays: mpinb.allreduce(arrays, comm=comm),
            "per_array": per_array,
            "prepacked": lambda packed=packed, out=packed_out: comm.Allreduce(packed, out, op=MPI.SUM),
        }
        for name in METHODS:  # warm-up: scratch buffers, shared-memory segments
            runs[name]()
        repeats = repeats_for(nbytes, quick)
        times: dict[str, list[float]] = {m: [] for m in METHODS}
        for r in range(repeats):
            order = METHODS[r % len(METHODS):] + METHODS[: r % len(METHODS)]
            for name in order:
                comm.Barrier()
                t = time.perf_counter()
                runs[name]()
                times[name].append(comm.allreduce(time.perf_counter() - t, op=MPI.MAX))

        # Correctness: all three give the same sums (bit-identical unless MPI picks a different
        # reduction order for differently sized messages, hence also the largest difference).
        fused, reference = mpinb.allreduce(arrays, comm=comm), per_array()
        runs["prepacked"]()
        flat_fused, flat_ref = np.concatenate(fused), np.concatenate(reference)
        scale = float(np.abs(flat_ref).max()) or 1.0
        med = {m: statistics.median(v) for m, v in times.items()}
        results.append({
            "payload_bytes": nbytes,
            "arrays": N_ARRAYS,
            "dtype": np.dtype(DTYPE).name,
            "smallest_array_bytes": int(min(a.nbytes for a in arrays)),
            "largest_array_bytes": int(max(a.nbytes for a in arrays)),
            "repeats": repeats,
            "median_seconds": med,
            "min_seconds": {m: min(v) for m, v in times.items()},
            "bus_bandwidth_GBps": {m: 2 * (p - 1) / p * nbytes / med[m] / 1e9 for m in METHODS},
            "fused_over_per_array": med["fused"] / med["per_array"],
            "fused_over_prepacked": med["fused"] / med["prepacked"],
            "per_array_over_prepacked": med["per_array"] / med["prepacked"],
            "fused_equals_per_array": bool(np.array_equal(flat_fused, flat_ref)),
            "max_difference_relative": {
                "fused_vs_per_array": float(np.abs(flat_fused - flat_ref).max()) / scale,
                "prepacked_vs_per_array": float(np.abs(packed_out - flat_ref).max()) / scale,
            },
            "seconds": times,
        })
        del arrays, packed, packed_out, fused, reference, flat_fused, flat_ref
    # memcpy measured on rank 0 while the other ranks wait in a barrier.
    bw = memcpy_bandwidth() if rank == 0 else 0.0
    comm.Barrier()
    if rank == 0:
        for row in results:
            row["fused_bus_bandwidth_fraction_of_memcpy"] = row["bus_bandwidth_GBps"]["fused"] * 1e9 / bw
        env = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MPIR_CVAR_ENABLE_HEAVY_YIELD",
                                              "MPIR_CVAR_POLLS_BEFORE_YIELD")}
        Path(out).write_text(json.dumps({"ranks": p, "memcpy_GBps": bw / 1e9, "environment": env,
                                         "mpi_library": MPI.Get_library_version().splitlines()[0],
                                         "results": results}, indent=2))


# ----------------------------------------------------------------------------------------------
# Driver


def check_targets(report: dict) -> list[dict]:
    checks = []
    for run in report["runs"]:
        for row in run["results"]:
            limit = TARGETS.get(row["payload_bytes"])
            if limit is not None:
                ratio = row["fused_over_per_array"]
                checks.append({"ranks": run["ranks"], "payload_bytes": row["payload_bytes"],
                               "fused_over_per_array": ratio, "limit": limit, "pass": ratio <= limit})
    return checks


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", default="2,4", help="world sizes, comma-separated")
    parser.add_argument("--quick", action="store_true", help="smoke run: 64 KiB-16 MiB, 3 repetitions; "
                        "writes to a temporary directory unless --out is given")
    parser.add_argument("--out", help=f"JSON path (default {RESULTS.relative_to(RESULTS.parents[2])})")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    payloads = QUICK_PAYLOADS if args.quick else PAYLOADS
    if args.worker:
        worker(args.worker, payloads, args.quick)
        return
    out = Path(args.out) if args.out else (
        Path(tempfile.gettempdir()) / "mpinb-bench-quick" / "allreduce.json" if args.quick else RESULTS)

    from mpinb.client.launch import run_mpi

    t_start = time.perf_counter()
    report: dict = {"benchmark": "allreduce", "machine": platform.node(), "cpus": len(os.sched_getaffinity(0)),
                    "python": platform.python_version(), "numpy": np.__version__, "quick": args.quick,
                    "per_array_output": "fresh np.empty_like per array, allocated inside the timed region",
                    "prepacked_output": "preallocated", "runs": []}
    for n in (int(s) for s in args.np.split(",")):
        with tempfile.TemporaryDirectory(prefix="mpinb-bench-") as tmp:
            part = Path(tmp) / "part.json"
            argv = [__file__, "--worker", str(part)] + (["--quick"] if args.quick else [])
            proc = run_mpi(n, argv, timeout=120 if args.quick else 600)
            if proc.returncode != 0:
                sys.exit(f"benchmark failed at {n} ranks (exit {proc.returncode})")
            report["runs"].append(json.loads(part.read_text()))
    report["targets"] = check_targets(report)
    report["seconds"] = round(time.perf_counter() - t_start, 1)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))

    for run in report["runs"]:
        print(f"\n{run['ranks']} ranks, memcpy {run['memcpy_GBps']:.2f} GB/s "
              f"(medians of interleaved repetitions; per_array allocates fresh outputs)")
        print(f"{'payload':>8} {'fused ms':>9} {'per-array':>10} {'prepacked':>10} {'f/per-arr':>10} "
              f"{'f/prepack':>10} {'bus GB/s':>9} {'of memcpy':>9} {'reps':>5}")
        for row in run["results"]:
            med = row["median_seconds"]
            print(f"{_size(row['payload_bytes']):>8} {med['fused'] * 1e3:9.3f} {med['per_array'] * 1e3:10.3f} "
                  f"{med['prepacked'] * 1e3:10.3f} {row['fused_over_per_array']:10.2f} "
                  f"{row['fused_over_prepacked']:10.2f} {row['bus_bandwidth_GBps']['fused']:9.2f} "
                  f"{row['fused_bus_bandwidth_fraction_of_memcpy']:9.0%} {row['repeats']:5d}")
    print()
    for t in report["targets"]:
        print(f"{'PASS' if t['pass'] else 'FAIL'}: {t['ranks']} ranks, {_size(t['payload_bytes'])}: "
              f"fused/per-array = {t['fused_over_per_array']:.2f} (target <= {t['limit']:.1f})")
    print(f"\nwrote {out} in {report['seconds']:.0f} s")


if __name__ == "__main__":
    main()
