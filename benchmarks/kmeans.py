"""Per-iteration time of mpinb.KMeans against scikit-learn, and at 2 ranks beside a busy process.

    python benchmarks/kmeans.py                      # the scaling case (a few minutes on 2 cores)
    python benchmarks/kmeans.py --cases busy         # the busy case only (well under a minute)
    python benchmarks/kmeans.py --quick --cases scaling,busy   # smoke run of both (under a minute)

Cases (``--cases``, comma-separated; default ``scaling``), each writing its own JSON to
``--out-dir`` (``benchmarks/results``; a temporary directory with ``--quick``):

- ``scaling`` -> ``kmeans.json``: N=1,000,000 x 16, k=16, float64 and float32, the same fixed
  initial centres, 20 iterations, tol=0. scikit-learn runs in this process with 1 and 2 OpenMP
  threads; mpinb runs under ``mpiexec`` with one BLAS thread per rank. Runs are interleaved
  (sklearn-1, mpinb-1, sklearn-2, mpinb-2, mpinb-4) and repeated; the JSON holds medians, the GEMM
  bound (one ``X @ C.T`` per iteration, 1 thread) measured in the same run, the agreement with
  scikit-learn and the memory mpinb adds at k=64.
- ``busy`` -> ``kmeans_busy.json``: the same float64 fit at 2 ranks (one thread each, on a 2-core
  machine), idle and with one extra process spinning a busy loop (``--busy-loop python``: a
  pure-Python loop, or ``numpy``: element-wise passes over 8 MiB). Rank 0 starts that process,
  lets it spin only during the "busy" fits and kills it by PID when the job ends; idle and busy fits
  alternate within one job (rotating order), ``--busy-repeats`` of each. Per-iteration time is the
  slowest rank's wall time of ``fit`` divided by ``n_iter_`` (public attributes only).

- ``first`` -> ``kmeans_first.json``: the first fit in a fresh process, where an interactive user
  starts: scikit-learn's ``KMeans`` against mpinb's, each in its own new Python process (imports
  and data outside the timing; mpinb's MPI start-up inside it, as in a plain script, and also
  outside it, as in an ipyparallel engine where MPI is already up), interleaved,
  ``--first-repeats`` rounds, on small data (6,000 x 5, k=8: the NumPy executor) and on larger
  data (200,000 x 16, k=16: the compiled executor, loaded from numba's disk cache, which a
  warm-up process fills first), and MPI's start alone (importing ``mpi4py.MPI`` and initialising:
  the floor of a first fit that starts MPI). Bytecode is cached, as on a user's machine. Medians and
  ratios to scikit-learn's first fit.

- ``single`` -> ``kmeans_single.json``: 1 rank against scikit-learn's 1 thread only, at N=400,000
  (15 iterations, as issue 23 measured it) and N=1,000,000 (20 iterations), float64 and float32,
  the same fixed initial centres: ``--single-repeats`` interleaved rounds, medians of the fit's wall
  and CPU time divided by ``n_iter_`` (set-up and final pass included) and their ratios.
- ``shapes`` -> ``kmeans_shapes.json``: the three data shapes of :data:`SHAPES` (16 overlapping
  Gaussians, 4 shifted groups, uniform noise) at N=400,000 (15 iterations) and 1,000,000 (20),
  float64 and float32, 1 rank against scikit-learn's 1 thread and 2 ranks against its 2 threads,
  from the same K rows of each data set; ``--single-repeats`` interleaved rounds, medians of the
  fit's wall time divided by ``n_iter_`` and their ratios. ``--numba-targets host,haswell`` runs
  mpinb's passes compiled for each CPU side by side (``haswell``: AVX2 and FMA; ``x86-64``: SSE2),
  each entry naming the target numba compiled for.
- ``kmeanspp`` -> ``kmeans_plusplus.json``: k-means++ seeding of N=2,000,000 x 16, k=16, 1 rank and
  1 thread, against ``sklearn.cluster.kmeans_plusplus`` from the same seed (mpinb's seeding is
  private: the worker calls ``mpinb.kmeans._init.kmeans_plusplus`` on a summarised shard, whose
  summary is outside the timing); interleaved rounds, medians of wall and CPU time, ratios, and
  whether both picked the same rows.

``--quick``: N=100,000, 1 repeat (and 3 busy repeats), to show the script works: about 30 s.
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "benchmarks"))  # _busy, also when run from elsewhere

CASES = ("scaling", "busy", "first", "single", "shapes", "kmeanspp")

D, K, ITERATIONS, SEED, BLOCK = 16, 16, 20, 1234, 1 << 16


# The data shapes of the "shapes" case (issue 37's three): 16 overlapping Gaussian clusters (every
# other case's data), 4 well-separated shifted groups (fewer groups than clusters), uniform noise.
SHAPES = ("gaussians", "groups", "uniform")


def make_rows(lo: int, hi: int, dtype: str, shape: str = "gaussians") -> np.ndarray:
    """Rows [lo, hi) of the benchmark data, generated in fixed blocks so every split of the rows
    over ranks sees the same numbers; ``shape`` one of :data:`SHAPES`."""
    out = np.empty((hi - lo, D), dtype=dtype)
    centres = np.random.default_rng(SEED).normal(scale=3.0, size=(K, D))
    groups = np.random.default_rng(SEED + 2).normal(scale=10.0, size=(4, D))
    for b in range(lo // BLOCK, (hi - 1) // BLOCK + 1 if hi > lo else 0):
        rng = np.random.default_rng([SEED, b])
        start = b * BLOCK
        if shape == "gaussians":
            block = rng.standard_normal((BLOCK, D)) * 2.0 + centres[rng.integers(0, K, BLOCK)]
        elif shape == "groups":
            block = rng.standard_normal((BLOCK, D)) + groups[rng.integers(0, 4, BLOCK)]
        elif shape == "uniform":
            block = rng.uniform(size=(BLOCK, D))
        else:
            raise ValueError(f"shape must be one of {SHAPES}; got {shape!r}")
        s, e = max(lo, start), min(hi, start + BLOCK)
        out[s - lo : e - lo] = block[s - start : e - start]
    return out


def initial_centres(n: int, shape: str = "gaussians") -> np.ndarray:
    idx = np.random.default_rng(SEED + 1).choice(n, K, replace=False)
    return np.stack([make_rows(int(i), int(i) + 1, "float64", shape)[0] for i in idx])


# ----------------------------------------------------------------------------------------------
# Worker: runs under mpiexec


def worker(config: dict) -> None:
    from mpi4py import MPI

    import mpinb

    comm = MPI.COMM_WORLD
    mpinb.limit_threads(1)
    lo, hi = mpinb.shard_bounds(config["n"], rank=comm.rank, size=comm.size)
    X = make_rows(lo, hi, config["dtype"], config.get("shape", "gaussians"))
    init = np.array(config["init"])
    mpinb.KMeans(K, init=init, max_iter=2, tol=0).fit(X)  # warm-up: imports, page faults
    stamps: list[float] = []
    km = mpinb.KMeans(K, init=init, max_iter=config.get("iterations", ITERATIONS), tol=0)
    km._on_iteration = lambda info: stamps.append(time.perf_counter())
    comm.Barrier()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    km.fit(X)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    cpus = comm.gather(cpu, root=0)
    walls = comm.gather(wall, root=0)
    labels = mpinb.gather_rows(km.labels_, root=0)
    if comm.rank == 0:
        loop = (stamps[-1] - stamps[0]) / (len(stamps) - 1)
        np.savez(config["out"], centres=km.cluster_centers_, labels=labels)
        result = {
            "wall_ms_per_iter": 1e3 * max(walls) / km.n_iter_,
            "cpu_ms_per_iter_per_rank": 1e3 * statistics.mean(cpus) / km.n_iter_,
            "loop_wall_ms_per_iter": 1e3 * loop,
            "n_iter": km.n_iter_,
            "inertia": km.inertia_,
            "numba_target": numba_target(),
        }
        Path(config["out"] + ".json").write_text(json.dumps(result))


def memory_worker(config: dict) -> None:
    """Peak memory mpinb adds while fitting N x 16 with k=64 (tracemalloc sees NumPy's buffers)."""
    import tracemalloc

    from mpi4py import MPI

    import mpinb

    X = make_rows(0, config["n"], "float64")
    out = {}
    for init in ("k-means++", "k-means||", "random"):
        mpinb.KMeans(3, init=init, n_init=2, comm=MPI.COMM_SELF).fit(X[:100])  # imports are traced: warm up
    for init in ("array", "k-means++", "k-means||"):
        start = X[:64].copy() if init == "array" else init
        tracemalloc.start()
        mpinb.KMeans(64, init=start, max_iter=10, n_init=1, comm=MPI.COMM_SELF).fit(X)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        out[init] = {"peak_mib": peak / 2**20, "fraction_of_X": peak / X.nbytes}
    Path(config["out"]).write_text(json.dumps(out))


def busy_worker(config: dict) -> None:
    """Idle and busy fits alternating in one job; rank 0 owns the busy process."""
    from _busy import BusyProcess
    from mpi4py import MPI

    import mpinb

    comm = MPI.COMM_WORLD
    mpinb.limit_threads(1)
    lo, hi = mpinb.shard_bounds(config["n"], rank=comm.rank, size=comm.size)
    X = make_rows(lo, hi, "float64")
    init = np.array(config["init"])
    # Warm-up with the timed settings (imports, compiled kernels, page faults of every buffer).
    mpinb.KMeans(K, init=init, max_iter=ITERATIONS, tol=0).fit(X)
    samples = []
    busy = BusyProcess(config["busy_loop"]) if comm.rank == 0 else None
    try:
        for r in range(config["repeats"]):
            for state in (("idle", "busy") if r % 2 == 0 else ("busy", "idle")):
                if busy is not None and state == "busy":
                    busy.spin()
                elif busy is not None:
                    busy.idle()
                comm.Barrier()
                wall0, cpu0 = time.perf_counter(), time.process_time()
                km = mpinb.KMeans(K, init=init, max_iter=ITERATIONS, tol=0).fit(X)
                wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
                wall = comm.allreduce(wall, op=MPI.MAX)
                cpu = comm.allreduce(cpu, op=MPI.SUM) / comm.size
                samples.append({"state": state, "wall_ms_per_iter": 1e3 * wall / km.n_iter_,
                                "cpu_ms_per_iter_per_rank": 1e3 * cpu / km.n_iter_, "n_iter": km.n_iter_,
                                "inertia": km.inertia_})
        share = busy.cpu_share() if busy is not None else None
    finally:
        if busy is not None:
            busy.close()
    if comm.rank == 0:
        Path(config["out"]).write_text(json.dumps({"samples": samples, "busy_process_cpu_share": share,
                                                   "busy_process_pid": busy.pid}))


def plusplus_worker(config: dict) -> None:
    """mpinb's k-means++ seeding at 1 rank, timed alone (the shard's summary is outside)."""
    from mpi4py import MPI

    import mpinb
    from mpinb.kmeans._init import kmeans_plusplus
    from mpinb.kmeans._shard import kmeans_shard

    mpinb.limit_threads(1)
    X = make_rows(0, config["n"], "float64")
    data = kmeans_shard(X, None, X.sum(axis=0), n_clusters=K, init="k-means++", comm=MPI.COMM_SELF,
                        name="KMeans.fit")
    kmeans_plusplus(data, K, np.random.RandomState(config["seed"] + 1), None)  # warm-up: compiled pass, pages
    wall0, cpu0 = time.perf_counter(), time.process_time()
    centres = kmeans_plusplus(data, K, np.random.RandomState(config["seed"]), None) + data.mean
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    np.save(config["out"] + ".npy", centres)
    Path(config["out"] + ".json").write_text(json.dumps({"wall_s": wall, "cpu_s": cpu}))


# ----------------------------------------------------------------------------------------------
# Driver


def _mpi_env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
                MPIR_CVAR_ENABLE_HEAVY_YIELD="1", MPIR_CVAR_POLLS_BEFORE_YIELD="1")


def numba_target() -> str:
    """The CPU numba compiles for in this process: ``NUMBA_CPU_NAME``, else the host's."""
    import numba
    from llvmlite import binding

    return numba.config.CPU_NAME or binding.get_host_cpu_name()


def target_env(target: str, tmp: Path) -> dict:
    """The environment that makes numba compile for ``target`` ("host": this CPU), with a cache of
    its own: ``NUMBA_CPU_NAME`` alone keeps the host's features (AVX-512 included), so the
    features are emptied to the named CPU's."""
    if target == "host":
        return {}
    return {"NUMBA_CPU_NAME": target, "NUMBA_CPU_FEATURES": "", "NUMBA_CACHE_DIR": str(tmp / f"numba-{target}")}


def run_workers(ranks: int, config: dict, tmp: Path, tag: str, env: dict | None = None) -> dict:
    from mpinb.client.launch import run_mpi

    out = str(tmp / tag)
    cfg = dict(config, out=out)
    proc = run_mpi(ranks, [__file__, "--worker", json.dumps(cfg)], timeout=600, env={**_mpi_env(), **(env or {})},
                   capture=True)
    if proc.returncode != 0:
        raise RuntimeError(f"mpinb worker at {ranks} ranks failed:\n{proc.stdout}")
    result = json.loads(Path(out + ".json").read_text())
    saved = np.load(out + ".npz")
    result["centres"], result["labels"] = saved["centres"], saved["labels"]
    return result


def sklearn_fit(X: np.ndarray, init: np.ndarray, threads: int, iterations: int = ITERATIONS) -> dict:
    from sklearn.cluster import KMeans
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=threads):
        wall0, cpu0 = time.perf_counter(), time.process_time()
        km = KMeans(K, init=init.astype(X.dtype), n_init=1, max_iter=iterations, tol=0, algorithm="lloyd").fit(X)
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return {
        "wall_ms_per_iter": 1e3 * wall / km.n_iter_,
        "cpu_ms_per_iter": 1e3 * cpu / km.n_iter_,
        "n_iter": km.n_iter_,
        "inertia": km.inertia_,
        "centres": km.cluster_centers_,
        "labels": km.labels_,
    }


def gemm_bound(X: np.ndarray, init: np.ndarray) -> float:
    from threadpoolctl import threadpool_limits

    C = np.ascontiguousarray(init.T, dtype=X.dtype)
    out = np.empty((X.shape[0], K), dtype=X.dtype)
    times = []
    with threadpool_limits(limits=1):
        for _ in range(3):
            t0 = time.perf_counter()
            np.dot(X, C, out=out)
            times.append(time.perf_counter() - t0)
    return 1e3 * min(times)


def scaling_case(args: argparse.Namespace, out: Path) -> None:
    from mpinb.client.launch import run_mpi

    init = initial_centres(args.n)
    report: dict = {
        "setup": {"n": args.n, "d": D, "k": K, "iterations": ITERATIONS, "tol": 0, "repeats": args.repeats,
                  "cores": len(os.sched_getaffinity(0)), "init": "same fixed centres for every run"},
        "results": {},
    }
    with tempfile.TemporaryDirectory(prefix="mpinb-bench-") as tmpdir:
        tmp = Path(tmpdir)
        for dtype in ("float64", "float32"):
            X = make_rows(0, args.n, dtype)
            config = {"n": args.n, "dtype": dtype, "init": init.tolist()}
            runs: dict[str, list[dict]] = {}
            gemm: list[float] = []
            for r in range(args.repeats):
                print(f"[bench] {dtype} repeat {r + 1}/{args.repeats}", flush=True)
                gemm.append(gemm_bound(X, init))
                runs.setdefault("sklearn-1thread", []).append(sklearn_fit(X, init, 1))
                runs.setdefault("mpinb-1rank", []).append(run_workers(1, config, tmp, f"{dtype}-1-{r}"))
                runs.setdefault("sklearn-2threads", []).append(sklearn_fit(X, init, 2))
                runs.setdefault("mpinb-2ranks", []).append(run_workers(2, config, tmp, f"{dtype}-2-{r}"))
                runs.setdefault("mpinb-4ranks", []).append(run_workers(4, config, tmp, f"{dtype}-4-{r}"))
            reference = runs["sklearn-1thread"][0]
            summary: dict = {"gemm_bound_ms_per_iter_1thread": statistics.median(gemm)}
            for name, results in runs.items():
                entry = {key: statistics.median(res[key] for res in results)
                         for key in results[0] if key.endswith("per_iter") or key.endswith("per_rank")}
                entry["n_iter"] = results[0]["n_iter"]
                if name.startswith("mpinb"):
                    centres, labels = results[0]["centres"], results[0]["labels"]
                    scale = np.abs(reference["centres"]).max()
                    entry["agreement_with_sklearn_1thread"] = {
                        "max_centre_difference_relative": float(np.abs(centres - reference["centres"]).max() / scale),
                        "label_mismatches": int(np.count_nonzero(labels != reference["labels"])),
                        "inertia_relative_difference":
                            abs(results[0]["inertia"] - reference["inertia"]) / reference["inertia"],
                        "same_n_iter": results[0]["n_iter"] == reference["n_iter"],
                    }
                summary[name] = entry
            for ours, theirs in (("mpinb-1rank", "sklearn-1thread"), ("mpinb-2ranks", "sklearn-2threads")):
                summary[f"ratio_{ours}_vs_{theirs}_wall"] = (summary[ours]["wall_ms_per_iter"]
                                                             / summary[theirs]["wall_ms_per_iter"])
            summary["ratio_mpinb-1rank_vs_gemm_bound"] = (summary["mpinb-1rank"]["wall_ms_per_iter"]
                                                          / summary["gemm_bound_ms_per_iter_1thread"])
            report["results"][dtype] = summary
            del X
        print("[bench] memory at k=64", flush=True)
        mem_out = tmp / "memory.json"
        n_mem = args.n
        proc = run_mpi(1, [__file__, "--memory-worker", json.dumps({"n": n_mem, "out": str(mem_out)})],
                       timeout=600, capture=True)
        if proc.returncode == 0:
            report["memory_k64"] = {"n": n_mem, "d": D, "X_mib": n_mem * D * 8 / 2**20,
                                    **json.loads(mem_out.read_text())}
        else:
            report["memory_k64"] = {"error": proc.stdout[-2000:]}
    out.parent.mkdir(parents=True, exist_ok=True)
    write_report(out, report)
    print(json.dumps(report, indent=2))
    print(f"wrote {out}")


def busy_case(args: argparse.Namespace, out: Path) -> None:
    from mpinb.client.launch import run_mpi

    init = initial_centres(args.n)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mpinb-bench-") as tmpdir:
        part = Path(tmpdir) / "busy.json"
        config = {"n": args.n, "init": init.tolist(), "repeats": args.busy_repeats, "busy_loop": args.busy_loop,
                  "out": str(part)}
        print(f"[bench] busy case: 2 ranks, {args.busy_repeats} idle and {args.busy_repeats} busy fits", flush=True)
        proc = run_mpi(2, [__file__, "--busy-worker", json.dumps(config)], timeout=600, env=_mpi_env(), capture=True)
        if proc.returncode != 0:
            raise RuntimeError(f"mpinb busy worker failed:\n{proc.stdout}")
        got = json.loads(part.read_text())
    summary = {}
    for state in ("idle", "busy"):
        rows = [s for s in got["samples"] if s["state"] == state]
        summary[state] = {key: statistics.median(r[key] for r in rows)
                          for key in ("wall_ms_per_iter", "cpu_ms_per_iter_per_rank")}
        summary[state]["fits"] = len(rows)
    report = {
        "setup": {"n": args.n, "d": D, "k": K, "dtype": "float64", "iterations": ITERATIONS, "tol": 0,
                  "ranks": 2, "threads_per_rank": 1, "cores": len(os.sched_getaffinity(0)),
                  "busy_loop": args.busy_loop, "repeats": args.busy_repeats,
                  "mpich_yield": {k: v for k, v in _mpi_env().items() if k.startswith("MPIR_CVAR")},
                  "init": "same fixed centres for every fit"},
        "results": summary,
        "ratio_busy_vs_idle_wall": summary["busy"]["wall_ms_per_iter"] / summary["idle"]["wall_ms_per_iter"],
        "busy_process_cpu_share": got["busy_process_cpu_share"],
        "samples": got["samples"],
        "seconds": round(time.perf_counter() - t0, 1),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    write_report(out, report)
    for state in ("idle", "busy"):
        r = summary[state]
        print(f"2 ranks {state:4s}: {r['wall_ms_per_iter']:8.2f} ms/iteration (median of {r['fits']} fits), "
              f"CPU {r['cpu_ms_per_iter_per_rank']:.2f} ms/iteration/rank")
    share = report["busy_process_cpu_share"]
    print(f"busy / idle = {report['ratio_busy_vs_idle_wall']:.2f}; the busy process got "
          f"{'?' if share is None else f'{share:.0%}'} of a core while spinning")
    print(f"wrote {out}")


# The first-fit case: one fresh process per sample. Timed: the fit alone.
_FIRST_FIT = """
import json, sys, time
import numpy as np
which, n, d, k, mpi_up = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
X = np.random.default_rng(0).normal(size=(n, d))
if which == "mpi":  # the floor of a fit that starts MPI: importing mpi4py's MPI and initialising it
    t = time.perf_counter()
    from mpi4py import MPI
    MPI.COMM_WORLD.Get_rank()
    print(json.dumps({"first_s": time.perf_counter() - t, "second_s": 0.0, "numba_loaded": False}))
    sys.exit()
if which == "sklearn":
    from sklearn.cluster import KMeans
else:
    from mpinb import KMeans  # mpinb.KMeans is a lazy attribute: resolve it (and import scikit-learn) now
    if mpi_up:
        from mpi4py import MPI
        MPI.COMM_WORLD.Get_rank()
make = lambda: KMeans(k, n_init=1, random_state=0)
t = time.perf_counter()
make().fit(X)
first = time.perf_counter() - t
t = time.perf_counter()
make().fit(X)
print(json.dumps({"first_s": first, "second_s": time.perf_counter() - t, "numba_loaded": "numba" in sys.modules}))
"""


def _first_fit_sample(which: str, n: int, d: int, k: int, mpi_up: bool) -> dict:
    import subprocess

    # A user's Python caches its bytecode: without it every module of mpinb's collective layer,
    # imported at the first fit, is compiled again (40 ms here).
    env = {key: value for key, value in os.environ.items() if key not in ("MPINB_NUMBA", "PYTHONDONTWRITEBYTECODE")}
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", _FIRST_FIT, which, str(n), str(d), str(k), "1" if mpi_up else "0"],
                          capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"first-fit sample failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def first_case(args: argparse.Namespace, out: Path) -> None:
    sizes = {"small": (6_000, 5, 8), "large": (200_000, 16, 16)}
    variants = (("sklearn", False), ("mpinb", False), ("mpinb", True), ("mpi", False))
    report: dict = {"setup": {"sizes": {name: dict(zip(("n", "d", "k"), v, strict=True)) for name, v in sizes.items()},
                              "repeats": args.first_repeats, "threads": 1, "n_init": 1,
                              "cores": len(os.sched_getaffinity(0))},
                    "results": {}}
    for name, (n, d, k) in sizes.items():
        _first_fit_sample("mpinb", n, d, k, True)  # warm-up: fills numba's disk cache if it is empty
        samples: dict[str, list[dict]] = {}
        for r in range(args.first_repeats):
            print(f"[bench] first fit, {name}, round {r + 1}/{args.first_repeats}", flush=True)
            for which, mpi_up in variants:
                started = "MPI already up" if mpi_up else "MPI started in fit"
                label = {"sklearn": "sklearn", "mpi": "MPI start alone (import and init)"}.get(
                    which, f"mpinb ({started})")
                samples.setdefault(label, []).append(_first_fit_sample(which, n, d, k, mpi_up))
        summary: dict = {}
        for label, rows in samples.items():
            summary[label] = {"first_fit_s": statistics.median(r["first_s"] for r in rows),
                              "second_fit_s": statistics.median(r["second_s"] for r in rows),
                              "numba_loaded": rows[0]["numba_loaded"]}
        base = summary["sklearn"]["first_fit_s"]
        for label in summary:
            summary[label]["first_fit_vs_sklearn_first_fit"] = summary[label]["first_fit_s"] / base
        report["results"][name] = summary
        for label, entry in summary.items():
            print(f"{name:5s} {label:30s} first {entry['first_fit_s'] * 1e3:7.1f} ms "
                  f"({entry['first_fit_vs_sklearn_first_fit']:.2f}x scikit-learn's), second "
                  f"{entry['second_fit_s'] * 1e3:7.1f} ms, numba loaded: {entry['numba_loaded']}")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_report(out, report)
    print(f"wrote {out}")


def _median_entry(results: list[dict]) -> dict:
    return {key: statistics.median(r[key] for r in results) for key in results[0] if isinstance(results[0][key], float)}


def single_case(args: argparse.Namespace, out: Path) -> None:
    """1 rank against scikit-learn's 1 thread at 400k and 1M rows, both dtypes, interleaved."""
    sizes = ((100_000, 15),) if args.quick else ((400_000, 15), (1_000_000, ITERATIONS))
    report: dict = {"setup": {"sizes": [{"n": n, "iterations": it} for n, it in sizes], "d": D, "k": K, "tol": 0,
                              "repeats": args.single_repeats, "threads": 1, "ranks": 1,
                              "cores": len(os.sched_getaffinity(0)), "init": "same fixed centres for every run",
                              "timed": "fit wall and CPU time / n_iter_ (set-up and final pass included)"},
                    "results": {}}
    with tempfile.TemporaryDirectory(prefix="mpinb-bench-") as tmpdir:
        tmp = Path(tmpdir)
        for n, iterations in sizes:
            init = initial_centres(n)
            for dtype in ("float64", "float32"):
                X = make_rows(0, n, dtype)
                config = {"n": n, "dtype": dtype, "init": init.tolist(), "iterations": iterations}
                sk, ours = [], []
                for r in range(args.single_repeats):
                    print(f"[bench] single {n:,} {dtype} round {r + 1}/{args.single_repeats}", flush=True)
                    # Alternate which runs first, so neither always follows the other.
                    def theirs(X: np.ndarray = X, init: np.ndarray = init, iterations: int = iterations,
                               sk: list = sk) -> None:
                        sk.append(sklearn_fit(X, init, 1, iterations))

                    def mine(config: dict = config, label: str = f"single-{n}-{dtype}-{r}", ours: list = ours) -> None:
                        ours.append(run_workers(1, config, tmp, label))

                    pair = [theirs, mine]
                    for run in pair if r % 2 == 0 else pair[::-1]:
                        run()
                entry = {"sklearn-1thread": _median_entry(sk), "mpinb-1rank": _median_entry(ours),
                         "n_iter": ours[0]["n_iter"], "same_n_iter": ours[0]["n_iter"] == sk[0]["n_iter"],
                         "label_mismatches": int(np.count_nonzero(ours[0]["labels"] != sk[0]["labels"])),
                         "ratios_wall_per_round": [o["wall_ms_per_iter"] / t["wall_ms_per_iter"]
                                                   for o, t in zip(ours, sk, strict=True)]}
                entry["ratio_wall"] = (entry["mpinb-1rank"]["wall_ms_per_iter"]
                                       / entry["sklearn-1thread"]["wall_ms_per_iter"])
                entry["ratio_cpu"] = (entry["mpinb-1rank"]["cpu_ms_per_iter_per_rank"]
                                      / entry["sklearn-1thread"]["cpu_ms_per_iter"])
                report["results"][f"{n}-{dtype}"] = entry
                print(f"{n:>9,} {dtype}: wall {entry['ratio_wall']:.3f}x, CPU {entry['ratio_cpu']:.3f}x scikit-learn's "
                      f"per iteration", flush=True)
                del X
    out.parent.mkdir(parents=True, exist_ok=True)
    write_report(out, report)
    print(f"wrote {out}")


def shapes_case(args: argparse.Namespace, out: Path) -> None:
    """Each data shape at 400k and 1M rows, both dtypes: 1 rank vs 1 thread and 2 ranks vs 2 threads."""
    sizes = ((100_000, 15),) if args.quick else ((400_000, 15), (1_000_000, ITERATIONS))
    layouts = (1,) if args.quick else (1, 2)
    targets = args.numba_targets.split(",")
    report: dict = {"setup": {"shapes": list(SHAPES), "sizes": [{"n": n, "iterations": it} for n, it in sizes],
                              "numba_targets": targets,
                              "d": D, "k": K, "tol": 0, "repeats": args.single_repeats,
                              "layouts": [f"{p} rank(s) vs {p} thread(s)" for p in layouts],
                              "init": "the same K rows of each data set for both",
                              "timed": "fit wall time / n_iter_ (set-up and final pass included), slowest rank"},
                    "results": []}
    with tempfile.TemporaryDirectory(prefix="mpinb-bench-") as tmpdir:
        tmp = Path(tmpdir)
        for n, iterations in sizes:
            for shape in SHAPES:
                init = initial_centres(n, shape)
                for dtype in ("float64", "float32"):
                    X = make_rows(0, n, dtype, shape)
                    config = {"n": n, "dtype": dtype, "shape": shape, "init": init.tolist(), "iterations": iterations}
                    for p in layouts:
                        # scikit-learn, then mpinb compiled for each target, interleaved per round.
                        sk: list = []
                        ours: dict[str, list] = {target: [] for target in targets}
                        envs = {target: target_env(target, tmp) for target in targets}
                        for r in range(args.single_repeats):
                            def theirs(X: np.ndarray = X, init: np.ndarray = init, p: int = p,
                                       iterations: int = iterations, sk: list = sk) -> None:
                                sk.append(sklearn_fit(X, init, p, iterations))

                            runs = [theirs]
                            for target in targets:
                                def mine(config: dict = config, p: int = p, into: list = ours[target],
                                         env: dict = envs[target],
                                         label: str = f"shapes-{n}-{shape}-{dtype}-{p}-{r}-{target}") -> None:
                                    into.append(run_workers(p, config, tmp, label, env))

                                runs.append(mine)
                            for run in runs if r % 2 == 0 else runs[::-1]:
                                run()
                        theirs_ms = statistics.median(t["wall_ms_per_iter"] for t in sk)
                        for done in ours.values():
                            ours_ms = statistics.median(o["wall_ms_per_iter"] for o in done)
                            entry = {"n": n, "shape": shape, "dtype": dtype, "ranks_or_threads": p,
                                     "numba_target": done[0]["numba_target"],
                                     "sklearn_ms_per_iter": theirs_ms, "mpinb_ms_per_iter": ours_ms,
                                     "ratio": ours_ms / theirs_ms, "n_iter": done[0]["n_iter"],
                                     "same_n_iter": done[0]["n_iter"] == sk[0]["n_iter"],
                                     "label_mismatches": int(np.count_nonzero(done[0]["labels"] != sk[0]["labels"]))}
                            report["results"].append(entry)
                            print(f"{n:>9,} {shape:>9} {dtype} {p} {entry['numba_target']:>14}: {ours_ms:6.2f} vs "
                                  f"{theirs_ms:6.2f} ms/iter, {entry['ratio']:.2f}x scikit-learn's", flush=True)
                    del X
    report["summary"] = {"target": "<= 0.5 everywhere"}
    for target in {e["numba_target"] for e in report["results"]}:
        ratios = [e["ratio"] for e in report["results"] if e["numba_target"] == target]
        report["summary"][target] = {"worst_ratio": max(ratios), "best_ratio": min(ratios),
                                     "median_ratio": statistics.median(ratios)}
    write_report(out, report)
    print(f"wrote {out}")


def kmeanspp_case(args: argparse.Namespace, out: Path) -> None:
    """k-means++ seeding, mpinb at 1 rank against sklearn.cluster.kmeans_plusplus, interleaved."""
    from sklearn.cluster import kmeans_plusplus
    from threadpoolctl import threadpool_limits

    from mpinb.client.launch import run_mpi

    n = 200_000 if args.quick else 2_000_000
    X = make_rows(0, n, "float64")
    sk, ours, same = [], [], []
    with tempfile.TemporaryDirectory(prefix="mpinb-bench-") as tmpdir:
        for r in range(args.single_repeats):
            print(f"[bench] k-means++ round {r + 1}/{args.single_repeats}", flush=True)
            seed = SEED + r
            cfg = {"n": n, "seed": seed, "out": str(Path(tmpdir) / f"pp-{r}")}

            # Both are called within this round; the defaults bind this round's seed and paths (as in
            # single_case), so neither could see a later round's.
            def theirs(seed: int = seed) -> None:
                with threadpool_limits(limits=1):
                    wall0, cpu0 = time.perf_counter(), time.process_time()
                    centres, _ = kmeans_plusplus(X, K, random_state=np.random.RandomState(seed))
                    sk.append({"wall_s": time.perf_counter() - wall0, "cpu_s": time.process_time() - cpu0,
                               "centres": centres})

            def mine(cfg: dict = cfg) -> None:
                proc = run_mpi(1, [__file__, "--plusplus-worker", json.dumps(cfg)], timeout=600, env=_mpi_env(),
                               capture=True)
                if proc.returncode != 0:
                    raise RuntimeError(f"mpinb k-means++ worker failed:\n{proc.stdout}")
                ours.append(dict(json.loads(Path(cfg["out"] + ".json").read_text()),
                                 centres=np.load(cfg["out"] + ".npy")))

            for run in (theirs, mine) if r % 2 == 0 else (mine, theirs):
                run()
            same.append(bool(np.allclose(ours[-1]["centres"], sk[-1]["centres"], rtol=0,
                                         atol=1e-12 * np.abs(sk[-1]["centres"]).max())))
    report = {
        "setup": {"n": n, "d": D, "k": K, "dtype": "float64", "threads": 1, "ranks": 1, "repeats": args.single_repeats,
                  "cores": len(os.sched_getaffinity(0)), "seeds": [SEED + r for r in range(args.single_repeats)]},
        "sklearn_kmeans_plusplus": _median_entry(sk),
        "mpinb_kmeans_plusplus": _median_entry(ours),
        "same_centres_as_sklearn_every_round": all(same),
        "ratios_wall_per_round": [o["wall_s"] / t["wall_s"] for o, t in zip(ours, sk, strict=True)],
    }
    report["ratio_wall"] = report["mpinb_kmeans_plusplus"]["wall_s"] / report["sklearn_kmeans_plusplus"]["wall_s"]
    report["ratio_cpu"] = report["mpinb_kmeans_plusplus"]["cpu_s"] / report["sklearn_kmeans_plusplus"]["cpu_s"]
    out.parent.mkdir(parents=True, exist_ok=True)
    write_report(out, report)
    print(f"k-means++ {n:,} x {D}, k={K}: wall {report['ratio_wall']:.3f}x, CPU {report['ratio_cpu']:.3f}x "
          f"scikit-learn's; same centres: {report['same_centres_as_sklearn_every_round']}")
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="scaling", help=f"comma-separated, of: {', '.join(CASES)}")
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, help="scaling case: interleaved rounds (default 3; 1 with --quick)")
    parser.add_argument("--busy-repeats", type=int, help="busy case: fits per state (default 11; 3 with --quick)")
    parser.add_argument("--busy-loop", default="python", choices=("python", "numpy"))
    parser.add_argument("--first-repeats", type=int,
                        help="first case: rounds of fresh processes (default 7; 2 with --quick)")
    parser.add_argument("--numba-targets", default="host",
                        help="shapes case: the CPUs numba compiles mpinb's passes for, side by side, e.g. host,haswell "
                             "(AVX2) or x86-64 (SSE2 only); host: this machine's")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--memory-worker", help=argparse.SUPPRESS)
    parser.add_argument("--busy-worker", help=argparse.SUPPRESS)
    parser.add_argument("--plusplus-worker", help=argparse.SUPPRESS)
    parser.add_argument("--single-repeats", type=int,
                        help="single and kmeanspp cases: interleaved rounds (default 5; 1 with --quick)")
    parser.add_argument("--out-dir", help="default benchmarks/results (a temporary directory with --quick)")
    args = parser.parse_args()
    if args.worker:
        return worker(json.loads(args.worker))
    if args.memory_worker:
        return memory_worker(json.loads(args.memory_worker))
    if args.busy_worker:
        return busy_worker(json.loads(args.busy_worker))
    if args.plusplus_worker:
        return plusplus_worker(json.loads(args.plusplus_worker))
    cases = args.cases.split(",")
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        parser.error(f"--cases takes {', '.join(CASES)}; got {', '.join(unknown)}")
    if args.quick:
        args.n = 100_000
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.busy_repeats = args.busy_repeats or (3 if args.quick else 11)
    args.first_repeats = args.first_repeats or (2 if args.quick else 7)
    args.single_repeats = args.single_repeats or (1 if args.quick else 5)
    out_dir = Path(args.out_dir) if args.out_dir else (
        Path(tempfile.gettempdir()) / "mpinb-bench-quick" if args.quick else ROOT / "benchmarks" / "results")
    if "scaling" in cases:
        scaling_case(args, out_dir / "kmeans.json")
    if "busy" in cases:
        busy_case(args, out_dir / "kmeans_busy.json")
    if "first" in cases:
        first_case(args, out_dir / "kmeans_first.json")
    if "single" in cases:
        single_case(args, out_dir / "kmeans_single.json")
    if "shapes" in cases:
        shapes_case(args, out_dir / "kmeans_shapes.json")
    if "kmeanspp" in cases:
        kmeanspp_case(args, out_dir / "kmeans_plusplus.json")


if __name__ == "__main__":
    main()
