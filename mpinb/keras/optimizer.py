"""`DistributedOptimizer`: average gradients over all ranks every step with one fused Allreduce."""

from __future__ import annotations

from typing import Any

from mpinb._checks import check_int, default_comm
from mpinb._training.exchange import GradientExchange
from mpinb.keras import _compat

__all__ = ["DistributedOptimizer", "exchange_of", "is_distributed"]

# One subclass per wrapped optimizer class, so wrapping twice gives the same class (isinstance and
# Keras's own class checks keep working).
_CLASSES: dict[type, type] = {}


def DistributedOptimizer(optimizer: Any, *, accumulate_steps: int = 1, comm: Any = None) -> Any:  # noqa: N802
    """Wrap a Keras 3 optimizer so that gradients are averaged over all ranks before every update.

    Local to build; the returned optimizer is collective in use: every rank must train the same
    model with the same number of steps (``mpinb.keras.fit`` guarantees this). The hook is
    ``optimizer.apply``, which Keras's ``fit``, ``train_on_batch`` and custom loops calling
    ``apply_gradients`` all reach; inside it one ``tf.numpy_function`` packs all gradients into one
    buffer, multiplying each by this rank's share of the global batch as it is copied in (``1 /
    size``, or under ``mpinb.keras.fit`` with proportional shards the step's local rows over the
    global batch), and sums once: the sum of the scaled gradients is the mean over the global
    batch, so nothing is divided afterwards. Where TensorFlow has a GPU the gradients are packed
    on the device instead, and cross to the host and back once per step. (Half-precision
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
        wrapped.build(_compat.built_for(optimizer))
        for mine, theirs in zip(wrapped.variables, optimizer.variables, strict=True):
            mine.assign(theirs)
    wrapped._mpinb_exchange = TensorExchange(
        default_comm(comm),
        accumulate=check_int(accumulate_steps, "accumulate_steps", minimum=1),
        check_finite=not isinstance(optimizer, keras.optimizers.LossScaleOptimizer),
    )
    return wrapped


def is_distributed(optimizer: Any) -> bool:
    """Whether ``optimizer`` averages its gradients over ranks (was made by DistributedOptimizer).

    Local.
    """
    return isinstance(optimizer, _AllreduceGradients)


def exchange_of(optimizer: Any) -> TensorExchange | None:
    """The gradient exchange of a DistributedOptimizer (its votes, timers and accumulation), or
    ``None`` for any other optimizer. Local.

    The one way to reach it: ``fit`` takes it here and hands it to what needs it, and
    :class:`~mpinb.keras.StopOnInterrupt` takes it here at train begin.
    """
    return optimizer._mpinb_exchange if is_distributed(optimizer) else None


class _AllreduceGradients:
    """Mixin placed in front of a Keras optimizer class: averages gradients inside ``apply``."""

    _mpinb_exchange: TensorExchange

    def apply(self, grads: Any, trainable_variables: Any = None) -> Any:
        grads = list(grads)
        ex = self._mpinb_exchange
        if grads and ex.accumulate > 1:
            return self._mpinb_accumulate(grads, trainable_variables)
        if grads:
            grads = ex.average(grads, ex.batch_rows())
        return super().apply(grads, trainable_variables)  # type: ignore[misc]

    def _mpinb_accumulate(self, grads: list[Any], trainable_variables: Any) -> Any:
        """Add this micro-step's gradients to the sums; every N-th, average the sums over the
        micro-steps and the ranks (one exchange) and update."""
        import tensorflow as tf

        ex = self._mpinb_exchange
        variables = list(trainable_variables) if trainable_variables is not None else _compat.built_for(self)
        sums, count, window = ex.sums_for(variables)
        rows = ex.batch_rows()
        if rows is None:
            # Each micro-step's mean gradient weighted by its share of the update's rows (1/n with
            # equal batches).
            weight = tf.numpy_function(ex.micro_weight, [], tf.float32, stateful=True, name="mpinb_micro_weight")
        else:
            # Weighted by its rows; the exchange divides by the update's rows over every rank.
            weight = rows
            window.assign_add(rows)
        # multiply_no_nan: a micro-step without rows here (weight 0) adds nothing, even the NaN an
        # empty batch's BatchNorm makes.
        for g, s in zip(grads, sums, strict=True):
            if g is not None:
                scaled = tf.math.multiply_no_nan(tf.cast(tf.convert_to_tensor(g), s.dtype), tf.cast(weight, s.dtype))
                s.assign_add(scaled)
        count.assign_add(1)
        n = ex.accumulate

        def update() -> Any:
            means = [None if g is None else tf.cast(s, g.dtype) for g, s in zip(grads, sums, strict=True)]
            averaged = ex.average(means, None if rows is None else window.value())
            super(_AllreduceGradients, self).apply(averaged, variables)  # type: ignore[misc]
            for s in sums:
                s.assign(tf.zeros_like(s))
            window.assign(0.0)
            return tf.constant(True)

        # The same micro-step on every rank (equal steps per epoch), so every rank exchanges together.
        return tf.cond(count % n == 0, update, lambda: tf.constant(False))


class TensorExchange(GradientExchange):
    """The TensorFlow side of the gradient exchange: the step's gradients cross into NumPy once.

    On a CPU the gradients travel as separate tensors into one ``tf.numpy_function`` and come back
    as separate arrays: :meth:`GradientExchange.reduce` packs them once, in NumPy, straight into a
    persistent MPI buffer, and returns views of it (a concat and a split in TensorFlow would each
    copy every gradient once more). Where TensorFlow has a GPU they are packed on the device and
    cross once each way (:meth:`_packs_in_graph`).
    """

    # None: pack in the graph where TensorFlow has a GPU (see _packs_in_graph); True or False: always
    # or never. Read when a step is traced.
    pack_in_graph: bool | None = None

    def __init__(self, comm: Any, *, accumulate: int = 1, check_finite: bool = True) -> None:
        super().__init__(comm, accumulate=accumulate, check_finite=check_finite)
        self._sums: dict[tuple, tuple[list[Any], Any, Any]] = {}
        # This rank's rows in the step being traced, handed over by fit's train step wrapper
        # (mpinb.keras._step) while that step is traced.
        self.step_rows: Any = None
        self._slots: dict[Any, Any] = {}  # by dtype, the packed array's last element, read at run time

    def batch_rows(self) -> Any:
        """The traced step's rows when gradients are weighted by them as the step runs
        (:meth:`weigh_by_batch`), else ``None``."""
        if not self.by_batch:
            return None
        if self.step_rows is None:
            raise RuntimeError("the gradient exchange weighs by each step's rows, but this step was not traced "
                               "by mpinb.keras.fit's train step; call the optimizer from fit.")
        return self.step_rows

    def sums_for(self, variables: list[Any]) -> tuple[list[Any], Any, Any]:
        """Gradient sums for ``variables``, the micro-step counter and the rows summed since the
        last update (weighing by batch), made on first use.

        Plain TensorFlow variables, not optimizer state: between updates they hold a partial sum
        that no checkpoint or broadcast should carry (``fit`` ends every epoch on an update)."""
        import tensorflow as tf

        key = tuple(id(v) for v in variables)
        if key not in self._sums:
            def wide(v: Any) -> Any:
                dtype = tf.float32 if v.dtype in (tf.float16, tf.bfloat16, "float16", "bfloat16") else v.dtype
                return tf.Variable(tf.zeros(v.shape, dtype=dtype), trainable=False)

            self._sums[key] = ([wide(v) for v in variables], tf.Variable(0, dtype=tf.int64, trainable=False),
                               tf.Variable(0.0, dtype=tf.float32, trainable=False))
        return self._sums[key]

    def average(self, grads: list[Any], rows: Any = None) -> list[Any]:
        """The gradients averaged over the ranks, inside the traced step; ``None`` stays ``None``.
        With ``rows`` (:meth:`weigh_by_batch`: this rank's rows, which the gradients are the mean
        of, or with accumulation the row-weighted sum over), weighted by every rank's rows."""
        import tensorflow as tf

        if _compat.in_xla_context():
            raise RuntimeError(
                "mpinb's DistributedOptimizer cannot run inside an XLA-compiled step (its MPI "
                "Allreduce is a Python call XLA cannot compile). Compile the model with "
                "jit_compile=False; mpinb.keras.fit does this for you."
            )
        if not self.carries_votes:
            if rows is None or self.accumulate == 1:
                return grads  # nothing to average: one rank trains exactly like plain Keras
            # Accumulated sums weighted by rows: their mean over the update's rows.
            return [None if g is None else tf.math.divide_no_nan(g, tf.cast(rows, g.dtype)) for g in grads]
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
        if self._packs_in_graph(dense):
            reduced = self._reduce_packed(dense, rows)
        else:
            inputs = dense if rows is None else [*dense, tf.cast(rows, dense[0].dtype)]
            reduced = tf.numpy_function(self.reduce, inputs, [g.dtype for g in dense], stateful=True,
                                        name="mpinb_allreduce")
        out_grads = list(grads)
        for i, g, r in zip(present, dense, reduced, strict=True):
            r.set_shape(g.shape)
            out_grads[i] = r if r.dtype == grads[i].dtype else tf.cast(r, grads[i].dtype)
        return out_grads

    def _packs_in_graph(self, dense: list[Any]) -> bool:
        """Whether this step's gradients are packed by TensorFlow, where they are, into one array
        that crosses to NumPy once (:meth:`_reduce_packed`); otherwise each crosses on its own and
        NumPy packs them (:meth:`GradientExchange.reduce`).

        Packed in the graph where TensorFlow has a GPU: the packing then runs on the device, and the
        gradients make one copy to the host and one back per step instead of one per variable, with
        no copy on the host. On a CPU NumPy packs faster (scaling, checking and copying in one pass,
        where TensorFlow's concatenation is a pass of its own). The same dtype and static shapes
        throughout, or NumPy packs. :attr:`pack_in_graph` overrides the choice (the tests pack in
        the graph on a CPU)."""
        import tensorflow as tf

        if len({g.dtype for g in dense}) != 1 or not all(g.shape.is_fully_defined() for g in dense):
            return False
        if self.pack_in_graph is not None:
            return bool(self.pack_in_graph)
        return bool(tf.config.list_logical_devices("GPU"))

    def _reduce_packed(self, dense: list[Any], rows: Any) -> list[Any]:
        """The gradients packed by one concatenation, averaged by :meth:`GradientExchange.reduce_packed`
        in place, and split back where they came from.

        The concatenation is the array's one owner, as ``reduce_packed`` needs: a concatenation of
        several tensors always writes a new buffer, only the ``numpy_function`` made here reads it,
        and its last element (the rows slot, or a variable's value) is read as the step runs, so
        TensorFlow can never fold the concatenation into a constant, even of constant gradients."""
        import tensorflow as tf

        dtype = dense[0].dtype
        if dtype not in self._slots:
            with tf.init_scope():  # made outside the step being traced, so any trace may make it
                self._slots[dtype] = tf.Variable(tf.zeros([1], dtype), trainable=False, name="mpinb_exchange_slot")
        if rows is not None:
            # Through the variable too: a step without rows sends zero gradients, and where its
            # pipeline's batches have a static 0 rows the rows are a constant as well.
            self._slots[dtype].assign(tf.reshape(tf.cast(rows, dtype), [1]))
        slot = self._slots[dtype].read_value()
        sizes = [g.shape.num_elements() for g in dense]
        packed = tf.concat([tf.reshape(g, [-1]) for g in dense] + [slot], axis=0)
        summed = tf.numpy_function(self.reduce_packed, [packed], dtype, stateful=True, name="mpinb_allreduce")
        summed.set_shape(packed.shape)
        *parts, _ = tf.split(summed, [*sizes, 1])
        return [tf.reshape(part, g.shape) for part, g in zip(parts, dense, strict=True)]


def _distributed_class(base: type) -> Any:
    cls = _CLASSES.get(base)
    if cls is not None:
        return cls

    class Distributed(_AllreduceGradients, base):
        pass

    # Same name and module as the wrapped class: Keras serialises the optimizer by class name, so a
    # model saved with the wrapper reloads in plain Keras as the original optimizer.
    Distributed.__name__ = base.__name__
    Distributed.__qualname__ = base.__qualname__
    Distributed.__module__ = base.__module__
    Distributed.__doc__ = base.__doc__
    _compat.serialise_as(base, Distributed)
    _CLASSES[base] = Distributed
    return Distributed
