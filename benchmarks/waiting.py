"""What waiting in mpinb's collective layer costs: a compute-and-synchronise loop, side by side with MPI.

    python benchmarks/waiting.py            # 2 and 4 ranks, idle and beside a busy process (~1 min)
    python benchmarks/waiting.py --quick    # a smoke run (seconds)

Each rank repeats a fixed piece of work (NumPy matrix products, one BLAS thread) and then waits for
the others, the way a training step or a k-means iteration does. The wait is either mpinb's
(``mpinb._collective.barrier``: polled, with the deadline, notices and SIGINT checked, spinning,
then yielding, then sleeping) or MPICH's own blocking ``MPI_Barrier`` (which spins, yielding only
with ``MPIR_CVAR_ENABLE_HEAVY_YIELD``, set where ranks outnumber cores). The two alternate within
one job, in rounds whose order rotates, idle and with one extra process spinning a busy loop
(``benchmarks/_busy.py``), so drift in the host hits both alike. Reported: the median wall time per
iteration of the slowest rank and the ratio mpinb / MPI per state; JSON to
``benchmarks/results/waiting.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _machine import write_report

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(1, str(ROOT / "benchmarks"))  # _busy


def worker(config: dict) -> None:
    from _busy import BusyProcess
    from mpi4py import MPI

    import mpinb
    from mpinb import _collective

    mpinb.limit_threads(1)
    comm = MPI.COMM_WORLD.Dup()
    mpinb.world()
    a = np.random.default_rng(comm.rank).random((config["matrix"], config["matrix"]))

    def work() -> None:
        for _ in range(config["products"]):
            a @ a

    waits = {"mpinb": lambda: _collective.barrier(name="benchmark"), "mpi": comm.Barrier}
    samples = []
    busy = BusyProcess() if comm.rank == 0 else None
    try:
        for r in range(config["rounds"]):
            for state in ("idle", "busy") if r % 2 == 0 else ("busy", "idle"):
                if busy is not None:
                    busy.spin() if state == "busy" else busy.idle()
                for name in ("mpinb", "mpi") if (r // 2) % 2 == 0 else ("mpi", "mpinb"):
                    wait = waits[name]
                    comm.Barrier()
                    t0, c0 = time.perf_counter(), time.process_time()
                    for _ in range(config["iterations"]):
                        work()
                        wait()
                    wall = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
                    cpu = comm.allreduce(time.process_time() - c0, op=MPI.SUM) / comm.size
                    samples.append(
                        {
                            "state": state,
                            "wait": name,
                            "ms_per_iteration": 1e3 * wall / config["iterations"],
                            "cpu_ms_per_iteration_per_rank": 1e3 * cpu / config["iterations"],
                        }
                    )
        share = busy.cpu_share() if busy is not None else None
    finally:
        if busy is not None:
            busy.close()
    rank = comm.rank
    comm.Free()
    if rank == 0:
        Path(config["out"]).write_text(json.dumps({"samples": samples, "busy_process_cpu_share": share}))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--np", default="2,4", help="world sizes (default 2,4)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--out", help="default benchmarks/results/waiting.json (a temporary file with --quick)"
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(json.loads(args.worker))
    from mpinb.client.launch import find_mpiexec, mpi_env

    out = (
        Path(args.out)
        if args.out
        else (
            Path(tempfile.gettempdir()) / "mpinb-bench-quick" / "waiting.json"
            if args.quick
            else ROOT / "benchmarks" / "results" / "waiting.json"
        )
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    config = {
        "matrix": 300,
        "products": 12,
        "iterations": 10 if args.quick else 40,
        "rounds": 2 if args.quick else 8,
    }
    report = {"benchmark": "waiting", "settings": config, "sizes": {}}
    for n in (int(s) for s in args.np.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            part = Path(tmp) / "out.json"
            cmd = [
                find_mpiexec(),
                "-n",
                str(n),
                sys.executable,
                __file__,
                "--worker",
                json.dumps({**config, "out": str(part)}),
            ]
            subprocess.run(cmd, check=True, env=mpi_env(n, threads_per_rank=1, base=dict(os.environ)))
            data = json.loads(part.read_text())
        table = {}
        for state in ("idle", "busy"):
            medians = {
                w: statistics.median(
                    s["ms_per_iteration"] for s in data["samples"] if s["state"] == state and s["wait"] == w
                )
                for w in ("mpinb", "mpi")
            }
            cpu = {
                w: statistics.median(
                    s["cpu_ms_per_iteration_per_rank"]
                    for s in data["samples"]
                    if s["state"] == state and s["wait"] == w
                )
                for w in ("mpinb", "mpi")
            }
            table[state] = {
                "ms_per_iteration": medians,
                "cpu_ms_per_iteration_per_rank": cpu,
                "ratio_mpinb_vs_mpi": medians["mpinb"] / medians["mpi"],
            }
            print(
                f"{n} ranks {state}: mpinb {medians['mpinb']:.2f} ms, MPI_Barrier {medians['mpi']:.2f} ms per "
                f"iteration (ratio {table[state]['ratio_mpinb_vs_mpi']:.2f}); CPU per rank {cpu['mpinb']:.2f} "
                f"vs {cpu['mpi']:.2f} ms",
                flush=True,
            )
        report["sizes"][str(n)] = {
            **table,
            "busy_process_cpu_share": data["busy_process_cpu_share"],
            "samples": data["samples"],
        }
    write_report(out, report, indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
