"""`DistributedOptimizer`: average gradients over all ranks every step with one fused Allreduce."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from mpinb.errors import _check_int, _resolve
from mpinb.keras._pack import Packer, sum_over_ranks

__all__ = ["DistributedOptimizer", "is_distributed"]

# One subclass per wrapped optimizer class, so wrapping twice gives the same class (isinstance and
# Keras's own class checks keep working).
_CLASSES: dict[type, type] = {}


def DistributedOptimizer(optimizer: Any, *, accumulate_steps: int = 1, comm: Any = None) -> Any:  # noqa: N802
    """Wrap a Keras 3 optimizer so that gradients are averaged over all ranks before every update.

    Local to build; the returned optimizer is collective in use: every rank must train the same
    model with the same number of steps (``mpinb.keras.fit`` guarantees this). The hook is
    ``optimizer.apply``, which Keras's ``fit``, ``train_on_batch`` and custom loops calling
    ``apply_gradients`` all reach; inside it one ``tf.numpy_function`` packs all gradients into one
    buffer, multiplying each by ``1 / size`` as it is copied in, and calls ``comm.Allreduce`` once:
    the sum of the scaled gradients is their mean, so nothing is divided afterwards. (Half-precision
    gradients are packed and summed in float32; on one rank the hook does nothing.)

    The wrapper is a subclass of the optimizer's class with the same name and module, built from the
    optimizer's config (state of a built optimizer is copied), so ``model.save`` on rank 0 writes a
    file that loads in plain Keras without mpinb. Wrap the outermost optimizer: a
    ``LossScaleOptimizer`` must be wrapped itself, not its inner optimizer, so that every rank takes
    the same finite/non-finite branch.

    Parameters
    ----------
    optimizer : keras.optimizers.Optimizer
        Any Keras 3 optimizer instance, ``LossScaleOptimizer`` included.
    accumulate_steps : int, default 1
        Sum this many local steps' gradients (micro-batches) before one exchange and one update:
        the same update as one step on an N times larger batch, with N times fewer exchanges. The
        optimizer counts one iteration per update. Every rank must take a multiple of N steps
        per epoch (``mpinb.keras.fit(..., accumulate_steps=N)`` checks this).
    comm : mpi4py.MPI.Comm, optional
        Defaults to ``MPI.COMM_WORLD``.

    Returns
    -------
    keras.optimizers.Optimizer
        A new optimizer of a subclass of ``type(optimizer)``.

    Raises
    ------
    TypeError
        If ``optimizer`` is not a Keras 3 optimizer instance.
    ValueError
        If it is already distributed, or is a ``LossScaleOptimizer`` around a distributed one.
    RuntimeError
        If it is already built and this Keras version does not say for which variables.

    Notes
    -----
    XLA cannot compile the Python call into MPI: compile the model with ``jit_compile=False``
    (``mpinb.keras.fit`` turns it off with a warning). Tracing the hook under XLA raises a
    ``RuntimeError`` that says so.

    Examples
    --------
    >>> model.compile(optimizer=DistributedOptimizer(keras.optimizers.Adam(1e-3)), loss="mse")
    """
    import keras

    if isinstance(optimizer, type) or not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            f"DistributedOptimizer wraps a Keras 3 optimizer instance such as keras.optimizers.SGD(0.01); "
            f"got {optimizer!r}."
        )
    if is_distributed(optimizer):
        raise ValueError("This optimizer is already a DistributedOptimizer; wrap the plain optimizer once.")
    inner = getattr(optimizer, "inner_optimizer", None)
    if inner is not None and is_distributed(inner):
        raise ValueError(
            "Wrap the LossScaleOptimizer, not its inner optimizer: "
            "DistributedOptimizer(LossScaleOptimizer(opt)), so that every rank takes the same "
            "finite/non-finite branch after the gradients are averaged."
        )
    cls = _distributed_class(type(optimizer))
    wrapped = cls.from_config(optimizer.get_config())
    if optimizer.built:
        wrapped.build(_built_for(optimizer))
        for mine, theirs in zip(wrapped.variables, optimizer.variables):
            mine.assign(theirs)
    exchange = _Exchange(_resolve(comm))
    exchange.accumulate = _check_int(accumulate_steps, "accumulate_steps", minimum=1)
    exchange.check_finite = not isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    wrapped._mpinb_exchange = exchange
    return wrapped


def is_distributed(optimizer: Any) -> bool:
    """Whether ``optimizer`` averages its gradients over ranks (was made by DistributedOptimizer).

    Local.
    """
    return isinstance(optimizer, _AllreduceGradients)


class _AllreduceGradients:
    """Mixin placed in front of a Keras optimizer class: averages gradients inside ``apply``."""

    _mpinb_exchange: _Exchange

    def apply(self, grads: Any, trainable_variables: Any = None) -> Any:
        grads = list(grads)
        if grads and self._mpinb_exchange.accumulate > 1:
            return self._mpinb_accumulate(grads, trainable_variables)
        if grads:
            grads = self._mpinb_exchange.average(grads)
        return super().apply(grads, trainable_variables)  # type: ignore[misc]

    def _mpinb_accumulate(self, grads: list[Any], trainable_variables: Any) -> Any:
        """Add this micro-step's gradients to the sums; every N-th, average the sums over the
        micro-steps and the ranks (one exchange) and update."""
        import tensorflow as tf

        ex = self._mpinb_exchange
        variables = list(trainable_variables) if trainable_variables is not None else _built_for(self)
        sums, count = ex.sums_for(variables)
        for g, s in zip(grads, sums):
            if g is not None:
                s.assign_add(tf.cast(tf.convert_to_tensor(g), s.dtype))
        count.assign_add(1)
        n = ex.accumulate

        def update() -> Any:
            means = [None if g is None else tf.cast(s / n, g.dtype) for g, s in zip(grads, sums)]
            super(_AllreduceGradients, self).apply(ex.average(means), variables)  # type: ignore[misc]
            for s in sums:
                s.assign(tf.zeros_like(s))
            return tf.constant(True)

        # The same micro-step on every rank (equal steps per epoch), so every rank exchanges together.
        return tf.cond(count % n == 0, update, lambda: tf.constant(False))


class _Exchange:
    """The per-optimizer MPI side of the hook: the reduction itself, control votes and timers.

    Besides the gradients, the buffer carries three extra numbers, this rank's interrupt, stop and
    non-finite-gradient votes, so that a collective stop (``StopOnInterrupt``) costs no extra
    message: after each step every rank knows whether any rank asked to stop, or met a NaN or an
    infinity, and stops at the same step.

    The gradients travel as separate tensors into one ``tf.numpy_function`` and come back as
    separate arrays: packing happens once, in NumPy, straight into a persistent MPI buffer (scaled
    by ``1/size`` on the way in), and the results are views of that buffer. A concat and a split in
    TensorFlow would each copy every gradient once more.
    """

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.fused = True  # False: one Allreduce per variable (kept for the benchmark)
        self.votes = (0.0, 0.0)  # this rank's (interrupt, stop) votes for the next step
        self.interrupt_requested = False  # sticky until read: some rank voted in a reduced step
        self.stop_requested = False
        self.check_finite = True  # False under a LossScaleOptimizer, whose overflow steps are normal
        self.nonfinite_steps = 0
        self.seconds = 0.0  # in the exchange, waiting included
        self.wait_seconds = 0.0  # of which waiting for the slowest rank to arrive
        self.calls = 0
        self.error: BaseException | None = None  # what interrupted the last exchange, for fit to raise
        self.accumulate = 1  # local steps summed before one exchange
        self._packers: dict[tuple, Packer] = {}
        self._sums: dict[tuple, tuple[list[Any], Any]] = {}

    def sums_for(self, variables: list[Any]) -> tuple[list[Any], Any]:
        """Gradient sums for ``variables`` and the micro-step counter, made on first use.

        Plain TensorFlow variables, not optimizer state: between updates they hold a partial sum
        that no checkpoint or broadcast should carry (``fit`` ends every epoch on an update)."""
        import tensorflow as tf

        key = tuple(id(v) for v in variables)
        if key not in self._sums:
            def wide(v: Any) -> Any:
                dtype = tf.float32 if v.dtype in (tf.float16, tf.bfloat16, "float16", "bfloat16") else v.dtype
                return tf.Variable(tf.zeros(v.shape, dtype=dtype), trainable=False)

            self._sums[key] = ([wide(v) for v in variables], tf.Variable(0, dtype=tf.int64, trainable=False))
        return self._sums[key]

    def average(self, grads: list[Any]) -> list[Any]:
        import tensorflow as tf

        if _in_xla_context():
            raise RuntimeError(
                "mpinb's DistributedOptimizer cannot run inside an XLA-compiled step (its MPI "
                "Allreduce is a Python call XLA cannot compile). Compile the model with "
                "jit_compile=False; mpinb.keras.fit does this for you."
            )
        if self.comm.Get_size() == 1:
            return grads  # nothing to average: one rank trains exactly like plain Keras
        present = [i for i, g in enumerate(grads) if g is not None]
        # A None gradient (a variable the loss does not reach) is a property of the traced graph,
        # identical on every rank, so skipping it keeps the buffer layout the same everywhere and
        # leaves Keras's own handling of missing gradients unchanged.
        dense = []
        for i in present:
            g = grads[i]
            if isinstance(g, tf.IndexedSlices):
                g = tf.convert_to_tensor(g)  # sparse (embedding) gradients: same dense layout everywhere
            if g.dtype in (tf.float16, tf.bfloat16):
                g = tf.cast(g, tf.float32)  # summed in float32: half precision would lose the small terms
            dense.append(g)
        if not dense:
            return grads
        calls = [dense] if self.fused else [[g] for g in dense]
        reduced: list[Any] = []
        for call in calls:
            outs = tf.numpy_function(
                self._reduce, call, [g.dtype for g in call], stateful=True, name="mpinb_allreduce"
            )
            for g, out in zip(call, outs):
                out.set_shape(g.shape)
                reduced.append(out)
        out_grads = list(grads)
        for i, r in zip(present, reduced):
            out_grads[i] = r if r.dtype == grads[i].dtype else tf.cast(r, grads[i].dtype)
        return out_grads

    def _reduce(self, *grads: np.ndarray) -> list[np.ndarray]:
        """Runs on a TensorFlow thread once per step (or per variable when unfused)."""
        t0 = time.perf_counter()
        key = tuple((g.shape, g.dtype.str) for g in grads)
        packer = self._packers.get(key)
        if packer is None:
            packer = self._packers[key] = Packer(grads)
        bufs = packer.fill(grads, 1.0 / self.comm.Get_size(), self.votes)
        try:
            self.wait_seconds += sum_over_ranks(bufs, packer.layout, self.comm, "gradient exchange")
        except BaseException as err:
            # TensorFlow re-raises errors from inside a step as its own UnknownError; keep the
            # original (a CollectiveTimeout naming the missing rank) for mpinb.keras.fit to raise.
            self.error = err
            raise
        interrupt, stop, nonfinite = bufs.buffers[0][-3:]
        self.interrupt_requested |= bool(interrupt > 0)
        self.stop_requested |= bool(stop > 0)
        if nonfinite > 0:
            self.nonfinite_steps += 1
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        return packer.unpack(bufs)


def _distributed_class(base: type) -> type:
    cls = _CLASSES.get(base)
    if cls is not None:
        return cls

    class Distributed(_AllreduceGradients, base):  # type: ignore[valid-type, misc]
        pass

    # Same name and module as the wrapped class: Keras serialises the optimizer by class name, so a
    # model saved with the wrapper reloads in plain Keras as the original optimizer.
    Distributed.__name__ = base.__name__
    Distributed.__qualname__ = base.__qualname__
    Distributed.__module__ = base.__module__
    Distributed.__doc__ = base.__doc__
    _serialise_as(base, Distributed)
    _CLASSES[base] = Distributed
    return Distributed


def _serialise_as(base: type, cls: type) -> None:
    """Make Keras serialise ``cls`` exactly as ``base``, while loading still gives ``base``.

    Keras writes a class under a custom name given by ``keras.saving.register_keras_serializable``
    ("package>Name"), under the exported API name for its own classes ("keras.optimizers" /
    "SGD"), or else under its module and class name, which ``cls`` already shares with ``base``.
    """
    import keras

    name = keras.saving.get_registered_name(base)  # the bare class name when not registered
    if ">" in name:
        package, _, short = name.partition(">")
        # Registering writes both directions: cls -> name (wanted: the wrapper saves under base's
        # name) and name -> cls (not wanted: a reloaded model must get the plain base, which has no
        # MPI exchange). get_custom_objects() is Keras's live name -> class dict; put it back.
        objects = keras.saving.get_custom_objects()
        previous = objects.get(name)
        keras.saving.register_keras_serializable(package, short)(cls)
        if previous is None:
            objects.pop(name, None)
        else:
            objects[name] = previous
    _alias_exported_name(base, cls)


def _alias_exported_name(base: type, cls: type) -> None:
    """Give ``cls`` the exported API name of ``base`` (``keras.optimizers.SGD``), if it has one.

    Private Keras API, confined here: Keras looks the exported name up by class object in
    ``keras.src.api_export.REGISTERED_OBJS_TO_NAMES``, which no public function sets. Only the
    class -> name direction is written, so loading that name still gives ``base``. Fallback, if the
    registry moves: ``cls`` is written under ``base``'s module path
    (``keras.src.optimizers.sgd.SGD``), which plain Keras also loads as ``base``.
    """
    try:
        from keras.src import api_export

        names = api_export.REGISTERED_OBJS_TO_NAMES
    except (ImportError, AttributeError):
        return
    if isinstance(names, dict) and base in names:
        names[cls] = names[base]


def _built_for(optimizer: Any) -> list[Any]:
    """The model variables a built ``optimizer`` was built for, to build its wrapper for the same.

    Private Keras API, confined here: ``build(variables)`` is public but nothing public gives the
    list back; Keras keeps it in ``_trainable_variables``. Fallback, if that moves: a clear error
    asking for the optimizer to be wrapped before it is built, when there is no state to copy.
    """
    variables = getattr(optimizer, "_trainable_variables", None)
    if variables is None:
        raise RuntimeError(
            f"DistributedOptimizer cannot copy the state of an already built {type(optimizer).__name__} "
            "with this Keras version; wrap the optimizer before training, e.g. "
            "model.compile(optimizer=DistributedOptimizer(keras.optimizers.Adam(1e-3)), ...)."
        )
    return list(variables)


def _in_xla_context() -> bool:
    """Whether the step being traced is XLA-compiled (``jit_compile=True``).

    Private TensorFlow API, confined here: TensorFlow has no public test for it. Fallback, if the
    helper moves: ``False``, so there is no early check and XLA itself refuses the Python call.
    """
    try:
        import tensorflow as tf
        from tensorflow.python.ops import control_flow_util

        return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))
    except Exception:  # noqa: BLE001 - a missing private helper just means no early check
        return False
