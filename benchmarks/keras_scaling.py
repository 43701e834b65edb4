"""Data-parallel Keras throughput: 1 rank × 1 and × 2 threads vs 2 (and 4) ranks, fused vs per-variable.

Run: ``.venv/bin/python benchmarks/keras_scaling.py`` (writes ``benchmarks/results/keras.json``).
(Not named ``keras.py``: run as a script, that name would shadow the ``keras`` package.)

An MLP 784-512-512-10 with momentum SGD on synthetic rows; each rank generates its own shard. For
every world size / thread budget one ``mpiexec`` job builds one model per mode and then runs one
epoch of each mode in turn, ``--repeats`` times (interleaved, so slow drift of a shared machine
hits every mode alike); the figures are medians over those epochs, after one warm-up epoch each.

Modes: ``keras`` (plain ``model.fit``, one process: the baseline), ``fused`` (``mpinb.keras.fit``,
one Allreduce of all gradients per step), ``per_variable`` (one Allreduce per variable per step),
``weights`` (weights and optimizer state averaged every 8 steps). Time per step is the slowest
rank's epoch time divided by the steps; communication is the time inside the Allreduce calls
(waiting for the slower rank included), compute the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "keras.json"
FEATURES, HIDDEN, CLASSES = 784, 512, 10


def worker(out: str, batches: list[int], steps: int, repeats: int) -> None:
    import keras
    from mpi4py import MPI

    import mpinb
    import mpinb.keras as mk

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    threads = int(os.environ.get("TF_NUM_INTRAOP_THREADS", "0"))  # read before fit's limit_threads rewrites it

    class StepClock(keras.callbacks.Callback):
        """Time from the first step's end to the last's: excludes per-call setup and tracing."""

        def on_train_batch_end(self, batch, logs=None):
            now = time.perf_counter()
            if batch == 0:
                self.first = now
            self.last, self.count = now, batch

        def per_step(self) -> float:
            return (self.last - self.first) / max(self.count, 1)

    modes = ["keras", "fused"] if size == 1 else ["fused", "per_variable", "weights"]
    results = []
    for batch in batches:
        per_rank = batch // size
        rng = np.random.default_rng([17, rank])
        X = rng.normal(size=(steps * per_rank, FEATURES)).astype(np.float32)
        y = rng.integers(0, CLASSES, size=steps * per_rank)
        models = {}
        for mode in modes:
            keras.utils.set_random_seed(0)
            model = keras.Sequential([
                keras.Input((FEATURES,)),
                keras.layers.Dense(HIDDEN, activation="relu"),
                keras.layers.Dense(HIDDEN, activation="relu"),
                keras.layers.Dense(CLASSES),
            ])
            opt = keras.optimizers.SGD(0.01, momentum=0.9)
            if mode in ("fused", "per_variable"):
                opt = mk.DistributedOptimizer(opt)
                opt._mpinb_exchange.fused = mode == "fused"
            model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            models[mode] = model
        times: dict[str, list[dict]] = {m: [] for m in modes}
        for rep in range(repeats + 1):
            for mode in modes:
                model = models[mode]
                clock = StepClock()
                if mode == "keras":
                    model.fit(X, y, batch_size=per_rank, epochs=1, verbose=0, callbacks=[clock])
                    comm_s = 0.0
                else:
                    strategy = "weights" if mode == "weights" else "gradients"
                    h = mk.fit(model, X, y, batch_size=batch, epochs=1, strategy=strategy, average_every=8,
                               seed=rep, verbose=0, callbacks=[clock])
                    comm_s = float(np.mean(h["comm_seconds"][0])) / steps
                record = {"step_s": max(comm.allgather(clock.per_step())), "comm_s": comm_s}
                if rep > 0:  # the first round traces the step functions
                    times[mode].append(record)
        for mode in modes:
            step = statistics.median(r["step_s"] for r in times[mode])
            comm_s = statistics.median(r["comm_s"] for r in times[mode])
            results.append({
                "ranks": size, "threads_per_rank": threads,
                "global_batch": batch, "mode": mode, "steps_per_epoch": steps, "repeats": repeats,
                "step_ms": 1e3 * step, "samples_per_s": batch / step, "comm_ms_per_step": 1e3 * comm_s,
                "comm_fraction": comm_s / step, "compute_ms_per_step": 1e3 * (step - comm_s),
            })
        del models
    if rank == 0:
        Path(out).write_text(json.dumps(results))
    mpinb.comm.rprint(f"done, {len(results)} results", root_only=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="256,1024", help="global batch sizes")
    parser.add_argument("--steps", type=int, default=30, help="steps per timed epoch")
    parser.add_argument("--repeats", type=int, default=3, help="timed epochs per mode (after one warm-up)")
    parser.add_argument("--layouts", default="1x1,1x2,2x1,4x1", help="ranks x threads per rank")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    if args.worker:
        worker(args.worker, batches, args.steps, args.repeats)
        return

    from mpinb.launch import run_mpi

    rows = []
    for layout in args.layouts.split(","):
        n, t = (int(v) for v in layout.split("x"))
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
            out = fh.name
        env = dict(os.environ, TF_NUM_INTRAOP_THREADS=str(t), OMP_NUM_THREADS=str(t), TF_CPP_MIN_LOG_LEVEL="3")
        print(f"[keras_scaling] {n} rank(s) x {t} thread(s)", flush=True)
        t0 = time.perf_counter()
        done = run_mpi(n, [__file__, "--worker", out, "--batches", args.batches, "--steps", str(args.steps),
                           "--repeats", str(args.repeats)], timeout=900, env=env)
        if done.returncode != 0:
            raise SystemExit(f"worker at {layout} failed with exit {done.returncode}")
        rows += json.loads(Path(out).read_text())
        os.unlink(out)
        print(f"[keras_scaling]   {time.perf_counter() - t0:.0f} s", flush=True)

    def pick(ranks, threads, batch, mode):
        return next((r for r in rows if (r["ranks"], r["threads_per_rank"], r["global_batch"], r["mode"])
                     == (ranks, threads, batch, mode)), None)

    summary = {}
    for batch in batches:
        base, two_threads = pick(1, 1, batch, "keras"), pick(1, 2, batch, "keras")
        s = {}
        for mode in ("fused", "per_variable", "weights"):
            for ranks in (2, 4):
                r = pick(ranks, 1, batch, mode)
                if r and base:
                    s[f"{ranks}x1_{mode}_vs_1x1"] = r["samples_per_s"] / base["samples_per_s"]
                if r and two_threads:
                    s[f"{ranks}x1_{mode}_vs_1x2"] = r["samples_per_s"] / two_threads["samples_per_s"]
        f2, p2 = pick(2, 1, batch, "fused"), pick(2, 1, batch, "per_variable")
        if f2 and p2:
            s["2x1_per_variable_extra_ms_per_step"] = p2["step_ms"] - f2["step_ms"]
            s["2x1_fused_comm_fraction"] = f2["comm_fraction"]
        summary[str(batch)] = s
    report = {
        "benchmark": "keras_scaling",
        "model": f"MLP {FEATURES}-{HIDDEN}-{HIDDEN}-{CLASSES}, SGD momentum, synthetic rows",
        "machine": {"cpus": len(os.sched_getaffinity(0)), "python": sys.version.split()[0],
                    "platform": platform.platform()},
        "targets": "2 ranks >= 1.6x samples/s of 1x1 and >= 1x2; communication <= 10% of step time",
        "results": rows,
        "ratios": summary,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=1))
    print(json.dumps(summary, indent=1))
    for r in rows:
        print(f"{r['ranks']}x{r['threads_per_rank']} B={r['global_batch']:5d} {r['mode']:12s} "
              f"{r['step_ms']:7.2f} ms/step {r['samples_per_s']:9.0f} samples/s comm {r['comm_ms_per_step']:6.2f} ms "
              f"({100 * r['comm_fraction']:.1f}%)")


if __name__ == "__main__":
    main()
