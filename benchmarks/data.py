"""Memory per rank when each rank loads or generates only its shard (mpinb.data).

    python benchmarks/data.py                     # a 400 MB .npy file at 1, 2 and 4 ranks
    python benchmarks/data.py --mb 100 --np 1,2   # smaller

For each world size it runs ``mpiexec -n N`` and measures on every rank the peak bytes allocated
(``tracemalloc``, which sees NumPy's buffers) and the growth of the resident set (peak ``VmHWM``,
which also counts the file's pages touched through the memory map: page cache, shared by the ranks
of a node and released when the map closes; and ``VmRSS`` afterwards) while ``mpinb.data.load_npy`` reads the file
and while ``mpinb.data.make_blobs`` generates a data set of the same size. Results go to
``benchmarks/results/data.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np
from _machine import write_report

HERE = Path(__file__).resolve().parent
COLS = 50


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=400.0, help="size of the .npy file in MB (10**6 bytes)")
    parser.add_argument("--np", default="1,2,4", help="world sizes")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "data.json")
    parser.add_argument("--worker", nargs=2, metavar=("NPY", "JSON"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(Path(args.worker[0]), Path(args.worker[1]))
        return 0

    from mpinb.client.launch import run_mpi

    rows = int(args.mb * 1e6) // (COLS * 8)
    tmp = Path(tempfile.mkdtemp(prefix="mpinb-bench-data-"))
    try:
        path = tmp / "X.npy"
        # Written in slices through a writable map, so the driver never holds the whole array.
        out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float64, shape=(rows, COLS))
        for lo in range(0, rows, 100_000):
            hi = min(rows, lo + 100_000)
            out[lo:hi] = np.arange(lo, hi, dtype=np.float64)[:, None]
        out.flush()
        del out
        runs = []
        for n in (int(s) for s in args.np.split(",")):
            result = tmp / f"n{n}.json"
            proc = run_mpi(n, [__file__, "--worker", str(path), str(result)], timeout=600)
            if proc.returncode != 0:
                print(f"mpiexec -n {n} failed with exit code {proc.returncode}", file=sys.stderr)
                return 1
            run = json.loads(result.read_text())
            runs.append(run)
            for name in ("load_npy", "make_blobs"):
                peaks = [r["peak_alloc_mb"] for r in run[name]]
                print(f"{name:>10} at {n} rank(s): peak allocated per rank {', '.join(f'{p:.1f}' for p in peaks)} MB "
                      f"of {run['total_mb']:.1f} MB")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report = {
        "benchmark": "mpinb.data memory per rank",
        "file_mb": rows * COLS * 8 / 1e6,
        "shape": [rows, COLS],
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_report(args.out, report)
    print(f"wrote {args.out}")
    return 0


def worker(path: Path, result: Path) -> None:
    from mpi4py import MPI

    import mpinb
    from mpinb import data

    comm = MPI.COMM_WORLD
    rows, cols = np.load(path, mmap_mode="r").shape
    out = {"ranks": comm.Get_size(), "total_mb": rows * cols * 8 / 1e6}
    for name, fn in (
        ("load_npy", lambda: data.load_npy(path, ndim=2, comm=comm)),
        ("make_blobs", lambda: data.make_blobs(rows, cols - 1, 5, comm=comm)),
    ):
        comm.Barrier()
        _reset_hwm()
        hwm0 = _status("VmRSS")
        tracemalloc.start()
        t0 = time.perf_counter()
        value = fn()
        seconds = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        # make_blobs returns (X, y): X has cols - 1 columns and y one int64, so both data sets
        # have rows * cols * 8 bytes in all.
        local = sum(a.nbytes for a in value) if isinstance(value, tuple) else value.nbytes
        stats = {
            "rank": comm.Get_rank(),
            "shard_mb": local / 1e6,
            "peak_alloc_mb": peak / 1e6,
            "rss_peak_growth_mb": (_status("VmHWM") - hwm0) / 1e6,
            "rss_growth_after_mb": (_status("VmRSS") - hwm0) / 1e6,
            "seconds": seconds,
        }
        del value
        out[name] = comm.gather(stats, root=0)
    if comm.Get_rank() == 0:
        result.write_text(json.dumps(out))
    mpinb.world(comm)  # a last collective: no rank exits while another still measures


def _status(field: str) -> int:
    """``VmRSS`` or ``VmHWM`` (peak RSS) of this process, in bytes (Linux); 0 where unknown."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _reset_hwm() -> None:
    # Writing 5 to clear_refs resets the peak RSS (Linux >= 4.0), so each measurement starts fresh.
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


if __name__ == "__main__":
    sys.exit(main())
