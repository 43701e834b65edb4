"""Data-parallel Keras throughput: 1 rank × 1 and × 2 threads vs 2 ranks, side by side; writes JSON.

Run: ``.venv/bin/python benchmarks/keras_scaling.py`` (writes ``benchmarks/results/keras.json``).
(Not named ``keras.py``: run as a script, that name would shadow the ``keras`` package.)

An MLP 784-512-512-10 with momentum SGD on synthetic rows; each rank generates its own shard. The
machine this runs on is usually shared and its speed drifts by tens of percent within minutes, so
nothing is compared across minutes: the run is ``--rounds`` rounds, each round runs one short
``mpiexec`` job per layout (1×1, 1×2, 2×1, in a rotating order), and every job times one epoch of
each of its modes per repeat, interleaved, after one warm-up epoch that traces the step functions.
The figures are medians over all timed epochs of all rounds.

Modes, for every global batch and every ``steps_per_execution`` (compile argument):

- ``keras``        plain ``model.fit`` in one process (the baselines at 1×1 and 1×2);
- ``independent``  every rank runs plain ``model.fit`` on its own half-batch with no communication
                   at all: the ceiling for any data-parallel scheme on this machine;
- ``lockstep``     ``mpinb.keras.fit`` whose exchange only waits at a barrier each step and moves no
                   data: the ceiling for any scheme that synchronises every step (on a shared
                   machine the slowest rank's noise sets the pace);
- ``fused``        ``mpinb.keras.fit`` (gradients averaged every step in one Allreduce);
- ``weights``      ``mpinb.keras.fit(strategy="weights", average_every=8)``;
- ``per_variable`` (``--modes``) one Allreduce per variable per step, for comparison.

Time per step is the slowest rank's time from the first execution's end to the last's, divided by
the steps in between. Communication is the time inside the gradient exchange, split into waiting
for the slowest rank to arrive (a barrier) and transfer (packing, the Allreduce, unpacking);
compute is the rest.
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
AVERAGE_EVERY = 8


def worker(out: str, batches: list[int], executions: list[int], modes: list[str], steps: int, repeats: int) -> None:
    import keras
    from mpi4py import MPI

    import mpinb.keras as mk

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    threads = int(os.environ.get("TF_NUM_INTRAOP_THREADS", "0"))  # read before fit's limit_threads rewrites it

    class StepClock(keras.callbacks.Callback):
        """Time from the first execution's end to the last's: excludes per-call setup."""

        def on_train_batch_end(self, batch, logs=None):
            now = time.perf_counter()
            if not hasattr(self, "first"):
                self.first, self.first_batch = now, batch
            self.last, self.steps = now, batch - self.first_batch

        def per_step(self) -> float:
            return (self.last - self.first) / max(self.steps, 1)

    mine = ["keras"] if size == 1 else [m for m in modes if m != "keras"]
    samples = []
    for batch in batches:
        per_rank = batch // size
        rng = np.random.default_rng([17, rank])
        X = rng.normal(size=(steps * per_rank, FEATURES)).astype(np.float32)
        y = rng.integers(0, CLASSES, size=steps * per_rank)
        for spe in executions:
            models = {}
            for mode in mine:
                keras.utils.set_random_seed(0)
                model = keras.Sequential([
                    keras.Input((FEATURES,)),
                    keras.layers.Dense(HIDDEN, activation="relu"),
                    keras.layers.Dense(HIDDEN, activation="relu"),
                    keras.layers.Dense(CLASSES),
                ])
                opt = keras.optimizers.SGD(0.01, momentum=0.9)
                if mode in ("fused", "per_variable", "lockstep"):
                    opt = mk.DistributedOptimizer(opt)
                    opt._mpinb_exchange.fused = mode == "fused"
                if mode == "lockstep":
                    opt._mpinb_exchange._reduce = _barrier_only(opt._mpinb_exchange)
                model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                              steps_per_execution=spe)
                models[mode] = model
            for rep in range(repeats + 1):
                for mode, model in models.items():
                    clock = StepClock()
                    comm.Barrier()
                    if mode in ("keras", "independent"):
                        model.fit(X, y, batch_size=per_rank, epochs=1, verbose=0, callbacks=[clock], shuffle=False)
                        comm_s = wait_s = 0.0
                    else:
                        h = mk.fit(model, X, y, batch_size=batch, epochs=1, average_every=AVERAGE_EVERY, seed=rep,
                                   strategy="weights" if mode == "weights" else "gradients",
                                   verbose=0, callbacks=[clock])
                        comm_s = float(np.mean(h["comm_seconds"][0])) / steps
                        wait_s = float(np.mean(h["wait_seconds"][0])) / steps
                    step_s = max(comm.allgather(clock.per_step()))
                    if rep > 0:  # the first round traces the step functions
                        samples.append({"ranks": size, "threads_per_rank": threads, "global_batch": batch,
                                        "steps_per_execution": spe, "mode": mode, "step_s": step_s,
                                        "comm_s": comm_s, "wait_s": wait_s})
            del models
            keras.backend.clear_session()
    if rank == 0:
        Path(out).write_text(json.dumps(samples))


def _barrier_only(exchange):
    """A stand-in for the exchange's reduction that synchronises the ranks and moves nothing."""

    def reduce(*grads):
        t0 = time.perf_counter()
        exchange.comm.Barrier()
        exchange.seconds += time.perf_counter() - t0
        exchange.wait_seconds += time.perf_counter() - t0
        return list(grads)

    return reduce


def summarize(samples: list[dict], steps: int) -> list[dict]:
    groups: dict[tuple, list[dict]] = {}
    for s in samples:
        key = (s["ranks"], s["threads_per_rank"], s["global_batch"], s["steps_per_execution"], s["mode"])
        groups.setdefault(key, []).append(s)
    rows = []
    for (ranks, threads, batch, spe, mode), group in sorted(groups.items()):
        step = statistics.median(g["step_s"] for g in group)
        comm_s = statistics.median(g["comm_s"] for g in group)
        transfer = statistics.median(g["comm_s"] - g["wait_s"] for g in group)
        rows.append({
            "ranks": ranks, "threads_per_rank": threads, "global_batch": batch, "steps_per_execution": spe,
            "mode": mode, "epochs_timed": len(group), "steps_per_epoch": steps,
            "step_ms": 1e3 * step, "samples_per_s": batch / step, "comm_ms_per_step": 1e3 * comm_s,
            "transfer_ms_per_step": 1e3 * transfer, "wait_ms_per_step": 1e3 * (comm_s - transfer),
            "comm_fraction": comm_s / step, "transfer_fraction": transfer / step,
            "compute_ms_per_step": 1e3 * (step - comm_s),
        })
    return rows


def ratios(rows: list[dict], batches: list[int], executions: list[int]) -> dict:
    def pick(ranks, threads, batch, spe, mode):
        return next((r for r in rows if (r["ranks"], r["threads_per_rank"], r["global_batch"],
                                         r["steps_per_execution"], r["mode"]) == (ranks, threads, batch, spe, mode)), None)

    summary = {}
    for batch in batches:
        for spe in executions:
            base, two_threads = pick(1, 1, batch, spe, "keras"), pick(1, 2, batch, spe, "keras")
            ceiling = pick(2, 1, batch, spe, "independent")
            s = {}
            for mode in ("independent", "lockstep", "fused", "weights", "per_variable"):
                r = pick(2, 1, batch, spe, mode)
                if r is None:
                    continue
                if base:
                    s[f"2x1_{mode}_vs_1x1"] = r["samples_per_s"] / base["samples_per_s"]
                if two_threads:
                    s[f"2x1_{mode}_vs_1x2"] = r["samples_per_s"] / two_threads["samples_per_s"]
                if ceiling and mode != "independent":
                    s[f"2x1_{mode}_vs_independent"] = r["samples_per_s"] / ceiling["samples_per_s"]
                if mode in ("fused", "per_variable", "weights"):
                    s[f"2x1_{mode}_comm_fraction"] = r["comm_fraction"]
                    s[f"2x1_{mode}_transfer_fraction"] = r["transfer_fraction"]
            lockstep, fused = pick(2, 1, batch, spe, "lockstep"), pick(2, 1, batch, spe, "fused")
            if lockstep and fused:
                s["2x1_fused_vs_lockstep"] = fused["samples_per_s"] / lockstep["samples_per_s"]
            if base and two_threads:
                s["1x2_vs_1x1"] = two_threads["samples_per_s"] / base["samples_per_s"]
            summary[f"batch={batch},steps_per_execution={spe}"] = s
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="256,1024,2048", help="global batch sizes")
    parser.add_argument("--executions", default="1,8", help="steps_per_execution values (compile argument)")
    parser.add_argument("--modes", default="independent,lockstep,fused,weights", help="modes at 2 ranks (see the docstring)")
    parser.add_argument("--steps", type=int, default=32, help="steps per timed epoch (a multiple of every execution length)")
    parser.add_argument("--repeats", type=int, default=2, help="timed epochs per mode per job (after one warm-up)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of one job per layout")
    parser.add_argument("--layouts", default="1x1,1x2,2x1", help="ranks x threads per rank")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    executions = [int(e) for e in args.executions.split(",")]
    modes = args.modes.split(",")
    if args.worker:
        worker(args.worker, batches, executions, modes, args.steps, args.repeats)
        return
    if any(args.steps % e for e in executions) or args.steps % AVERAGE_EVERY:
        raise SystemExit(f"--steps must be a multiple of every steps_per_execution and of {AVERAGE_EVERY}")

    from mpinb.launch import run_mpi

    layouts = args.layouts.split(",")
    samples: list[dict] = []
    t_start = time.perf_counter()
    for rnd in range(args.rounds):
        for layout in layouts[rnd % len(layouts):] + layouts[: rnd % len(layouts)]:
            n, t = (int(v) for v in layout.split("x"))
            with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
                out = fh.name
            env = dict(os.environ, TF_NUM_INTRAOP_THREADS=str(t), OMP_NUM_THREADS=str(t), TF_CPP_MIN_LOG_LEVEL="3")
            t0 = time.perf_counter()
            done = run_mpi(n, [__file__, "--worker", out, "--batches", args.batches, "--executions", args.executions,
                               "--modes", args.modes, "--steps", str(args.steps), "--repeats", str(args.repeats)],
                           timeout=1200, env=env)
            if done.returncode != 0:
                raise SystemExit(f"worker at {layout} failed with exit {done.returncode}")
            samples += json.loads(Path(out).read_text())
            os.unlink(out)
            print(f"[keras_scaling] round {rnd + 1}/{args.rounds} {layout}: {time.perf_counter() - t0:.0f} s", flush=True)

    rows = summarize(samples, args.steps)
    summary = ratios(rows, batches, executions)
    report = {
        "benchmark": "keras_scaling",
        "model": f"MLP {FEATURES}-{HIDDEN}-{HIDDEN}-{CLASSES}, SGD momentum, synthetic rows",
        "machine": {"cpus": len(os.sched_getaffinity(0)), "python": sys.version.split()[0],
                    "platform": platform.platform()},
        "settings": {"rounds": args.rounds, "repeats": args.repeats, "steps_per_epoch": args.steps,
                     "average_every": AVERAGE_EVERY, "seconds": round(time.perf_counter() - t_start)},
        "targets": "2 ranks >= 1.6x samples/s of 1x1 and >= 1x2; communication <= 10% of step time",
        "results": rows,
        "ratios": summary,
        "samples": samples,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=1))
    print(json.dumps(summary, indent=1))
    for r in rows:
        print(f"{r['ranks']}x{r['threads_per_rank']} B={r['global_batch']:5d} spe={r['steps_per_execution']} "
              f"{r['mode']:12s} {r['step_ms']:7.2f} ms/step {r['samples_per_s']:9.0f} samples/s "
              f"comm {r['comm_ms_per_step']:6.2f} ms ({100 * r['comm_fraction']:.1f}%) = wait "
              f"{r['wait_ms_per_step']:5.2f} + transfer {r['transfer_ms_per_step']:5.2f} ms "
              f"({100 * r['transfer_fraction']:.1f}%)")


if __name__ == "__main__":
    main()
