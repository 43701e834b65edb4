"""Fused ``mpinb.allreduce`` against plain in-place ``Allreduce`` calls, in one run; writes JSON.

    python benchmarks/allreduce.py            # 2 and 4 ranks, 64 KiB-64 MiB (a few minutes)
    python benchmarks/allreduce.py --quick    # a smoke run: 64 KiB-16 MiB, 3 repetitions (seconds)

For each world size (``--np``, default 2,4) it launches itself under ``mpiexec`` and times 50
float32 arrays of uneven sizes (like a model's layers) totalling 64 KiB, 1 MiB, 16 MiB and 64 MiB:

- ``fused``          ``mpinb.allreduce(arrays)``: the public API, returning new arrays (the caller
                     drops them, so mpinb's wire buffers are reused from call to call);
- ``fused_out``      ``mpinb.allreduce(arrays, out=outs)`` into preallocated arrays;
- ``fused_in_place`` ``mpinb.allreduce(arrays, out=arrays)``: the same in-place reduction as
                     ``per_array``, fused (large arrays reduced where they are, small ones packed);
- ``per_array``      50 ``comm.Allreduce(MPI.IN_PLACE, a)`` calls on reused arrays: the fastest
                     thing a user replacing ``mpinb.allreduce`` with a loop could write;
- ``per_array_fresh`` 50 ``comm.Allreduce(a, np.empty_like(a))``: the same loop delivering new
                     arrays, allocated inside the timed region (MPI on fresh memory each call);
- ``plain``          one ``comm.Allreduce(MPI.IN_PLACE, packed)`` of the same total bytes in one
                     reused buffer: the floor (no packing, no allocation, one call);
- ``one_array``      ``mpinb.allreduce([packed], out=[packed])``: mpinb on that one buffer, in place;
- ``two_messages``   the two messages ``one_array`` sends, bare: the arrival (``Iallreduce`` of nine
                     int64) and then the data (``Iallreduce`` in place), each tested to completion
                     (yielding the core between tests where ranks outnumber cores), with no Python
                     around them: the floor of mpinb's protocol, so ``two_messages/plain`` is
                     the least ``one_array/plain`` can be, and ``one_array/two_messages`` is mpinb's own cost;
- ``plain_out``      one ``comm.Allreduce(packed, result)`` into a reused buffer: the floor of any
                     reduction that delivers its result in memory other than its input, as ``fused`` does.

Each repetition runs all of them, in an order that rotates from one repetition to the next, so
drift in machine load hits every method alike; the time of one call is the slowest rank's, after a
barrier. The in-place buffers hold zeros, so repeated sums neither grow nor overflow. The JSON
holds medians (and the raw times), the ratios, and bus bandwidth ``2 (p - 1) / p * bytes / time``
(the ring-allreduce convention) beside a memcpy bandwidth measured in the same run.

Targets (printed as PASS/FAIL, informational; the exit status is 0 either way), at every world
size: fused (and fused_in_place, its like-for-like form) <= 0.5 x per_array at 64 KiB and <= 1.0 x at
every larger size; one_array <= 1.1 x plain.
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

N_ARRAYS = 50
DTYPE = np.float32
PAYLOADS = [64 << 10, 1 << 20, 16 << 20, 64 << 20]
QUICK_PAYLOADS = [64 << 10, 1 << 20, 16 << 20]
METHODS = ("fused", "fused_out", "fused_in_place", "per_array", "per_array_fresh", "plain", "one_array",
           "two_messages", "plain_out")
# (numerator, denominator, limit for a payload): the most the ratio of medians may be.
TARGETS = [("fused", "per_array", lambda nbytes: 0.5 if nbytes <= 64 << 10 else 1.0),
           ("fused_in_place", "per_array", lambda nbytes: 0.5 if nbytes <= 64 << 10 else 1.0),
           ("one_array", "plain", lambda nbytes: 1.1)]
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
    bare = comm.Dup()  # two_messages' own communicator, as mpinb has its own
    rank, p = comm.Get_rank(), comm.Get_size()
    crowded = p > len(os.sched_getaffinity(0))  # more ranks than cores (one host)
    results = []
    for nbytes in payloads:
        arrays = make_arrays(nbytes, seed=rank)
        outs = [np.empty_like(a) for a in arrays]
        zeros = [np.zeros_like(a) for a in arrays]
        zeros_fused = [np.zeros_like(a) for a in arrays]
        packed = np.zeros(sum(a.size for a in arrays), dtype=DTYPE)
        packed_result = np.zeros_like(packed)
        header = np.zeros(9, dtype=np.int64)

        def per_array(zeros: list[np.ndarray] = zeros) -> None:
            for a in zeros:
                comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)

        def per_array_fresh(arrays: list[np.ndarray] = arrays) -> list[np.ndarray]:
            fresh = []
            for a in arrays:
                o = np.empty_like(a)
                comm.Allreduce(a, o, op=MPI.SUM)
                fresh.append(o)
            return fresh

        def two_messages(packed: np.ndarray = packed, header: np.ndarray = header) -> None:
            for buf, op in ((header, MPI.MIN), (packed, MPI.SUM)):
                request = bare.Iallreduce(MPI.IN_PLACE, buf, op=op)
                while not request.Test():
                    if crowded:  # as mpinb does: a rank spinning on a shared core starves the others
                        os.sched_yield()

        runs = {
            "fused": lambda arrays=arrays: mpinb.allreduce(arrays, comm=comm),
            "fused_out": lambda arrays=arrays, outs=outs: mpinb.allreduce(arrays, out=outs, comm=comm),
            "fused_in_place": lambda z=zeros_fused: mpinb.allreduce(z, out=z, comm=comm),
            "per_array": per_array,
            "per_array_fresh": per_array_fresh,
            "plain": lambda packed=packed: comm.Allreduce(MPI.IN_PLACE, packed, op=MPI.SUM),
            "one_array": lambda packed=packed: mpinb.allreduce([packed], out=[packed], comm=comm),
            "two_messages": two_messages,
            "plain_out": lambda packed=packed, result=packed_result: comm.Allreduce(packed, result, op=MPI.SUM),
        }
        for name in METHODS:  # warm-up: wire buffers, shared-memory segments
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

        # Correctness: the fused sums equal the per-array ones (bit-identical unless MPI picks a
        # different reduction order for differently sized messages, hence also the largest difference).
        fused, reference = mpinb.allreduce(arrays, comm=comm), per_array_fresh()
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
            "ratios": {f"{a}/{b}": med[a] / med[b] for a, b in
                       [("fused", "per_array"), ("fused_out", "per_array"), ("fused_in_place", "per_array"),
                        ("fused", "plain"),
                        ("one_array", "plain"), ("per_array_fresh", "per_array"),
                        ("two_messages", "plain"), ("one_array", "two_messages"), ("fused", "plain_out")]},
            "fused_equals_per_array": bool(np.array_equal(flat_fused, flat_ref)),
            "max_difference_relative": float(np.abs(flat_fused - flat_ref).max()) / scale,
            "seconds": times,
        })
        del arrays, outs, zeros, zeros_fused, packed, packed_result, fused, reference, flat_fused, flat_ref
    bare.Free()
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
            for a, b, limit_for in TARGETS:
                ratio, limit = row["median_seconds"][a] / row["median_seconds"][b], limit_for(row["payload_bytes"])
                checks.append({"ranks": run["ranks"], "payload_bytes": row["payload_bytes"], "ratio": f"{a}/{b}",
                               "value": ratio, "limit": limit, "pass": ratio <= limit})
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
    report: dict = {"benchmark": "allreduce", "quick": args.quick, "runs": []}
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
    write_report(out, report)

    for run in report["runs"]:
        print(f"\n{run['ranks']} ranks, memcpy {run['memcpy_GBps']:.2f} GB/s (medians of interleaved repetitions, ms)")
        print(f"{'payload':>8} " + " ".join(f"{m:>15}" for m in METHODS) + f" {'reps':>5}")
        for row in run["results"]:
            med = row["median_seconds"]
            print(f"{_size(row['payload_bytes']):>8} " + " ".join(f"{med[m] * 1e3:15.3f}" for m in METHODS)
                  + f" {row['repeats']:5d}")
    print()
    for t in report["targets"]:
        print(f"{'PASS' if t['pass'] else 'FAIL'}: {t['ranks']} ranks, {_size(t['payload_bytes'])}: "
              f"{t['ratio']} = {t['value']:.2f} (target <= {t['limit']:.1f})")
    print("\nFloors (what no implementation of the same messages can beat):")
    for run in report["runs"]:
        for row in run["results"]:
            med = row["median_seconds"]
            print(f"  {run['ranks']} ranks, {_size(row['payload_bytes']):>6}: two_messages/plain = "
                  f"{med['two_messages'] / med['plain']:.2f}, "
                  f"plain_out/per_array = {med['plain_out'] / med['per_array']:.2f}"
                  f"; mpinb's own cost: one_array/two_messages = {med['one_array'] / med['two_messages']:.2f}, "
                  f"fused/plain_out = {med['fused'] / med['plain_out']:.2f}")
    print(f"\nwrote {out} in {report['seconds']:.0f} s")


if __name__ == "__main__":
    main()
