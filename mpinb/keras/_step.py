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

    def rows(self) -> int:
        """The rows counted so far (a read of the variable)."""
        return int(self.seen.numpy())

    def install(self, model: Any, *, exchange: Any = None, guard: list[Any] | None = None) -> None:
        """Wrap ``model.train_step`` (an instance attribute over the class's method) and retrace."""
        import tensorflow as tf

        original = model.train_step
        guarded = list(guard or [])
        seen = self.seen

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
                out = original(data)
            finally:
                if exchange is not None:
                    exchange.step_rows = None  # a trace-time handoff: no graph tensor outlives its trace
            for v, b in zip(guarded, before):
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
