"""Samples/s on a GPU: plain Keras against ``mpinb.keras.fit`` at 1 rank and at 2 ranks sharing the GPU.

    python benchmarks/keras_gpu.py            # on a machine with an NVIDIA GPU (~2 min)
    python benchmarks/keras_gpu.py --quick    # a smoke run (also runs without a GPU, on the CPU)

The model is ``benchmarks/keras_scaling.py``'s MLP (784-512-512-10, SGD with momentum), trained on
random data at global batch 256 and 1,024. Three runs per batch, interleaved in rotating order
within each round (so drift hits all alike), medians over ``--repeats`` rounds after one round that
traces the step functions:

- ``keras-1``: ``model.fit`` in one process on the GPU (the ceiling);
- ``mpinb-1``: ``mpinb.keras.fit`` at 1 rank (target: samples/s >= 0.95 of ``keras-1``, that is
  an overhead of at most 5 %);
- ``mpinb-2-shared``: ``mpinb.keras.fit`` at 2 ranks on the one GPU (``MPINB_GPUS=share``, each rank
  capped at ``--memory-limit-mb``), global batch split between them.

After the timed rounds each job profiles ``--profile-steps`` more steps (TensorFlow's profiler; the
GPU's memcpy activities in its trace) and counts the copies between host and device per step:
``keras-1``'s (the batch going in, the logs coming out) are the baseline, and ``mpinb-2-shared``'s
beyond them are the gradient exchange's, once with the gradients packed on the device (the
default where TensorFlow has a GPU) and once packed in NumPy (``mpinb-2-numpy``; one copy per
variable each way). Target: at most one copy each way per step.

The time of a run is from the end of its first step to the end of its last (Keras's callback),
slowest rank. Each rank's device is recorded (``mpinb.gpus.device()``). Without a GPU the script
runs the same on the CPU and says so (``"device": "CPU"``); the result is then written to a
temporary directory unless ``--out`` is given, so a CPU smoke run never replaces a GPU result in
``benchmarks/results/keras_gpu.json``.
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

from _machine import write_report
from _step_clock import StepClock

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "keras_gpu.json"
FEATURES, HIDDEN, CLASSES = 784, 512, 10
RUNS = ("keras-1", "mpinb-1", "mpinb-2-shared")


def worker(config: dict) -> None:
    """Under ``mpiexec``: the runs of ``config["runs"]`` at this world's size, rotating per round."""
    from mpinb import gpus

    choice = gpus.use_one_gpu_per_rank()  # before TensorFlow initialises its devices
    import keras
    import numpy as np
    from mpi4py import MPI

    import mpinb.keras as mk

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()

    def model() -> keras.Model:
        keras.utils.set_random_seed(0)
        m = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(HIDDEN, activation="relu"),
                              keras.layers.Dense(HIDDEN, activation="relu"), keras.layers.Dense(CLASSES)])
        return m

    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    samples = []
    steps = config["steps"]
    for batch in config["batches"]:
        rng = np.random.default_rng([17, rank])
        per_rank = batch // size
        X = rng.normal(size=(steps * per_rank, FEATURES)).astype(np.float32)
        y = rng.integers(0, CLASSES, size=steps * per_rank)
        models = {}
        for run in config["runs"]:
            m = model()
            opt = keras.optimizers.SGD(0.01, momentum=0.9)
            m.compile(optimizer=opt if run == "keras-1" else mk.DistributedOptimizer(opt), loss=loss)
            models[run] = m
        for rep in range(config["repeats"] + 1):
            order = list(models) if rep % 2 == 0 else list(models)[::-1]
            for run in order:
                clock = StepClock()
                comm.Barrier()
                if run == "keras-1":
                    models[run].fit(X, y, batch_size=per_rank, epochs=1, verbose=0, shuffle=False, callbacks=[clock])
                else:
                    mk.fit(models[run], X, y, batch_size=batch, epochs=1, verbose=0, seed=rep, callbacks=[clock])
                step = max(comm.allgather(clock.per_step()))
                if rep > 0:  # the first round traces the step functions
                    samples.append({"run": run, "global_batch": batch, "step_s": step, "samples_per_s": batch / step})
        del models
        keras.backend.clear_session()
    copies = _profile_copies(config, model, loss, comm)
    devices = comm.allgather(str(choice))
    if rank == 0:
        Path(config["out"]).write_text(json.dumps({"samples": samples, "devices": devices, "copies": copies}))


def _profile_copies(config: dict, model, loss, comm) -> dict:
    """Host-device copies per step of each profiled run on this rank (rank 0's are reported)."""
    import keras
    import numpy as np

    import mpinb.keras as mk
    from mpinb.keras.optimizer import exchange_of

    steps, size = config["profile_steps"], comm.Get_size()
    batch = config["batches"][0]
    per_rank = batch // size
    rng = np.random.default_rng([18, comm.Get_rank()])
    X = rng.normal(size=(steps * per_rank, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, size=steps * per_rank)
    found = {}
    for run in ["keras-1"] if size == 1 else ["mpinb-2-shared", "mpinb-2-numpy"]:
        m = model()
        opt = keras.optimizers.SGD(0.01, momentum=0.9)
        if run != "keras-1":
            opt = mk.DistributedOptimizer(opt)
            exchange_of(opt).pack_in_graph = None if run == "mpinb-2-shared" else False
        m.compile(optimizer=opt, loss=loss)

        def train(m=m, run=run):
            if run == "keras-1":
                m.fit(X, y, batch_size=per_rank, epochs=1, verbose=0, shuffle=False)
            else:
                mk.fit(m, X, y, batch_size=batch, epochs=1, verbose=0, shuffle=False)

        train()  # traced outside the profile
        with tempfile.TemporaryDirectory(prefix="mpinb-profile-") as logdir:
            found[run] = _copies_while(train, steps, Path(logdir))
        comm.Barrier()
    return found


def _copies_while(train, steps: int, logdir: Path) -> dict:
    """Copies between host and device per step while ``train()`` takes ``steps`` steps, counted from
    the memcpy activities on the device planes of TensorFlow's profiler trace."""
    import collections

    import tensorflow as tf
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    tf.profiler.experimental.start(str(logdir))
    try:
        train()
    finally:
        tf.profiler.experimental.stop()
    names: collections.Counter = collections.Counter()
    to_host = to_device = 0
    for path in logdir.rglob("*.xplane.pb"):
        space = xplane_pb2.XSpace()
        space.ParseFromString(path.read_bytes())
        for plane in space.planes:
            if "gpu" not in plane.name.lower():
                continue  # the host's planes hold the API calls, not the copies
            for line in plane.lines:
                for event in line.events:
                    name = plane.event_metadata[event.metadata_id].name
                    key = name.lower()
                    if "memcpy" not in key:
                        continue
                    names[name] += 1
                    to_host += "dtoh" in key or "d2h" in key
                    to_device += "htod" in key or "h2d" in key
    return {"to_host_per_step": to_host / steps, "to_device_per_step": to_device / steps,
            "memcpy_events": dict(names)}


def _jobs(args: argparse.Namespace, tmp: Path) -> list[dict]:
    from mpinb.client.launch import mpi_env, run_mpi

    found = []
    for ranks, runs, extra in ((1, ["keras-1", "mpinb-1"], {}),
                               (2, ["mpinb-2-shared"], {"MPINB_GPUS": "share",
                                                        "MPINB_GPU_MEMORY_LIMIT_MB": str(args.memory_limit_mb)})):
        part = tmp / f"part-{ranks}.json"
        config = {"runs": runs, "batches": args.batches, "steps": args.steps, "repeats": args.repeats,
                  "profile_steps": args.profile_steps, "out": str(part)}
        env = dict(mpi_env(ranks), **extra)
        proc = run_mpi(ranks, [__file__, "--worker", json.dumps(config)], timeout=1200, env=env)
        if proc.returncode != 0:
            raise SystemExit(f"mpiexec -n {ranks} failed with exit code {proc.returncode}")
        result = json.loads(part.read_text())
        found.append({"ranks": ranks, **result})
    return found


def copies(jobs: list[dict]) -> dict:
    """The exchange's own copies per step each way: the profiled 2-rank runs' beyond plain Keras's."""
    found = {run: c for job in jobs for run, c in job["copies"].items()}
    base = found.get("keras-1")
    if base is None:
        return found
    for run in ("mpinb-2-shared", "mpinb-2-numpy"):
        if run in found:
            found[run]["exchange_to_host_per_step"] = found[run]["to_host_per_step"] - base["to_host_per_step"]
            found[run]["exchange_to_device_per_step"] = found[run]["to_device_per_step"] - base["to_device_per_step"]
    return found


def summarize(jobs: list[dict], batches: list[int]) -> tuple[list[dict], dict]:
    rows, ratios = [], {}
    for batch in batches:
        median = {}
        for job in jobs:
            for run in {s["run"] for s in job["samples"]}:
                rates = [s["samples_per_s"] for s in job["samples"] if s["run"] == run and s["global_batch"] == batch]
                median[run] = statistics.median(rates)
                rows.append({"run": run, "global_batch": batch, "ranks": job["ranks"], "devices": job["devices"],
                             "samples_per_s": median[run], "rounds": len(rates)})
        if "keras-1" in median:
            ratios[f"batch {batch}: mpinb-1 / keras-1"] = median["mpinb-1"] / median["keras-1"]
            ratios[f"batch {batch}: mpinb-2-shared / keras-1"] = median["mpinb-2-shared"] / median["keras-1"]
    return rows, ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="batch 256 only, 8 steps, 1 round")
    parser.add_argument("--repeats", type=int, help="rounds after the tracing one (default 5; 1 with --quick)")
    parser.add_argument("--profile-steps", type=int, default=10, help="steps profiled to count copies")
    parser.add_argument("--memory-limit-mb", type=int, default=8000, help="each sharing rank's GPU memory")
    parser.add_argument("--out", help=f"JSON path (default {RESULTS.relative_to(ROOT)} on a GPU)")
    args = parser.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    sys.path.insert(0, str(ROOT))
    from mpinb import gpus

    on_gpu = bool(gpus.inventory())
    args.batches = [256] if args.quick else [256, 1024]
    args.steps = 8 if args.quick else 60
    args.repeats = args.repeats or (1 if args.quick else 5)
    if args.out:
        out = Path(args.out)
    elif on_gpu and not args.quick:
        out = RESULTS
    else:
        out = Path(tempfile.gettempdir()) / "mpinb-bench-quick" / "keras_gpu.json"
        if not on_gpu:
            print("[bench] no GPU here: running on the CPU as a smoke run, not written to benchmarks/results",
                  flush=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mpinb-bench-") as tmpdir:
        jobs = _jobs(args, Path(tmpdir))
    rows, ratios = summarize(jobs, args.batches)
    report = {"benchmark": "keras_gpu", "device": "GPU" if on_gpu else "CPU", "quick": args.quick,
              "settings": {"batches": args.batches, "steps_per_epoch": args.steps, "repeats": args.repeats,
                           "memory_limit_mb_when_shared": args.memory_limit_mb,
                           "seconds": round(time.perf_counter() - t0)},
              "targets": "mpinb-1 / keras-1 >= 0.95 (overhead <= 5 %); the exchange's copies <= 1 each way a step",
              "results": rows, "ratios": ratios, "copies": copies(jobs)}
    write_report(out, report)
    print(json.dumps({"ratios": ratios, "copies": report["copies"]}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main()
