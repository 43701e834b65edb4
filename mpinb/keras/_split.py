"""fit's train step with the gradient exchange out of the graph: one traced call computes the step
and packs its gradients, NumPy averages them over the ranks in that packed buffer, a second traced
call applies them.

Local (the exchange it calls is collective). Inside the graph the exchange is a
``tf.numpy_function``: TensorFlow hands the gradients over and takes the averages back through
its Python-call op (measured at about 0.28 ms each way on this project's CPU, the larger part of
an exchange of 2.7 MB that costs 3.2x a plain Allreduce). Out of the graph the gradients leave as
the traced call's output and come back as the next call's input: no Python call inside a graph.

The packed buffer is the exchange's own: it is a concatenation of several tensors (the gradients
and a rows slot), which TensorFlow always writes into a new buffer, that only this step's caller
holds; its rows slot is read from a variable as the step runs, so it can never be folded into a
constant. Averaging in place there is therefore safe, and the averages reach the second call
without a copy. What the exchange needs of each step is the same as inside the graph: this rank's
rows, the votes, the finiteness check, the row weights (:meth:`GradientExchange.reduce_packed`),
so a split step updates the weights bit for bit as the in-graph one does.

Where it cannot split, fit keeps the in-graph exchange (:func:`why_not_split` says why): one rank,
accumulation, several steps per execution (one traced call runs them all), steps without rows
(their update runs inside a ``tf.cond``), a model with its own ``train_step`` (it may use the
weights after its update), eager mode, or a GPU (where the gradients are packed on the device).
"""

from __future__ import annotations

from typing import Any

__all__ = ["SplitStep", "why_not_split"]


def why_not_split(model: Any, exchange: Any, skip_empty: bool) -> str | None:
    """Why fit's steps keep the exchange in the graph, or ``None`` when they can split. Local."""
    import tensorflow as tf

    from mpinb.keras import _compat

    choice = exchange.split_step
    if choice is False:
        return "asked not to"
    if exchange.pack_in_graph is not None:
        return "the exchange is asked to pack in the graph"
    if choice is None and tf.config.list_logical_devices("GPU"):
        return "TensorFlow has a GPU: gradients are packed on the device"
    if not exchange.carries_votes:
        return "one rank exchanges nothing"
    if exchange.accumulate > 1:
        return "gradient accumulation updates inside a tf.cond"
    if skip_empty:
        return "this rank has steps without rows, whose update runs inside a tf.cond"
    if int(getattr(model, "steps_per_execution", 1) or 1) > 1:
        return "several steps per execution run in one traced call"
    if model.run_eagerly or model.jit_compile:
        return "the model runs eagerly or under XLA"
    if not model.trainable_weights:
        return "the model has no trainable weights"
    if _compat.overrides_train_step(model):
        return "the model has its own train_step"
    return None


class SplitStep:
    """The halves of one train step around the exchange (see the module's docstring).

    :meth:`capture` is called while the first half is traced, by the DistributedOptimizer's
    ``apply`` in place of the update: it packs the gradients and keeps, for the second half,
    where each one lies in the packed buffer. :meth:`train_function` wraps Keras's own traced
    step so that each call exchanges and applies.
    """

    def __init__(self, optimizer: Any, exchange: Any) -> None:
        self.optimizer = optimizer
        self.exchange = exchange
        self.packed: Any = None  # the traced step's packed gradients, handed over while it is traced
        self._layout: tuple[list[int | None], list[Any], list[Any], Any, list[Any]] | None = None
        self._apply: Any = None

    def capture(self, grads: list[Any], variables: Any, rows: Any) -> None:
        """Pack ``grads`` (traced) into one new flat tensor ending in a rows slot; keep its layout."""
        import tensorflow as tf

        if self.packed is not None:
            raise RuntimeError("mpinb's split train step saw the optimizer applied twice in one step; "
                               "give the model's train_step to fit unsplit (see mpinb.keras._split).")
        dense: list[Any] = []
        place: list[int | None] = []
        for g in grads:
            if g is None:  # a variable the loss does not reach: the same on every rank
                place.append(None)
                continue
            if isinstance(g, tf.IndexedSlices):
                g = tf.convert_to_tensor(g)
            if g.dtype in (tf.float16, tf.bfloat16):
                g = tf.cast(g, tf.float32)  # summed in float32, as in the graph
            place.append(len(dense))
            dense.append(g)
        dtype = dense[0].dtype
        if any(g.dtype != dtype for g in dense) or not all(g.shape.is_fully_defined() for g in dense):
            raise RuntimeError("mpinb's split train step needs gradients of one dtype and static shapes")
        slot = self.exchange.rows_slot(dtype, rows)
        self.packed = tf.concat([tf.reshape(g, [-1]) for g in dense] + [slot], axis=0)
        variables = list(variables) if variables is not None else list(self.optimizer.trainable_variables)
        self._layout = (place, [g.shape for g in dense], [None if g is None else g.dtype for g in grads], dtype,
                        variables)

    def take_packed(self) -> Any:
        """The packed gradients of the step being traced, once."""
        packed, self.packed = self.packed, None
        if packed is None:
            raise RuntimeError("mpinb's split train step traced no update: the optimizer was never applied")
        return packed

    def train_function(self, keras_function: Any) -> Any:
        """``model.train_function`` for Keras's ``fit``: Keras's traced step (returning the logs
        and the packed gradients), the exchange in place, the traced update."""
        import tensorflow as tf

        from mpinb.keras import _compat

        exchange = self.exchange

        @tf.function
        def apply(summed: Any) -> None:
            assert self._layout is not None, "the first half is traced before the second runs"
            place, shapes, dtypes, _, variables = self._layout
            sizes = [s.num_elements() for s in shapes]
            *parts, _ = tf.split(summed, [*sizes, 1])
            grads = [None if i is None else tf.cast(tf.reshape(parts[i], shapes[i]), dtypes[n])
                     for n, i in enumerate(place)]
            self.optimizer._mpinb_apply_averaged(grads, variables)

        def step(iterator: Any) -> Any:
            logs, packed = keras_function(iterator)
            exchange.reduce_packed(_compat.host_view(packed))  # the step's own buffer, averaged in place
            apply(packed)
            return logs

        step.split = self  # type: ignore[attr-defined]
        return step
