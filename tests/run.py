#!/usr/bin/env python3
"""Run mpinb's whole test suite: ``python3 tests/run.py``.

Works on a fresh clone with only Python 3.11+: it creates ``.venv`` (MPI from the ``mpich`` wheel,
TensorFlow, JupyterLab, test tools) when missing or stale, then runs the tiers:

- ``unit``       one process, ``pytest tests/unit``, beside the 1-rank MPI tier when both run (each
                 keeps about one core busy);
- ``model``      the collective protocol's model: the real layer over simulated ranks, MPI and clock,
                 driven through every ordering (exhaustive at 2-3 ranks, seeded walks at 4-16) with
                 faults injected, and seeded protocol bugs it must catch; ends with one line
                 ``model: N schedules, 0 violations, M of M mutants caught`` (100,000 schedules
                 alone, 20,000 in a whole-suite run);
- ``mpi``        ``mpiexec -n N python -m mpi4py -m pytest tests/mpi`` for N in 1, 2, 3, 4, each under a
                 hard timeout (an exception on one rank aborts the job instead of hanging it);
- ``cluster``    real ipyparallel clusters of MPI engines: start, connect, restart, interrupts,
                 dead engines, a short soak;
- ``multihost``  MPI across 2-3 simulated hosts (network + UTS namespaces on a private bridge,
                 reached through a launcher wrapper, MPI over TCP): KMeans and Keras against one
                 host, an MPICluster gathering from every host, per-host thread budgets,
                 ``mpinb info --hosts``; needs root, and skips in one line without it;
- ``slurm``      a real Slurm (munged, slurmctld, a slurmd on each of 3 simulated hosts): MPICluster
                 through sbatch and through srun inside an allocation, KMeans and Keras in a batch
                 step against one process, owner killed, a node lost mid-cell, ``mpinb info --slurm``;
                 needs root and Debian's Slurm packages, and skips in one line without them; it runs
                 beside the multihost tier;
- ``notebooks``  the tutorial notebooks executed on real clusters, with assertions on their values;
- ``browser``    a tutorial notebook run to the end in JupyterLab in headless Chromium;
- ``docs``       ``sphinx-build -W --keep-going -n`` of ``docs/`` (no warning, every reference resolved,
                 notebooks not executed), then the index, an API page and a tutorial opened in Chromium;
                 it runs beside the browser tier.

Afterwards it checks that no process started by the tests is still running, and prints one closing
line ``N passed, N failed, N skipped``. Options: ``--tier NAME`` (repeatable), ``-k EXPR``, ``--np 2,4``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
TIERS = ("unit", "model", "mpi", "cluster", "multihost", "slurm", "notebooks", "browser", "docs")
MPI_SIZES = (1, 2, 3, 4)
SUITE_SCHEDULES = 20_000  # the model tier's schedules in a whole-suite run (see main)
# Hard limits: a hung collective ends the run instead of eating CI's budget (each test also has its
# own PER_TEST_TIMEOUT). The 4-rank MPI tier takes about 470 s on an idle 2-core machine and the
# cluster tier about 470 s, so 600 s left no room for a slower CI host: they get 900 s.
TIER_TIMEOUT = {"unit": 600, "model": 600, "mpi": 900, "cluster": 900, "multihost": 300, "slurm": 300, "notebooks": 900,
                "browser": 300, "docs": 300}
PER_TEST_TIMEOUT = 180
# How many of the slowest tests each tier reports (MPINB_TEST_DURATIONS=0: all of them).
DURATIONS = f"--durations={os.environ.get('MPINB_TEST_DURATIONS', '12')}"


def venv_python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def ensure_venv() -> None:
    """Create or refresh .venv so the suite runs the same on a fresh machine as here."""
    stamp = VENV / ".mpinb-install-stamp"
    want = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if stamp.exists() and stamp.read_text() == want and venv_python().exists():
        return
    if not venv_python().exists():
        print(f"[run.py] creating {VENV}", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    print("[run.py] installing mpinb[all] into .venv (first run takes a few minutes)", flush=True)
    pip = [str(venv_python()), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, "-e", f"{ROOT}[all]"], check=True, cwd=ROOT)
    stamp.write_text(want)


def in_venv() -> bool:
    return Path(sys.prefix).resolve() == VENV.resolve()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tier", action="append", choices=TIERS, help="run only these tiers")
    parser.add_argument("-k", dest="keyword", help="pytest -k expression")
    parser.add_argument("--np", default=",".join(map(str, MPI_SIZES)), help="MPI world sizes (default 1,2,3,4)")
    parser.add_argument("--no-install", action="store_true", help="use the current Python as is")
    args = parser.parse_args()

    if not args.no_install and not in_venv():
        ensure_venv()
        os.execv(str(venv_python()), [str(venv_python()), __file__, *sys.argv[1:]])

    run_id = uuid.uuid4().hex
    reports = Path(tempfile.mkdtemp(prefix="mpinb-test-reports-"))
    env = dict(os.environ, MPINB_TEST_RUN_ID=run_id, MPINB_TEST_REPORT_DIR=str(reports), PYTHONUNBUFFERED="1")
    env.setdefault("MPLBACKEND", "Agg")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.setdefault("IPP_NONINTERACTIVE", "1")
    # Put the venv's mpiexec first on PATH for anything the tests start.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    extra = ["-k", args.keyword] if args.keyword else []
    if args.tier is None:
        # The whole suite on CI's two cores has 15 minutes: the model explores a fifth of what
        # ``--tier model`` does alone (100,000 schedules, ~100 s here), every mutant included.
        env.setdefault("MPINB_MODEL_SCHEDULES", str(SUITE_SCHEDULES))

    failures: list[str] = []
    started = time.monotonic()
    tiers, sizes = list(args.tier or TIERS), [int(s) for s in args.np.split(",")]
    # The unit tier and the 1-rank MPI tier each keep about one core busy: on CI's two cores they
    # run side by side (about two minutes saved), the unit tier's output printed when it ends.
    unit_beside = "unit" in tiers and "mpi" in tiers and 1 in sizes
    # Tiers that run beside another, each keeping less than a core busy while the other runs: the
    # slurm tier mostly waits (Slurm schedules its jobs; about 70 % of two cores idle) beside the
    # multihost tier (each builds its own simulated hosts, on a free subnet of its own); the docs
    # tier's Sphinx build is one process, beside the browser tier's JupyterLab (each its own Chromium).
    beside_of = {side: host for side, host in (("slurm", "multihost"), ("docs", "browser"))
                 if side in tiers and host in tiers}
    running: dict[str, Beside] = {}  # host tier -> its side tier, while both run
    for tier in tiers:
        if (tier == "unit" and unit_beside) or tier in beside_of:
            continue
        for side in [side for side, host in beside_of.items() if host == tier]:
            if side in ("multihost", "slurm") and (reason := tier_unavailable(side)):
                print(f"[run.py] tier {side}: skipped, {reason}", flush=True)
                skip = {"name": side, "exitstatus": 5, "passed": 0, "failed": 0, "error": 0, "skipped": 1}
                (reports / f"{side}.json").write_text(json.dumps(skip))
            else:
                running[tier] = Beside(lambda log, side=side: run_tier(side, env, extra, log))
                print(f"\n[run.py] tier {side} started, beside tier {tier}", flush=True)
        tier_dir = ROOT / "tests" / tier
        if not any(tier_dir.glob("test_*.py")):
            print(f"[run.py] tier {tier}: no tests yet", flush=True)
            continue
        if tier in ("multihost", "slurm") and (reason := tier_unavailable(tier)):
            # One line, and one skip in the closing count, instead of a column of skipped tests.
            print(f"[run.py] tier {tier}: skipped, {reason}", flush=True)
            skip = {"name": tier, "exitstatus": 5, "passed": 0, "failed": 0, "error": 0, "skipped": 1}
            (reports / f"{tier}.json").write_text(json.dumps(skip))
            continue
        if tier == "mpi":
            for n in sizes:
                beside = Beside(lambda log: run_tier("unit", env, extra, log)) if unit_beside and n == 1 else None
                t0 = time.monotonic()
                print(f"\n[run.py] tier mpi at {n} rank(s)" + (", beside tier unit" if beside else ""), flush=True)
                code = run_mpi_tier(n, env, extra)
                print(f"[run.py] tier mpi at {n} rank(s): exit {code} in {time.monotonic() - t0:.0f} s", flush=True)
                if code != 0:
                    failures.append(f"mpi -n {n} (exit {code})")
                if beside is not None:
                    failures += finish_beside("unit", "mpi at 1 rank", beside)
        else:
            t0 = time.monotonic()
            print(f"\n[run.py] tier {tier}", flush=True)
            code = run_tier(tier, env, extra)
            print(f"[run.py] tier {tier}: exit {code} in {time.monotonic() - t0:.0f} s", flush=True)
            if code not in (0, 5):
                failures.append(f"{tier} (exit {code})")
        if tier in running:
            side = next(side for side, host in beside_of.items() if host == tier)
            failures += finish_beside(side, tier, running.pop(tier))

    for tier, beside in running.items():  # its host tier was skipped
        failures += finish_beside(next(side for side, host in beside_of.items() if host == tier), tier, beside)
    leftovers = processes_with_marker(run_id)
    if leftovers:
        failures.append(f"{len(leftovers)} process(es) left running by the tests")
        print("[run.py] processes left behind by the tests (killed now):", flush=True)
        for pid, cmd in leftovers:
            print(f"    {pid} {cmd}", flush=True)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    passed, failed, skipped = tally(reports)
    shutil.rmtree(reports, ignore_errors=True)
    failed = max(failed, len(failures)) if failures else failed
    print(f"\n[run.py] {time.monotonic() - started:.0f} s in all"
          + (f"; failed: {', '.join(failures)}" if failures else ""))
    print(f"{passed} passed, {failed} failed, {skipped} skipped", flush=True)
    return 1 if failures or failed else 0


def run_tier(tier: str, env: dict[str, str], extra: list[str], log: Any = None) -> int:
    """One pytest process for a tier that is not ``mpi``."""
    cmd = [sys.executable, "-m", "pytest", str(ROOT / "tests" / tier), "-q", f"--timeout={PER_TEST_TIMEOUT}",
           DURATIONS, *extra]
    return run(cmd, dict(env, MPINB_TEST_TIER=tier), TIER_TIMEOUT[tier], log)


def finish_beside(tier: str, beside: str, run: Beside) -> list[str]:
    """Wait for ``tier``, run beside tier ``beside``; print its output; its failure, if any."""
    code = run.finish()
    print(f"\n[run.py] tier {tier} (beside {beside})\n{run.output}", end="", flush=True)
    print(f"[run.py] tier {tier}: exit {code} in {run.seconds:.0f} s", flush=True)
    return [] if code in (0, 5) else [f"{tier} (exit {code})"]


class Beside:
    """A tier running on a thread beside the next one, its output kept in a file until it ends."""

    def __init__(self, body: Callable[[Any], int]) -> None:
        self._log = tempfile.TemporaryFile("w+")
        self._code = 1
        self._t0 = time.monotonic()
        self.seconds, self.output = 0.0, ""

        def target() -> None:
            self._code = body(self._log)
            self.seconds = time.monotonic() - self._t0

        self._thread = threading.Thread(target=target, daemon=True)
        self._thread.start()

    def finish(self) -> int:
        self._thread.join()
        self._log.seek(0)
        self.output = self._log.read()
        self._log.close()
        return self._code


def run_mpi_tier(n: int, env: dict[str, str], extra: list[str]) -> int:
    from mpinb.client.launch import find_mpiexec, mpi_env

    cmd = [
        find_mpiexec(), "-n", str(n), sys.executable, "-m", "mpi4py", "-m", "pytest", str(ROOT / "tests" / "mpi"),
        "-q", "-x", f"--timeout={PER_TEST_TIMEOUT}", "--timeout-method=thread", DURATIONS, *extra,
    ]
    # One thread per rank, given explicitly: the ranks share this machine's cores, and correctness
    # tests gain nothing from more (the launcher sets no budget by itself: the ranks decide).
    return run(cmd, dict(mpi_env(n, threads_per_rank=1, base=env), MPINB_TEST_TIER="mpi"), TIER_TIMEOUT["mpi"])


def tier_unavailable(tier: str) -> str | None:
    """Why the multihost or slurm tier cannot run here (not root, no namespaces, no Slurm), or None."""
    import importlib

    # tests/ is this script's folder, first on the path: the support package is importable as is.
    module = {"multihost": "netsim", "slurm": "slurmsim"}[tier]
    return importlib.import_module(f"support.{module}").unavailable_reason()


def run(cmd: list[str], env: dict[str, str], timeout: float, log: Any = None) -> int:
    """Run in a new session (output to ``log`` if given); on timeout kill the whole group so no rank survives."""
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, start_new_session=True, stdout=log,
                            stderr=None if log is None else subprocess.STDOUT)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"[run.py] TIMEOUT after {timeout} s: {' '.join(cmd[:8])} ... killed", flush=True)
        return 124
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()


def processes_with_marker(run_id: str) -> list[tuple[int, str]]:
    """Processes whose environment carries this run's id: everything the tests started."""
    found = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            environ = (entry / "environ").read_bytes()
            if f"MPINB_TEST_RUN_ID={run_id}".encode() not in environ.split(b"\0"):
                continue
            stat = (entry / "stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] == "Z":
                continue  # a zombie waiting for its parent (this process) to reap it
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, IndexError):
            continue
        found.append((int(entry.name), cmd))
    return found


def tally(reports: Path) -> tuple[int, int, int]:
    """Sum counts over pytest processes; under MPI, rank 0 speaks for its world (all ranks ran the
    same tests), but a failure on any rank counts."""
    passed = failed = skipped = 0
    for path in sorted(reports.glob("*.json")):
        data = json.loads(path.read_text())
        is_secondary_rank = "-rank" in data["name"] and not data["name"].endswith("-rank0")
        if not is_secondary_rank:
            passed += data["passed"]
            skipped += data["skipped"]
            failed += data["failed"] + data["error"]
        elif data["failed"] + data["error"]:
            failed += data["failed"] + data["error"]
    return passed, failed, skipped


if __name__ == "__main__":
    sys.exit(main())
