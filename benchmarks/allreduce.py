"""Fused ``mpinb.allreduce`` vs what naive code does, side by side in one run; writes JSON.

    python benchmarks/allreduce.py [--np 2,4] [--out benchmarks/results/allreduce.json]

For each world size it launches itself under ``mpiexec`` and times, interleaved, on payloads of ~50
float64 arrays from 64 KB to 64 MB:

- ``fused``        ``mpinb.allreduce(arrays)`` (one buffer Allreduce per dtype + a layout check);
- ``pickle``       ``comm.allreduce(a)`` per array (pickled objects, what naive code writes);
- ``buffer``       ``comm.Allreduce(IN_PLACE, a)`` per array.

Bus bandwidth is ``2 (p - 1) / p * bytes / time`` (the ring-allreduce convention), reported beside
a memcpy bandwidth measured in the same run on the same machine: on one node every byte an
allreduce moves goes through memory, so memcpy is the physical ceiling.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

N_ARRAYS = 50
PAYLOADS = [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
METHODS = ("fused", "pickle", "buffer")


def make_arrays(nbytes: int, seed: int = 0) -> list[np.ndarray]:
    """~50 float64 arrays of uneven sizes (like a model's layers) summing to ``nbytes``; the layout
    is the same on every rank, the values depend on ``seed``."""
    weights = np.random.default_rng(12345).uniform(0.2, 1.8, N_ARRAYS)
    rng = np.random.default_rng(seed)
    counts = np.maximum(1, np.floor(weights / weights.sum() * nbytes / 8)).astype(int)
    counts[0] += nbytes // 8 - counts.sum()
    return [rng.standard_normal(c) for c in counts]


def repeats_for(nbytes: int) -> int:
    return 31 if nbytes <= 1 << 20 else 11 if nbytes <= 16 << 20 else 5


def memcpy_bandwidth(nbytes: int = 64 << 20, repeats: int = 7) -> float:
    src = np.ones(nbytes // 8)
    dst = np.empty_like(src)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t)
    return nbytes / statistics.median(times)


def worker(out: str) -> None:
    from mpi4py import MPI

    import mpinb

    comm = MPI.COMM_WORLD
    rank, p = comm.Get_rank(), comm.Get_size()
    results = []
    for nbytes in PAYLOADS:
        arrays = make_arrays(nbytes, seed=rank)
        times: dict[str, list[float]] = {m: [] for m in METHODS}
        runs = {
            "fused": lambda: mpinb.allreduce(arrays, comm=comm),
            "pickle": lambda: [comm.allreduce(a, op=MPI.SUM) for a in arrays],
            "buffer": lambda: [comm.Allreduce(MPI.IN_PLACE, a.copy(), op=MPI.SUM) for a in arrays],
        }
        for name in METHODS:  # warm-up: scratch buffers, connections
            runs[name]()
        for _ in range(repeats_for(nbytes)):
            for name in METHODS:  # interleaved, so drift in machine load hits every method alike
                comm.Barrier()
                t = time.perf_counter()
                runs[name]()
                elapsed = comm.allreduce(time.perf_counter() - t, op=MPI.MAX)
                times[name].append(elapsed)
        # Correctness: the fused result equals the per-array buffer result.
        fused = mpinb.allreduce(arrays, comm=comm)
        check = [a.copy() for a in arrays]
        for a in check:
            comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)
        exact = all(np.array_equal(f, c) for f, c in zip(fused, check))
        med = {m: statistics.median(v) for m, v in times.items()}
        results.append(
            {
                "payload_bytes": nbytes,
                "arrays": N_ARRAYS,
                "median_seconds": med,
                "bus_bandwidth_GBps": {m: 2 * (p - 1) / p * nbytes / med[m] / 1e9 for m in METHODS},
                "speedup_fused_vs_pickle": med["pickle"] / med["fused"],
                "speedup_fused_vs_buffer": med["buffer"] / med["fused"],
                "fused_equals_buffer": exact,
                "repeats": repeats_for(nbytes),
            }
        )
    # memcpy measured on rank 0 while the other ranks wait in a barrier (they yield the core).
    bw = memcpy_bandwidth() if rank == 0 else 0.0
    comm.Barrier()
    if rank == 0:
        for row in results:
            row["fused_bus_bandwidth_fraction_of_memcpy"] = row["bus_bandwidth_GBps"]["fused"] * 1e9 / bw
        Path(out).write_text(json.dumps({"ranks": p, "memcpy_GBps": bw / 1e9, "results": results}, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", default="2,4")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "allreduce.json"))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return

    import tempfile

    from mpinb.launch import run_mpi

    report = {"benchmark": "allreduce", "machine": platform.node(), "python": platform.python_version(), "runs": []}
    for n in (int(s) for s in args.np.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            part = Path(tmp) / "part.json"
            proc = run_mpi(n, [__file__, "--worker", str(part)], timeout=900)
            if proc.returncode != 0:
                sys.exit(f"benchmark failed at {n} ranks (exit {proc.returncode})")
            report["runs"].append(json.loads(part.read_text()))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    for run in report["runs"]:
        print(f"\n{run['ranks']} ranks, memcpy {run['memcpy_GBps']:.2f} GB/s")
        print(f"{'payload':>9} {'fused ms':>9} {'pickle ms':>10} {'buffer ms':>10} {'x pickle':>9} {'x buffer':>9} {'bus GB/s':>9} {'of memcpy':>9}")
        for row in run["results"]:
            med = row["median_seconds"]
            print(
                f"{row['payload_bytes'] / 2**20:8.2f}M {med['fused'] * 1e3:9.3f} {med['pickle'] * 1e3:10.3f} "
                f"{med['buffer'] * 1e3:10.3f} {row['speedup_fused_vs_pickle']:9.2f} {row['speedup_fused_vs_buffer']:9.2f} "
                f"{row['bus_bandwidth_GBps']['fused']:9.2f} {row['fused_bus_bandwidth_fraction_of_memcpy']:9.0%}"
            )
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
