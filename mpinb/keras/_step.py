"""fit's wrapper around the model's train step: each step's rows, counted, and BatchNorm statistics
kept through steps without rows.

Local. ``train_step`` is Keras's public override point of the training loop, and the only place that
sees a step's batch: the optimizer hook gets gradients only. A pipeline's batches are its own, so the
rows a rank's gradient stands for are known only as the step runs; the wrapper hands them to the
gradient exchange while the step is traced, and counts them for the weight strategy's row-weighted
averages and the epoch logs.
"""

from __future__ import annotations

from typing import Any

import keras

from mpinb.keras import _compat

__all__ = ["StepRows"]

# The model's attribute holding the wrapped step its last completed fit traced, with what that
# trace depends on: a fit of the same model in the next cell reuses it instead of tracing again
# (the trace is most of a short fit's time: at 1 rank, a one-epoch refit of a small MLP took
# 0.42 s against Keras's 0.11 s). On the model, not in a table of models: the trace refers to the
# model, so a table would keep every model alive.
KEPT = "_mpinb_kept_step"


class StepRows:
    """Installed on a model while ``fit`` runs (:meth:`install`, :meth:`remove`).

    ``seen`` is a variable counting the rows this rank's steps took (as Keras counts them for its
    loss tracker: the leading dimension of the first input); read it between steps. With an
    ``exchange``, each traced step's rows tensor is its ``step_rows`` while the step is traced, so
    the optimizer hook inside the same step can send it along with the gradients. ``guard`` lists
    variables (BatchNorm moving statistics) that a step without rows here must leave as they
    were: the mean and variance of an empty batch are NaN.
    """

    def __init__(self) -> None:
        import tensorflow as tf

        self.seen = tf.Variable(0, dtype=tf.int64, trainable=False, name="mpinb_rows_seen")
        self.depends: tuple[tuple[Any, ...], tuple[Any, ...]] | None = None  # see enter()

    @classmethod
    def enter(cls, model: Any, *, exchange: Any = None, guard: list[Any] | None = None,
              skip_empty: bool = False) -> StepRows:
        """A counter installed on ``model`` for one fit: the one its last completed fit traced, with
        that trace, when nothing the trace depends on has changed since, else a new one (retraced).

        A trace depends on the objects it closes over or calls (the exchange, the optimizer, the
        compiled loss and metrics, the guarded variables) and on values read while tracing (the
        exchange's weighting and accumulation, steps per execution, XLA, eager mode)."""
        guard = list(guard or [])
        generation = _compat.compile_generation(model)
        depends = None if generation is None else (
            (exchange, model.optimizer, generation, *guard),
            (None if exchange is None else (exchange.by_batch, exchange.accumulate),
             getattr(model, "steps_per_execution", 1), model.jit_compile, model.run_eagerly, len(guard), skip_empty),
        )
        kept = vars(model).pop(KEPT, None)
        if depends is not None and kept is not None and _same(kept[0].depends, depends):
            counter, step, function = kept
            counter.seen.assign(0)
            model.train_step = step
            _compat.use_traced_step(model, function)
            return counter
        counter = cls()
        counter.depends = depends
        counter.install(model, exchange=exchange, guard=guard, skip_empty=skip_empty)
        return counter

    def leave(self, model: Any, *, completed: bool) -> None:
        """Give the model its own train step back; after a completed fit, keep this fit's trace
        for the next (:meth:`enter`). After an error or an interrupt the next fit traces afresh."""
        function = _compat.traced_step(model)
        if completed and self.depends is not None and function is not None and "train_step" in vars(model):
            # Past Keras's attribute tracking (it would look for variables and layers in it).
            object.__setattr__(model, KEPT, (self, vars(model)["train_step"], function))
        StepRows.remove(model)

    def rows(self) -> int:
        """The rows counted so far (a read of the variable)."""
        return int(self.seen.numpy())

    def install(self, model: Any, *, exchange: Any = None, guard: list[Any] | None = None,
                skip_empty: bool = False) -> None:
        """Wrap ``model.train_step`` (an instance attribute over the class's method) and retrace.

        With ``skip_empty`` (this rank may have steps without rows), a step of no rows never runs
        the model: TensorFlow's kernels are not all defined on empty tensors (with oneDNN, the
        gradient of MaxPooling over 0 rows aborts the process), and there is nothing to learn from
        it. It applies zero gradients instead, so the gradient exchange still runs (this rank's weight
        is its 0 rows), every rank takes the same update and the optimizer counts the step; metrics
        and BatchNorm statistics stay as they were."""
        import tensorflow as tf

        original = model.train_step
        guarded = list(guard or [])
        seen = self.seen
        if skip_empty and model.optimizer is not None and not model.optimizer.built:
            # Built now, outside the traced step: the update runs inside a tf.cond branch, where no
            # variable may be created.
            model.optimizer.build(model.trainable_variables)
        outputs: list[Any] = []  # the structure of the step's own output, from the branch that runs it

        def with_rows(data: Any) -> Any:
            out = original(data)
            outputs.append(keras.tree.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), out))
            return out

        def without_rows() -> Any:
            variables = list(model.trainable_weights)
            if variables and model.optimizer is not None:
                model.optimizer.apply_gradients(zip([tf.zeros_like(v) for v in variables], variables, strict=True))
            return _unchanged_logs(model, outputs[-1])

        def train_step(data: Any) -> Any:
            x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
            first = next(leaf for leaf in keras.tree.flatten(x) if leaf is not None)
            rows = tf.cast(tf.shape(first)[0], tf.int64)
            # Read before the step: automatic control dependencies order it before BatchNorm's update.
            before = [tf.identity(v.value) for v in guarded]
            seen.assign_add(rows)
            if exchange is not None:
                exchange.step_rows = tf.cast(rows, tf.float32)
            try:
                if skip_empty:
                    # The branch with rows is traced first (tf.cond's order): it gives the structure.
                    out = tf.cond(rows > 0, lambda: with_rows(data), without_rows)
                else:
                    out = original(data)
            finally:
                if exchange is not None:
                    exchange.step_rows = None  # a trace-time handoff: no graph tensor outlives its trace
            for v, b in zip(guarded, before, strict=True):
                v.assign(tf.where(tf.math.is_finite(v.value), v.value, b))
            return out

        model.train_step = train_step
        _compat.retrace(model)

    @staticmethod
    def remove(model: Any) -> None:
        """Give the model its own train step back."""
        if "train_step" in vars(model):
            del model.train_step
            _compat.retrace(model)


def _unchanged_logs(model: Any, specs: Any) -> Any:
    """What a step without rows returns in place of the step's own output (``specs``: its
    structure): each metric's current result (Keras's own step returns them by name), zeros for
    anything else."""
    import tensorflow as tf

    results = model.get_metrics_result() if isinstance(specs, dict) else {}

    def value(name: Any, spec: Any) -> Any:
        found = results.get(name)
        if found is not None:
            found = tf.cast(tf.convert_to_tensor(found), spec.dtype)
            if found.shape == spec.shape:
                return found
        return tf.zeros(spec.shape, spec.dtype)

    if isinstance(specs, dict):
        return {k: value(k, spec) for k, spec in specs.items()}
    return keras.tree.map_structure(lambda spec: tf.zeros(spec.shape, spec.dtype), specs)


def _same(a: tuple[tuple[Any, ...], tuple[Any, ...]] | None, b: tuple[tuple[Any, ...], tuple[Any, ...]]) -> bool:
    """The same objects (identity) and the same values."""
    if a is None or len(a[0]) != len(b[0]):
        return False
    return all(x is y for x, y in zip(a[0], b[0], strict=True)) and a[1] == b[1]
