"""Where one Keras gradient exchange's time goes, against one plain in-place Allreduce of the same bytes.

    .venv/bin/python benchmarks/keras_exchange.py            # 2 ranks, about a minute
    .venv/bin/python benchmarks/keras_exchange.py --quick    # smoke run

The gradients of the MLP 784-512-512-10 (2.68 MB of float32), measured in one ``mpiexec`` job,
every piece interleaved with the others in each repeat (the machine's speed drifts within minutes):

- ``plain``     ``comm.Allreduce(MPI.IN_PLACE, packed)`` of the same bytes: the floor;
- ``pack``      :meth:`Packer.fill` alone (copy and scale into the wire buffers, finiteness checked);
- ``numpy``     :meth:`GradientExchange.reduce` from NumPy: packing, the arrival, the Allreduce;
- ``hop``       a traced step calling ``tf.numpy_function`` on the gradients with no exchange: the
                TensorFlow-to-NumPy crossing and back;
- ``tf``        a traced step calling ``TensorExchange.average``: what a training step pays;
- ``call``      a traced function calling an empty ``tf.numpy_function``: the fixed cost of a call;
- ``traced``    a traced function taking the gradients and reading one element, without any
                ``numpy_function``: what calling a step costs anyway, so ``tf - traced`` is the
                exchange's own share of a step.

The traced functions read one element of their results, so a step's own use of the gradients is
not counted.

The same exchange inside a real Keras training step (``model.train_on_batch`` of that MLP, local
batch ``--batch``), one model per variant, interleaved with the pieces above:

- ``step_none``      a plain optimizer: no exchange at all;
- ``step_hop``       the step's ``numpy_function`` hands the gradients back untouched: the crossing;
- ``step_lockstep``  the crossing and a barrier through mpinb's collective layer: synchronising
                     every step, moving nothing;
- ``step_fused``     ``DistributedOptimizer`` as shipped;
- ``step_graph``     ``DistributedOptimizer`` packing in the graph, as it does where TensorFlow has
                     a GPU: one concatenation, one array across, summed in place, one split;
- ``step_floor``     one blocking in-place ``MPI_Allreduce`` per gradient, straight on the arrays
                     the ``numpy_function`` receives, with no copy, no arrival and no deadline: a
                     reference only. Those arrays alias TensorFlow's own buffers (a constant, or a
                     tensor another op also reads, would be changed under it), so no shipped code
                     may write them; it bounds what any exchange inside the step can reach;
- ``step_plain``     ``step_none`` followed by the ``plain`` Allreduce: that Allreduce where a step
                     would call it, after the step's compute has had the caches.

``step_share`` is each variant's extra time per step over ``step_none``, as a ratio to ``plain``;
``step_share_of_plain_after_step`` the same extra time as a ratio to ``step_plain - step_none``.

Each repeat starts at a barrier, so arrival skew is left out (the waiting of real steps is the
slowest rank's compute noise, which ``keras_scaling.py`` measures). Figures are medians, reported
as ratios to ``plain``; JSON with the CPU model goes to ``benchmarks/results/keras_exchange.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _machine import write_report

RESULTS = Path(__file__).resolve().parent / "results" / "keras_exchange.json"
SHAPES = [(784, 512), (512,), (512, 512), (512,), (512, 10), (10,)]
STEP_VARIANTS = ("none", "hop", "lockstep", "fused", "graph", "floor")


def _step_variant(kind: str, comm, batch: int):
    """A ``train_on_batch`` call of the MLP whose exchange is ``kind`` (see the module's docstring)."""
    import keras
    from mpi4py import MPI

    from mpinb import _collective
    from mpinb.keras.optimizer import DistributedOptimizer, exchange_of

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((SHAPES[0][0],)), keras.layers.Dense(SHAPES[0][1], activation="relu"),
                              keras.layers.Dense(SHAPES[2][1], activation="relu"), keras.layers.Dense(SHAPES[4][1])])
    opt = keras.optimizers.SGD(0.01)
    if kind != "none":
        opt = DistributedOptimizer(opt)
        ex = exchange_of(opt)

        def hop(*grads):
            return list(grads)

        def lockstep(*grads):
            _collective.barrier(comm=comm, name="lockstep")
            return list(grads)

        def floor(*grads):
            for g in grads:
                comm.Allreduce(MPI.IN_PLACE, g, op=MPI.SUM)  # benchmark only: see the docstring
            return list(grads)

        if kind == "graph":
            ex.pack_in_graph = True
        elif kind != "fused":
            ex.reduce = {"hop": hop, "lockstep": lockstep, "floor": floor}[kind]
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(comm.Get_rank())
    x = rng.normal(size=(batch, SHAPES[0][0])).astype(np.float32)
    y = rng.integers(0, SHAPES[4][1], size=batch)
    return lambda: model.train_on_batch(x, y)


def worker(out: str, repeats: int, batch: int) -> None:
    from mpinb._quiet_tf import import_tensorflow

    import_tensorflow()
    import tensorflow as tf
    from mpi4py import MPI

    import mpinb
    from mpinb._training.packing import Packer
    from mpinb.keras.optimizer import TensorExchange

    comm = MPI.COMM_WORLD
    mpinb.world()
    rng = np.random.default_rng(comm.Get_rank())
    grads = tuple(rng.normal(size=s).astype(np.float32) for s in SHAPES)
    packed = np.concatenate([g.ravel() for g in grads])
    ex = TensorExchange(comm)
    packer = Packer(grads)
    tensors = [tf.constant(g) for g in grads]

    @tf.function
    def hop(*ts):
        back = tf.numpy_function(lambda *a: list(a), list(ts), [t.dtype for t in ts], stateful=True)
        return back[0][0, 0]  # one element read: the step's own use of the results is not the exchange's

    @tf.function
    def exchange(*ts):
        return ex.average(list(ts))[0][0, 0]

    @tf.function
    def traced(*ts):
        return ts[0][0, 0]

    @tf.function
    def empty():
        return tf.numpy_function(lambda: np.float32(0), [], tf.float32, stateful=True)

    pieces = {
        "plain": lambda: comm.Allreduce(MPI.IN_PLACE, packed, op=MPI.SUM),
        "pack": lambda: packer.fill(grads, 0.5),
        "numpy": lambda: ex.reduce(*grads),
        "hop": lambda: hop(*tensors).numpy(),
        "tf": lambda: exchange(*tensors).numpy(),
        "call": lambda: empty().numpy(),
        "traced": lambda: traced(*tensors).numpy(),
        **{f"step_{kind}": _step_variant(kind, comm, batch) for kind in STEP_VARIANTS},
    }
    plain_step = pieces["step_none"]

    def step_plain():
        plain_step()
        comm.Allreduce(MPI.IN_PLACE, packed, op=MPI.SUM)

    pieces["step_plain"] = step_plain
    times: dict[str, list[float]] = {k: [] for k in pieces}
    for k in pieces:  # warm-up: traces, buffers, MPI's first touch of the memory
        for _ in range(5):
            comm.Barrier()
            pieces[k]()
    names = list(pieces)
    for i in range(repeats):
        for k in names[i % len(names):] + names[: i % len(names)]:
            comm.Barrier()
            t0 = time.perf_counter()
            pieces[k]()
            times[k].append(time.perf_counter() - t0)
    # Per repeat, the slower rank's time.
    slowest = {k: np.max(comm.allgather(np.array(v)), axis=0) for k, v in times.items()}
    if comm.Get_rank() == 0:
        med = {k: statistics.median(v) for k, v in slowest.items()}
        Path(out).write_text(json.dumps({
            "ranks": comm.Get_size(), "bytes": int(packed.nbytes), "repeats": repeats,
            "median_ms": {k: round(v * 1e3, 4) for k, v in med.items()},
            "ratio_to_plain": {k: round(v / med["plain"], 3) for k, v in med.items()},
            "exchange_in_step_ratio": round((med["tf"] - med["traced"]) / med["plain"], 3),
            "local_batch": batch,
            "step_share": {kind: round((med[f"step_{kind}"] - med["step_none"]) / med["plain"], 3)
                           for kind in STEP_VARIANTS if kind != "none"},
            # What the shipped exchange pays for being safe (its own buffers, the arrival, the
            # deadline) beyond the bound no exchange inside a step can beat.
            "fused_over_floor": round((med["step_fused"] - med["step_floor"]) / med["plain"], 3),
            # The plain Allreduce where a step would call it (after the step's compute, its
            # buffers and MPI's cold in cache): the floor's own reference.
            "plain_after_step_ms": round((med["step_plain"] - med["step_none"]) * 1e3, 4),
            "step_share_of_plain_after_step": {
                kind: round((med[f"step_{kind}"] - med["step_none"]) / (med["step_plain"] - med["step_none"]), 3)
                for kind in STEP_VARIANTS if kind != "none"},
        }))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--batch", type=int, default=32, help="local batch of the training steps (default 32)")
    parser.add_argument("--out")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    repeats = 20 if args.quick else 300
    if args.worker:
        worker(args.worker, repeats, args.batch)
        return
    from mpinb.client.launch import run_mpi

    out = Path(args.out) if args.out else (
        Path(tempfile.gettempdir()) / "mpinb-bench-quick" / "keras_exchange.json" if args.quick else RESULTS)
    with tempfile.TemporaryDirectory(prefix="mpinb-bench-") as tmp:
        part = Path(tmp) / "part.json"
        argv = [__file__, "--worker", str(part), "--batch", str(args.batch)] + (["--quick"] if args.quick else [])
        proc = run_mpi(args.np, argv, timeout=600)
        if proc.returncode != 0:
            sys.exit(f"benchmark failed (exit {proc.returncode})")
        run = json.loads(part.read_text())
    report = {"benchmark": "keras_exchange", "quick": args.quick,
              "run": run, "target": "step_share.fused <= 1.5"}
    print(json.dumps(write_report(out, report, indent=1), indent=1))


if __name__ == "__main__":
    main()
