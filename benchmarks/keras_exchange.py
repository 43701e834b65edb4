"""Where one Keras gradient exchange's time goes, against one plain in-place Allreduce of the same bytes.

    .venv/bin/python benchmarks/keras_exchange.py            # 2 ranks, local batches 32, 128, 512: minutes
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

The same exchange inside a real Keras training step (``model.train_on_batch`` of that MLP, at each
local batch of ``--batches``), one model per variant and batch, interleaved with the pieces above:

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
                     would call it, after the step's compute has had the caches;
- ``step_prescaled`` the issue's second design, made safe: the gradients scaled by this rank's weight
                     in the graph (a multiplication by a variable read as the step runs, so its
                     outputs are buffers of their own and never a folded constant), then summed in
                     place on the arrays the ``numpy_function`` receives (finiteness checked in a
                     read-only pass, votes in the arrival, one message per gradient): no packing
                     copy. Without that multiplication the received arrays alias TensorFlow's own
                     tensors (a constant, a variable's value, an input, a tensor another op reads
                     later: ``tests/mpi/test_keras.py`` writes through each of them), so it is the
                     least an in-place exchange on them must do;
- ``step_split``     the issue's first design: one traced function returns the loss's gradients, the
                     host scales, checks and sums them in place on the returned tensors' own buffers
                     (``_numpy()``: no copy; benchmark only, private API), a second traced function
                     applies them: the exchange out of the graph.

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
STEP_VARIANTS = ("none", "hop", "lockstep", "fused", "graph", "floor", "prescaled", "split")


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
    rng = np.random.default_rng(comm.Get_rank())
    x = rng.normal(size=(batch, SHAPES[0][0])).astype(np.float32)
    y = rng.integers(0, SHAPES[4][1], size=batch)
    if kind == "split":
        return _split_step(model, opt, comm, x, y)
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
        elif kind == "prescaled":
            ex.average = _prescaled_average(ex)
        elif kind != "fused":
            ex.reduce = {"hop": hop, "lockstep": lockstep, "floor": floor}[kind]
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return lambda: model.train_on_batch(x, y)


def _finite_check():
    """Whether every value of a flat array is finite, in one read-only pass."""
    from mpinb import _numba

    numba = _numba.load()
    if numba is None:
        return lambda a: bool(np.isfinite(a.min()) and np.isfinite(a.max()))

    @numba.njit(nogil=True, boundscheck=False, fastmath={"reassoc", "contract"})
    def finite(a):  # pragma: no cover - compiled
        acc = a.dtype.type(0)
        for i in range(a.size):
            acc += a[i] - a[i]
        return acc == 0

    return lambda a: a.size == 0 or bool(finite(a))


def _prescaled_average(ex):
    """``TensorExchange.average`` for float32 gradients scaled in the graph and summed in place on
    the crossing's own input arrays (see ``step_prescaled`` in the module's docstring)."""
    import tensorflow as tf

    finite = _finite_check()
    with tf.init_scope():
        weight = tf.Variable(1.0 / ex.comm.Get_size(), trainable=False, name="prescaled_weight")

    def reduce(*grads):
        t0 = time.perf_counter()
        ok = all(finite(g.reshape(-1)) for g in grads)
        ex._sum_and_vote(list(grads), ok, list(grads))
        ex.seconds += time.perf_counter() - t0
        return list(grads)

    def average(grads, rows=None):
        w = weight.read_value()
        scaled = [g * w for g in grads]
        out = tf.numpy_function(reduce, scaled, [g.dtype for g in scaled], stateful=True, name="prescaled")
        for o, g in zip(out, grads, strict=True):
            o.set_shape(g.shape)
        return out

    return average


def _split_step(model, opt, comm, x, y):
    """One training step as two traced functions with the exchange between them, on the host (see
    ``step_split`` in the module's docstring)."""
    import keras
    import tensorflow as tf

    from mpinb._training.exchange import GradientExchange
    from mpinb._training.packing import scale_in_place

    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=opt, loss=loss_fn)
    variables = model.trainable_variables
    opt.build(variables)
    ex = GradientExchange(comm)
    scale = 1.0 / comm.Get_size()

    @tf.function
    def gradients(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        return tape.gradient(loss, variables)

    @tf.function
    def apply(grads):
        opt.apply(grads, variables)

    xt, yt = tf.constant(x), tf.constant(y)

    def step():
        grads = gradients(xt, yt)
        arrays = [g._numpy() for g in grads]  # the returned tensors' own buffers, no copy
        ok = True
        for a in arrays:
            ok &= scale_in_place(a.reshape(-1), scale)
        ex._sum_and_vote(arrays, ok, arrays)
        apply(grads)

    return step


def worker(out: str, repeats: int, batches: list[int]) -> None:
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
    }
    for batch in batches:
        steps = {f"step_{kind}@{batch}": _step_variant(kind, comm, batch) for kind in STEP_VARIANTS}

        def step_plain(plain_step=steps[f"step_none@{batch}"]):
            plain_step()
            comm.Allreduce(MPI.IN_PLACE, packed, op=MPI.SUM)

        pieces.update(steps, **{f"step_plain@{batch}": step_plain})
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
            "median_ms": {k: round(v * 1e3, 4) for k, v in med.items() if "@" not in k},
            "ratio_to_plain": {k: round(v / med["plain"], 3) for k, v in med.items() if "@" not in k},
            "exchange_in_step_ratio": round((med["tf"] - med["traced"]) / med["plain"], 3),
            "steps": {str(batch): _step_figures(med, batch) for batch in batches},
        }))


def _step_figures(med: dict[str, float], batch: int) -> dict:
    """The step variants at one local batch: medians, and each variant's extra time over
    ``step_none`` as a ratio to the plain Allreduce (back to back, and right after a step)."""
    step = {kind: med[f"step_{kind}@{batch}"] for kind in (*STEP_VARIANTS, "plain")}
    after = step["plain"] - step["none"]  # the plain Allreduce where a step would call it
    extra = {kind: step[kind] - step["none"] for kind in STEP_VARIANTS if kind != "none"}
    return {
        "local_batch": batch, "global_batch": batch * 2,
        "median_ms": {kind: round(v * 1e3, 4) for kind, v in step.items()},
        "step_share": {kind: round(v / med["plain"], 3) for kind, v in extra.items()},
        # What the shipped exchange pays for being safe (its own buffers, the arrival, the
        # deadline) beyond the bound no exchange inside a step can beat.
        "fused_over_floor": round((step["fused"] - step["floor"]) / med["plain"], 3),
        # The plain Allreduce after the step's compute (its buffers and MPI's cold in cache).
        "plain_after_step_ms": round(after * 1e3, 4),
        "step_share_of_plain_after_step": {kind: round(v / after, 3) for kind, v in extra.items()},
        # A step at the floor of any exchange that moves the gradients (lockstep's wait plus one
        # plain Allreduce after the step), against lockstep: the most fused_vs_lockstep can be.
        "plain_floor_vs_lockstep": round(step["lockstep"] / (step["lockstep"] + after), 3),
        "fused_vs_lockstep": round(step["lockstep"] / step["fused"], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--batches", default="32,128,512",
                        help="local batches of the training steps (default 32,128,512: global 64, 256, 1,024)")
    parser.add_argument("--out")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    repeats = 20 if args.quick else 300
    if args.worker:
        worker(args.worker, repeats, [int(b) for b in args.batches.split(",")])
        return
    from mpinb.client.launch import run_mpi

    out = Path(args.out) if args.out else (
        Path(tempfile.gettempdir()) / "mpinb-bench-quick" / "keras_exchange.json" if args.quick else RESULTS)
    with tempfile.TemporaryDirectory(prefix="mpinb-bench-") as tmp:
        part = Path(tmp) / "part.json"
        argv = [__file__, "--worker", str(part), "--batches", args.batches] + (["--quick"] if args.quick else [])
        proc = run_mpi(args.np, argv, timeout=600)
        if proc.returncode != 0:
            sys.exit(f"benchmark failed (exit {proc.returncode})")
        run = json.loads(part.read_text())
    report = {"benchmark": "keras_exchange", "quick": args.quick,
              "run": run, "target": "step_share.fused <= 1.5"}
    print(json.dumps(write_report(out, report, indent=1), indent=1))


if __name__ == "__main__":
    main()
