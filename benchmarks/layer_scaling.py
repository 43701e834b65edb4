"""The collective layer at many ranks: per-operation overhead and recovery, 2 to 32 ranks.

    python benchmarks/layer_scaling.py            # 2, 4, 8, 16, 32 ranks (a few minutes on 2 cores)
    python benchmarks/layer_scaling.py --quick    # 2 and 4 ranks, a smoke run (seconds)

Every size runs under ``mpiexec`` with one thread per rank and MPICH yielding
(``MPIR_CVAR_ENABLE_HEAVY_YIELD=1``, ``MPIR_CVAR_POLLS_BEFORE_YIELD=1``), as ``MPICluster`` starts
ranks that outnumber the cores. NumPy only.

- **Overhead**: a one-element ``mpinb.allreduce`` against ``comm.Allreduce``, and
  ``mpinb._collective.barrier`` against ``comm.Barrier``, alternating in rounds (the order rotates);
  the median over rounds of the slowest rank's time per call, and the ratio mpinb / MPI.
- **Recovery**: rank 0 waits in an allreduce with a 0.2 s deadline; the last rank is late (it sleeps);
  every other rank waits with no deadline. Rank 0 gives up and revokes the generation. Measured:
  how long after rank 0 raised the waiting ranks raise (median and slowest), how long the late
  rank takes to raise once it enters, how long the next allreduce takes once every rank has entered
  it (every rank moves to a fresh communicator in it), and how many revocation notes were sent in
  all and by the busiest rank. Both notice shapes run side by side, trial by trial: ``tree`` (mpinb's)
  and ``flat`` (the origin sends to every rank itself, as before issue 23).

JSON to ``benchmarks/results/layer_scaling.json``.
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
import warnings
from pathlib import Path

import numpy as np
from _machine import write_report

ROOT = Path(__file__).resolve().parent.parent
DEADLINE = 0.2  # rank 0's deadline in the recovery trial
LATE = 0.6  # seconds after rank 0's deadline that the last rank enters


def worker(config: dict) -> None:
    from mpi4py import MPI

    import mpinb
    from mpinb import _collective
    from mpinb._collective import notices

    mpinb.limit_threads(1)
    mpinb.set_collective_timeout(None)
    comm = MPI.COMM_WORLD.Dup()
    rank = comm.rank
    mpinb.world()
    x, y = np.ones(1), np.empty(1)
    ops = {
        "mpinb.allreduce": lambda: mpinb.allreduce([x]),
        "MPI Allreduce": lambda: comm.Allreduce(x, y),
        "mpinb barrier": lambda: _collective.barrier(name="benchmark"),
        "MPI Barrier": comm.Barrier,
    }
    for fn in ops.values():  # set-up and first-call costs out of the way
        fn()
    overhead = {name: [] for name in ops}
    names = list(ops)
    for r in range(config["rounds"]):
        for name in names[r % 2::1] + names[: r % 2]:  # rotate which comes first
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(config["calls"]):
                ops[name]()
            overhead[name].append(comm.allreduce((time.perf_counter() - t0) / config["calls"], op=MPI.MAX))

    trials = {"tree": [], "flat": []}
    warnings.simplefilter("ignore", RuntimeWarning)  # "another rank gave up on ...": expected here
    tree = notices.children
    # "flat": the layer before its tree, the origin sending to every member itself and nobody relaying.
    shapes = {"tree": tree, "flat": lambda rank, group: group[1:] if group and group[0] == rank else []}
    for t in range(config["trials"]):
        for shape in ("tree", "flat") if t % 2 == 0 else ("flat", "tree"):
            notices.children = shapes[shape]
            trials[shape].append(_recovery_trial(comm, mpinb, notices, MPI))
    notices.children = tree
    comm.Free()
    if rank == 0:
        Path(config["out"]).write_text(json.dumps({"overhead": overhead, "trials": trials}))


def _recovery_trial(comm, mpinb, notices, MPI) -> dict:  # noqa: ANN001 - modules passed in
    rank, size = comm.rank, comm.size
    late = size - 1
    comm.Barrier()
    sent0 = notices.sent[notices.REVOKED]
    start = comm.bcast(time.time())
    raised = entered = None
    try:
        if rank == late:
            time.sleep(max(0.0, start + DEADLINE + LATE - time.time()))
            entered = time.time()
        mpinb.allreduce([np.ones(1)], timeout=DEADLINE if rank == 0 else None)
    except (mpinb.CollectiveTimeout, mpinb.CollectiveAbandoned):
        raised = time.time()
    # The next collective: every rank moves to a fresh communicator in it.
    comm.Barrier()
    began = time.time()
    (total,) = mpinb.allreduce([np.ones(1)])
    ended = time.time()
    assert total[0] == size, total
    sent = notices.sent[notices.REVOKED] - sent0
    rows = comm.gather((raised, entered, began, ended, sent))
    if rank != 0:
        return {}
    abandoned = rows[0][0]
    waiting = [rows[r][0] - abandoned for r in range(1, late)]
    return {
        "waiting_raised_s": waiting,
        "late_raised_after_entering_s": rows[late][0] - rows[late][1],
        "next_collective_s": max(r[3] for r in rows) - max(r[2] for r in rows),
        "notes_sent": sum(r[4] for r in rows),
        "notes_sent_by_busiest_rank": max(r[4] for r in rows),
    }


def _summary(trials: list[dict]) -> dict:
    waiting = [w for t in trials for w in t["waiting_raised_s"]]
    slowest = [max(t["waiting_raised_s"]) for t in trials if t["waiting_raised_s"]]
    med = statistics.median
    return {
        "waiting_ranks_raised_after_ms_median": 1e3 * med(waiting) if waiting else None,
        "slowest_waiting_rank_raised_after_ms_median": 1e3 * med(slowest) if slowest else None,
        "late_rank_raised_after_entering_ms_median": 1e3 * med(t["late_raised_after_entering_s"] for t in trials),
        "next_collective_ms_median": 1e3 * med(t["next_collective_s"] for t in trials),
        "notes_per_revocation": med(t["notes_sent"] for t in trials),
        "notes_sent_by_busiest_rank": max(t["notes_sent_by_busiest_rank"] for t in trials),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", default=None, help="world sizes (default 2,4,8,16,32)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", help="default benchmarks/results/layer_scaling.json (a temporary file with --quick)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(json.loads(args.worker))
    from mpinb.client.launch import find_mpiexec

    sizes = [int(s) for s in (args.np or ("2,4" if args.quick else "2,4,8,16,32")).split(",")]
    quick_dir = Path(tempfile.gettempdir()) / "mpinb-bench-quick"
    out = Path(args.out) if args.out else (quick_dir / "layer_scaling.json" if args.quick
                                           else ROOT / "benchmarks" / "results" / "layer_scaling.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    config = {"rounds": 2 if args.quick else 7, "trials": 2 if args.quick else 6}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPIR_CVAR_ENABLE_HEAVY_YIELD": "1",
           "MPIR_CVAR_POLLS_BEFORE_YIELD": "1"}
    report = {"benchmark": "layer_scaling", "cores": len(os.sched_getaffinity(0)), "settings": config,
              "deadline_s": DEADLINE, "late_s": LATE, "sizes": {}}
    for n in sizes:
        # Fewer calls where each takes milliseconds: the rounds stay about a second long.
        calls = max(10, 2000 // n) if not args.quick else 20
        with tempfile.TemporaryDirectory() as tmp:
            part = Path(tmp) / "out.json"
            cmd = [find_mpiexec(), "-n", str(n), sys.executable, "-m", "mpi4py", __file__, "--worker",
                   json.dumps({**config, "calls": calls, "out": str(part)})]
            t0 = time.monotonic()
            subprocess.run(cmd, check=True, env=env, timeout=900)
            data = json.loads(part.read_text())
        over = {k: 1e6 * statistics.median(v) for k, v in data["overhead"].items()}
        entry = {
            "calls_per_round": calls,
            "overhead_us_median": over,
            "ratio_allreduce_mpinb_vs_mpi": over["mpinb.allreduce"] / over["MPI Allreduce"],
            "ratio_barrier_mpinb_vs_mpi": over["mpinb barrier"] / over["MPI Barrier"],
            "recovery": {shape: _summary(t) for shape, t in data["trials"].items()},
            "raw": data,
            "job_s": time.monotonic() - t0,
        }
        report["sizes"][str(n)] = entry
        rec = entry["recovery"]
        print(f"{n:2d} ranks: allreduce {over['mpinb.allreduce']:.0f} vs {over['MPI Allreduce']:.0f} us "
              f"(x{entry['ratio_allreduce_mpinb_vs_mpi']:.2f}); barrier {over['mpinb barrier']:.0f} vs "
              f"{over['MPI Barrier']:.0f} us (x{entry['ratio_barrier_mpinb_vs_mpi']:.2f})", flush=True)
        for shape in ("tree", "flat"):
            r = rec[shape]
            print(f"    {shape}: waiting raise {r['waiting_ranks_raised_after_ms_median']} ms (slowest "
                  f"{r['slowest_waiting_rank_raised_after_ms_median']}), "
                  f"late {r['late_rank_raised_after_entering_ms_median']:.1f} ms, "
                  f"next {r['next_collective_ms_median']:.1f} ms, notes {r['notes_per_revocation']}, busiest "
                  f"{r['notes_sent_by_busiest_rank']}", flush=True)
    write_report(out, report, indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
