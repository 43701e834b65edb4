"""Data-parallel Keras throughput: 1 rank × 1 and × 2 threads vs 2 ranks, idle or beside a busy process.

    .venv/bin/python benchmarks/keras_scaling.py                 # scaling case, about 10 minutes
    .venv/bin/python benchmarks/keras_scaling.py --cases busy    # busy case only, about 2 minutes
    .venv/bin/python benchmarks/keras_scaling.py --quick --cases scaling,busy   # smoke run, ~40 s

(Not named ``keras.py``: run as a script, that name would shadow the ``keras`` package.)

Cases (``--cases``, comma-separated; default ``scaling``), each writing its own JSON to ``--out-dir``
(``benchmarks/results``; a temporary directory with ``--quick``):

- ``scaling`` -> ``keras.json``: the sweep below, every job on an otherwise idle machine.
- ``busy`` -> ``keras_busy.json``: global batch 1,024, ``steps_per_execution`` 1, layouts 1x1
  (plain ``model.fit``) and 2x1 (``mpinb.keras.fit``, mode ``fused``), each epoch run either idle
  or with one extra process spinning a busy loop (``--busy-loop python``: pure Python, or
  ``numpy``: element-wise passes over 8 MiB). Rank 0 starts that process, lets it spin only during
  the "busy" epochs and kills it by PID when the job ends; idle and busy epochs alternate within
  each job (rotating order), so the comparison is seconds apart. On 2 cores the 1x1 job should not
  notice it (a core is free) and the 2x1 job shares a core with it: the figure is how much of the
  2-rank speed-up survives a busy background process.

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
- ``allreduce``    ``mpinb.keras.fit`` whose exchange is one blocking in-place ``MPI_Allreduce`` of the
                   gradients' bytes in a buffer of its own, with nothing else (no packing, no
                   scaling, no arrival message; the gradients come back untouched): the floor of any
                   scheme that moves the gradients every step, here and at this size, so
                   ``allreduce_vs_lockstep`` is the most ``fused_vs_lockstep`` can be;
- ``fused``        ``mpinb.keras.fit`` (gradients averaged every step in one Allreduce);
- ``weights``      ``mpinb.keras.fit(strategy="weights", average_every=8)``;
- ``accumulate``   ``mpinb.keras.fit(accumulate_steps=4)``: gradients of 4 steps summed before one
                   exchange (the same global batch per step, a 4x larger one per update);
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
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _machine import write_report
from _step_clock import StepClock

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "benchmarks" / "results"
FEATURES, HIDDEN, CLASSES = 784, 512, 10
AVERAGE_EVERY = 8
ACCUMULATE = 4
CASES = ("scaling", "busy")
BUSY = {"batches": "1024", "executions": "1", "modes": "fused", "layouts": "1x1,2x1"}
sys.path.insert(0, str(ROOT / "benchmarks"))  # _busy, also when run from elsewhere


def worker(out: str, batches: list[int], executions: list[int], modes: list[str], steps: int, repeats: int,
           states: list[str], busy_loop: str) -> None:
    from _busy import BusyProcess
    from mpi4py import MPI

    busy = BusyProcess(busy_loop) if "busy" in states and MPI.COMM_WORLD.Get_rank() == 0 else None
    try:
        samples = _train(batches, executions, modes, steps, repeats, states, busy)
        share = busy.cpu_share() if busy is not None else None
    finally:
        if busy is not None:
            busy.close()
    if MPI.COMM_WORLD.Get_rank() == 0:
        Path(out).write_text(json.dumps({"samples": samples, "busy_process_cpu_share": share}))


def _train(batches: list[int], executions: list[int], modes: list[str], steps: int, repeats: int,
           states: list[str], busy) -> list[dict]:
    import keras
    from mpi4py import MPI

    import mpinb.keras as mk
    from mpinb.keras.optimizer import exchange_of

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    threads = int(os.environ.get("TF_NUM_INTRAOP_THREADS", "0"))  # read before fit's limit_threads rewrites it

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
                if mode in ("fused", "per_variable", "lockstep", "allreduce", "accumulate"):
                    opt = mk.DistributedOptimizer(opt)
                # fused and accumulate run mpinb as shipped (the busy case stays on public API); the
                # comparison modes replace one part of this optimizer's exchange, here only.
                if mode == "per_variable":
                    exchange = exchange_of(opt)
                    exchange.average = _per_variable(exchange)
                if mode == "lockstep":
                    exchange = exchange_of(opt)
                    exchange.reduce = _barrier_only(exchange)
                if mode == "allreduce":
                    exchange = exchange_of(opt)
                    exchange.reduce = _allreduce_only(exchange)
                model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                              steps_per_execution=spe)
                models[mode] = model
            for rep in range(repeats + 1):
                for state in states if rep % 2 else states[::-1]:  # rotating, so neither always goes first
                    if busy is not None and state == "busy":
                        busy.spin()
                    elif busy is not None:
                        busy.idle()
                    for mode, model in models.items():
                        clock = StepClock()
                        comm.Barrier()
                        if mode in ("keras", "independent"):
                            model.fit(X, y, batch_size=per_rank, epochs=1, verbose=0, callbacks=[clock],
                                      shuffle=False)
                            comm_s = wait_s = 0.0
                        else:
                            h = mk.fit(model, X, y, batch_size=batch, epochs=1, average_every=AVERAGE_EVERY,
                                       seed=rep, strategy="weights" if mode == "weights" else "gradients",
                                       accumulate_steps=ACCUMULATE if mode == "accumulate" else None,
                                       verbose=0, callbacks=[clock])
                            comm_s = float(np.mean(h["comm_seconds"][0])) / steps
                            wait_s = float(np.mean(h["wait_seconds"][0])) / steps
                        step_s = max(comm.allgather(clock.per_step()))
                        if rep > 0:  # the first round traces the step functions
                            samples.append({"ranks": size, "threads_per_rank": threads, "global_batch": batch,
                                            "steps_per_execution": spe, "mode": mode, "background": state,
                                            "step_s": step_s, "comm_s": comm_s, "wait_s": wait_s})
                if busy is not None:
                    busy.idle()
            del models
            keras.backend.clear_session()
    return samples


def _per_variable(exchange):
    """A stand-in for the exchange's average that reduces each gradient on its own: one
    ``numpy_function`` and one Allreduce per variable per step, for comparison with the fused one."""
    fused = exchange.average

    def average(grads):
        return [None if g is None else fused([g])[0] for g in grads]

    return average


def _barrier_only(exchange):
    """A stand-in for the exchange's reduction that synchronises the ranks and moves nothing (through
    mpinb's collective layer, so it waits exactly as the real exchange does)."""
    from mpinb import _collective

    def reduce(*grads):
        t0 = time.perf_counter()
        _collective.barrier(comm=exchange.comm, name="lockstep")
        exchange.seconds += time.perf_counter() - t0
        exchange.wait_seconds += time.perf_counter() - t0
        return list(grads)

    return reduce


def _allreduce_only(exchange):
    """A stand-in for the exchange's reduction that sums the gradients' bytes with one blocking
    in-place Allreduce on a buffer of its own and returns the gradients untouched: the floor of any
    exchange that moves them (benchmark only: a bare MPI call, outside mpinb's collective layer)."""
    from mpi4py import MPI

    buffers: dict[int, np.ndarray] = {}

    def reduce(*grads):
        t0 = time.perf_counter()
        n = sum(g.size for g in grads)
        buf = buffers.setdefault(n, np.zeros(n, np.float32))  # zeros: repeated sums stay zero
        exchange.comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        exchange.seconds += time.perf_counter() - t0
        return list(grads)

    return reduce


def summarize(samples: list[dict], steps: int) -> list[dict]:
    groups: dict[tuple, list[dict]] = {}
    for s in samples:
        key = (s["ranks"], s["threads_per_rank"], s["global_batch"], s["steps_per_execution"], s["mode"],
               s.get("background", "idle"))
        groups.setdefault(key, []).append(s)
    rows = []
    for (ranks, threads, batch, spe, mode, background), group in sorted(groups.items()):
        step = statistics.median(g["step_s"] for g in group)
        comm_s = statistics.median(g["comm_s"] for g in group)
        transfer = statistics.median(g["comm_s"] - g["wait_s"] for g in group)
        rows.append({
            "ranks": ranks, "threads_per_rank": threads, "global_batch": batch, "steps_per_execution": spe,
            "mode": mode, "background": background, "epochs_timed": len(group), "steps_per_epoch": steps,
            "step_ms": 1e3 * step, "samples_per_s": batch / step, "comm_ms_per_step": 1e3 * comm_s,
            "transfer_ms_per_step": 1e3 * transfer, "wait_ms_per_step": 1e3 * (comm_s - transfer),
            "comm_fraction": comm_s / step, "transfer_fraction": transfer / step,
            "compute_ms_per_step": 1e3 * (step - comm_s),
        })
    return rows


def ratios(rows: list[dict], batches: list[int], executions: list[int]) -> dict:
    def pick(ranks, threads, batch, spe, mode):
        wanted = (ranks, threads, batch, spe, mode, "idle")
        return next((r for r in rows if (r["ranks"], r["threads_per_rank"], r["global_batch"], r["steps_per_execution"],
                                         r["mode"], r["background"]) == wanted), None)

    summary = {}
    for batch in batches:
        for spe in executions:
            base, two_threads = pick(1, 1, batch, spe, "keras"), pick(1, 2, batch, spe, "keras")
            ceiling = pick(2, 1, batch, spe, "independent")
            s = {}
            for mode in ("independent", "lockstep", "allreduce", "fused", "weights", "per_variable", "accumulate"):
                r = pick(2, 1, batch, spe, mode)
                if r is None:
                    continue
                if base:
                    s[f"2x1_{mode}_vs_1x1"] = r["samples_per_s"] / base["samples_per_s"]
                if two_threads:
                    s[f"2x1_{mode}_vs_1x2"] = r["samples_per_s"] / two_threads["samples_per_s"]
                if ceiling and mode != "independent":
                    s[f"2x1_{mode}_vs_independent"] = r["samples_per_s"] / ceiling["samples_per_s"]
                if mode in ("fused", "per_variable", "weights", "accumulate"):
                    s[f"2x1_{mode}_comm_fraction"] = r["comm_fraction"]
                    s[f"2x1_{mode}_transfer_fraction"] = r["transfer_fraction"]
            lockstep, fused = pick(2, 1, batch, spe, "lockstep"), pick(2, 1, batch, spe, "fused")
            if lockstep and fused:
                s["2x1_fused_vs_lockstep"] = fused["samples_per_s"] / lockstep["samples_per_s"]
            floor = pick(2, 1, batch, spe, "allreduce")
            if lockstep and floor:
                s["2x1_allreduce_vs_lockstep"] = floor["samples_per_s"] / lockstep["samples_per_s"]
            if floor and fused:
                s["2x1_fused_vs_allreduce"] = fused["samples_per_s"] / floor["samples_per_s"]
            accumulate = pick(2, 1, batch, spe, "accumulate")
            if accumulate and fused:
                s[f"2x1_accumulate{ACCUMULATE}_vs_fused"] = accumulate["samples_per_s"] / fused["samples_per_s"]
            if base and two_threads:
                s["1x2_vs_1x1"] = two_threads["samples_per_s"] / base["samples_per_s"]
            summary[f"batch={batch},steps_per_execution={spe}"] = s
    return summary


def busy_ratios(rows: list[dict]) -> dict:
    """samples/s busy over idle at 1 and 2 ranks, and the 2-rank speed-up in each state."""

    def rate(ranks, background):
        mode = "keras" if ranks == 1 else BUSY["modes"]
        r = next((r for r in rows if (r["ranks"], r["mode"], r["background"]) == (ranks, mode, background)), None)
        return r["samples_per_s"] if r else None

    out = {}
    for key, num, den in (("1x1_busy_vs_idle", rate(1, "busy"), rate(1, "idle")),
                          ("2x1_busy_vs_idle", rate(2, "busy"), rate(2, "idle")),
                          ("2x1_vs_1x1_idle", rate(2, "idle"), rate(1, "idle")),
                          ("2x1_vs_1x1_busy", rate(2, "busy"), rate(1, "busy")),
                          ("2x1_busy_vs_1x1_idle", rate(2, "busy"), rate(1, "idle"))):
        if num and den:
            out[key] = num / den
    return out


def run_jobs(args: argparse.Namespace, p: dict, states: list[str], tag: str) -> tuple[list[dict], list[float]]:
    """``p["rounds"]`` rounds of one job per layout, in a rotating order; the samples of them all."""
    from mpinb.client.launch import run_mpi

    layouts = p["layouts"].split(",")
    samples: list[dict] = []
    shares: list[float] = []
    for rnd in range(p["rounds"]):
        for layout in layouts[rnd % len(layouts):] + layouts[: rnd % len(layouts)]:
            n, t = (int(v) for v in layout.split("x"))
            with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
                out = fh.name
            env = dict(os.environ, TF_NUM_INTRAOP_THREADS=str(t), OMP_NUM_THREADS=str(t), TF_CPP_MIN_LOG_LEVEL="3")
            t0 = time.perf_counter()
            try:
                done = run_mpi(n, [__file__, "--worker", out, "--batches", p["batches"], "--executions",
                                   p["executions"], "--modes", p["modes"], "--steps", str(p["steps"]),
                                   "--repeats", str(p["repeats"]), "--states", ",".join(states),
                                   "--busy-loop", args.busy_loop], timeout=1200, env=env)
                if done.returncode != 0:
                    raise SystemExit(f"worker at {layout} failed with exit {done.returncode}")
                got = json.loads(Path(out).read_text())
            finally:
                os.unlink(out)
            samples += got["samples"]
            if got["busy_process_cpu_share"] is not None:
                shares.append(got["busy_process_cpu_share"])
            print(f"[keras_scaling] {tag} round {rnd + 1}/{p['rounds']} {layout}: {time.perf_counter() - t0:.0f} s",
                  flush=True)
    return samples, shares


def _print_rows(rows: list[dict]) -> None:
    for r in rows:
        print(f"{r['ranks']}x{r['threads_per_rank']} B={r['global_batch']:5d} spe={r['steps_per_execution']} "
              f"{r['mode']:12s} {r['background']:4s} {r['step_ms']:7.2f} ms/step {r['samples_per_s']:9.0f} samples/s "
              f"comm {r['comm_ms_per_step']:6.2f} ms ({100 * r['comm_fraction']:.1f}%) = wait "
              f"{r['wait_ms_per_step']:5.2f} + transfer {r['transfer_ms_per_step']:5.2f} ms "
              f"({100 * r['transfer_fraction']:.1f}%)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="scaling", help=f"comma-separated, of: {', '.join(CASES)}")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: batch 1,024, spe 1, 8 steps, 1 repeat, 1 round, layouts 1x1,2x1; "
                        "writes to a temporary directory unless --out-dir is given")
    parser.add_argument("--batches", help="scaling: global batch sizes (default 64,256,1024)")
    parser.add_argument("--executions", help="scaling: steps_per_execution values (default 1,8)")
    parser.add_argument("--modes",
                        help="scaling: modes at 2 ranks (default independent,lockstep,allreduce,fused,weights,"
                        "accumulate)")
    parser.add_argument("--steps", type=int, help="steps per timed epoch, a multiple of every steps_per_execution "
                        f"and of {AVERAGE_EVERY} (default 32; 8 with --quick)")
    parser.add_argument("--repeats", type=int,
                        help="scaling: timed epochs per mode per job, after one warm-up (default 2)")
    parser.add_argument("--rounds", type=int, help="scaling: rounds of one job per layout (default 3)")
    parser.add_argument("--layouts", help="scaling: ranks x threads per rank (default 1x1,1x2,2x1)")
    parser.add_argument("--busy-repeats", type=int, help="busy: timed epochs per state per job (default 3)")
    parser.add_argument("--busy-rounds", type=int, help="busy: rounds of one job per layout (default 3)")
    parser.add_argument("--busy-loop", default="python", choices=("python", "numpy"), help="busy: the loop it spins")
    parser.add_argument("--out-dir", help="default benchmarks/results (a temporary directory with --quick)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--states", default="idle", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, [int(b) for b in args.batches.split(",")], [int(e) for e in args.executions.split(",")],
               args.modes.split(","), args.steps, args.repeats, args.states.split(","), args.busy_loop)
        return
    cases = args.cases.split(",")
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        parser.error(f"--cases takes {', '.join(CASES)}; got {', '.join(unknown)}")
    q = args.quick
    steps = args.steps or (8 if q else 32)
    scaling = {"batches": args.batches or ("1024" if q else "64,256,1024"),
               "executions": args.executions or ("1" if q else "1,8"),
               # --quick leaves out "independent" (plain model.fit, exercised by the 1x1 job anyway).
               "modes": args.modes or ("lockstep,allreduce,fused,weights,accumulate" if q
                                       else "independent,lockstep,allreduce,fused,weights,accumulate"),
               "steps": steps,
               "repeats": args.repeats or (1 if q else 2), "rounds": args.rounds or (1 if q else 3),
               "layouts": args.layouts or ("1x1,2x1" if q else "1x1,1x2,2x1")}
    busy = dict(BUSY, steps=steps, repeats=args.busy_repeats or (1 if q else 3),
                rounds=args.busy_rounds or (1 if q else 3))
    for p in (scaling, busy):
        if any(steps % int(e) for e in p["executions"].split(",")) or steps % AVERAGE_EVERY or steps % ACCUMULATE:
            parser.error(f"--steps must be a multiple of every steps_per_execution, of {AVERAGE_EVERY} "
                         f"and of {ACCUMULATE}")
    out_dir = Path(args.out_dir) if args.out_dir else (
        Path(tempfile.gettempdir()) / "mpinb-bench-quick" if q else RESULTS_DIR)
    out_dir.mkdir(parents=True, exist_ok=True)

    if "scaling" in cases:
        t_start = time.perf_counter()
        batches = [int(b) for b in scaling["batches"].split(",")]
        executions = [int(e) for e in scaling["executions"].split(",")]
        samples, _ = run_jobs(args, scaling, ["idle"], "scaling")
        rows = summarize(samples, steps)
        summary = ratios(rows, batches, executions)
        report = {
            "benchmark": "keras_scaling",
            "model": f"MLP {FEATURES}-{HIDDEN}-{HIDDEN}-{CLASSES}, SGD momentum, synthetic rows",
            "settings": {"quick": q, "rounds": scaling["rounds"], "repeats": scaling["repeats"],
                         "steps_per_epoch": steps, "average_every": AVERAGE_EVERY,
                         "seconds": round(time.perf_counter() - t_start)},
            "targets": ("2x1 fused >= 0.95x 2x1 lockstep (synchronising, moving nothing) at batch 64, 256 and "
                        "1,024; 2x1 allreduce (one bare Allreduce of the gradients' bytes a step) bounds any "
                        "scheme that moves them every step"),
            "results": rows,
            "ratios": summary,
            "samples": samples,
        }
        _write(out_dir / "keras.json", report)

    if "busy" in cases:
        t_start = time.perf_counter()
        samples, shares = run_jobs(args, busy, ["idle", "busy"], "busy")
        rows = summarize(samples, steps)
        summary = busy_ratios(rows)
        from mpinb.client.launch import mpi_env

        report = {
            "benchmark": "keras_scaling, busy background process",
            "model": f"MLP {FEATURES}-{HIDDEN}-{HIDDEN}-{CLASSES}, SGD momentum, synthetic rows",
            "settings": {"quick": q, "global_batch": int(BUSY["batches"]),
                         "steps_per_execution": int(BUSY["executions"]), "mode_at_2_ranks": BUSY["modes"],
                         "layouts": BUSY["layouts"], "rounds": busy["rounds"],
                         "repeats": busy["repeats"], "steps_per_epoch": steps, "busy_loop": args.busy_loop,
                         "mpich_yield_at_2_ranks": {k: v for k, v in mpi_env(2).items() if k.startswith("MPIR_CVAR")},
                         "seconds": round(time.perf_counter() - t_start)},
            "busy_process_cpu_share": statistics.median(shares) if shares else None,
            "results": rows,
            "ratios": summary,
            "samples": samples,
        }
        share = report["busy_process_cpu_share"]
        _write(out_dir / "keras_busy.json", report,
               f"the busy process got {'?' if share is None else f'{share:.0%}'} of a core while spinning "
               "(median over jobs)")

def _write(path: Path, report: dict, note: str = "") -> None:
    """Write one case's JSON and print its ratios and rows."""
    write_report(path, report, indent=1)
    print(json.dumps(report["ratios"], indent=1))
    _print_rows(report["results"])
    if note:
        print(note)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
