"""Test-suite time, before and after a change to the tests: the same MPI test files from two trees.

    python benchmarks/suite_speed.py --before /path/to/other/tree --np 4 [--rounds 1] \
        [--out benchmarks/results/suite_speed.json] tests/mpi/test_keras.py ...

Each round starts both trees' ``mpiexec -n N python -m mpi4py -m pytest FILES`` at the same moment
(the one started first alternating between rounds), so on a shared machine both see the same load:
their ratio means something where the seconds alone drift by 2x within an hour. Each run gets the
tier's environment (one thread per rank, MPICH's yield settings, as ``tests/run.py`` gives it).
Records, per tree and round, the wall time of the whole run and the seconds pytest reports per test
file (setup, call and teardown of its tests, from ``--durations=0``), with the medians over rounds
and the after/before ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from _machine import write_report

ROOT = Path(__file__).resolve().parent.parent
_DURATION = re.compile(r"^\s*([\d.]+)s (?:setup|call|teardown)\s+(\S+?)::")
_SUMMARY = re.compile(r"(\d+) passed")
_SESSION = re.compile(r" in ([\d.]+)s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", help="test files, relative to each tree")
    parser.add_argument("--before", required=True, type=Path, help="the tree to compare with (a git worktree)")
    parser.add_argument("--np", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "suite_speed.json")
    args = parser.parse_args()

    trees = {"before": args.before.resolve(), "after": ROOT}
    runs: dict[str, list[dict]] = defaultdict(list)
    for round_ in range(args.rounds):
        order = list(trees) if round_ % 2 == 0 else list(reversed(trees))
        with tempfile.TemporaryDirectory(prefix="mpinb-suite-speed-") as tmp:
            procs = {}
            for name in order:
                log = open(Path(tmp) / f"{name}.log", "w")
                procs[name] = (start(trees[name], args.np, args.files, log), time.monotonic(), log)
            while procs:  # each run's wall time when it ends, whichever ends first
                for name, (proc, t0, log) in list(procs.items()):
                    if (code := proc.poll()) is None:
                        continue
                    wall = time.monotonic() - t0
                    log.close()
                    del procs[name]
                    text = (Path(tmp) / f"{name}.log").read_text()
                    runs[name].append({"exit": code, "wall_s": round(wall, 1), "files_s": per_file(text),
                                       "pytest_s": float(m.group(1)) if (m := _SESSION.search(text)) else None,
                                       "passed": int(m.group(1)) if (m := _SUMMARY.search(text)) else 0})
                    print(f"round {round_} {name}: exit {code}, {wall:.0f} s", flush=True)
                time.sleep(0.5)

    summary = {}
    for name, rows in runs.items():
        files = sorted({f for r in rows for f in r["files_s"]})
        summary[name] = {"wall_s": statistics.median(r["wall_s"] for r in rows),
                         "files_s": {f: statistics.median(r["files_s"].get(f, 0.0) for r in rows) for f in files}}
    ratio = {"wall": round(summary["after"]["wall_s"] / summary["before"]["wall_s"], 3),
             "files": {f: round(summary["after"]["files_s"][f] / s, 3)
                       for f, s in summary["before"]["files_s"].items() if s and f in summary["after"]["files_s"]}}
    result = {"benchmark": "suite_speed", "np": args.np, "rounds": args.rounds, "files": args.files,
              "cpus": os.cpu_count(), "load_1min_at_end": os.getloadavg()[0], "runs": runs, "median": summary,
              "after_over_before": ratio}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_report(args.out, result, indent=1)
    print(json.dumps({"median": summary, "after_over_before": ratio}, indent=1))
    return 0 if all(r["exit"] == 0 for rows in runs.values() for r in rows) else 1


def start(tree: Path, n: int, files: list[str], log) -> subprocess.Popen:
    sys.path.insert(0, str(ROOT))
    from mpinb.client.launch import find_mpiexec, mpi_env

    env = dict(mpi_env(n, threads_per_rank=1, base=os.environ), PYTHONPATH=str(tree), TF_CPP_MIN_LOG_LEVEL="2",
               MPLBACKEND="Agg", PYTHONUNBUFFERED="1")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    cmd = [find_mpiexec(), "-n", str(n), sys.executable, "-m", "mpi4py", "-m", "pytest", *files, "-q", "-x",
           "--timeout=600", "--timeout-method=thread", "--durations=0", "-p", "no:cacheprovider"]
    return subprocess.Popen(cmd, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT)


def per_file(text: str) -> dict[str, float]:
    seconds: dict[str, float] = defaultdict(float)
    for line in text.splitlines():
        if match := _DURATION.match(line):
            seconds[match.group(2)] += float(match.group(1))
    return {f: round(s, 1) for f, s in sorted(seconds.items())}


if __name__ == "__main__":
    sys.exit(main())
