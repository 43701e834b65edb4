"""One-process references for data-parallel Keras training: what N ranks compute, step by step.

Shared by the tests in this folder that check ``mpinb.keras`` exactly against one process. Nothing
here communicates except :func:`once`; Keras and TensorFlow are imported only by the functions that train.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

import mpinb

__all__ = ["fresh", "once", "proportional_batches", "proportional_reference", "relative_error", "sharded_order",
           "sharded_reference", "snapshot", "spike", "weights_of"]

# One compiled reference model per architecture and optimizer, per process (see ``fresh``).
_REUSED: dict[str, tuple[Any, list[np.ndarray]]] = {}


def weights_of(model) -> np.ndarray:
    return np.concatenate([np.ravel(w) for w in model.get_weights()])


def snapshot(model) -> list[np.ndarray]:
    """``model.get_weights()``, copied: TensorFlow may hand out views of the variables' buffers,
    which the model's training then overwrites."""
    return [np.array(w, copy=True) for w in model.get_weights()]


def fresh(key: str, build, weights: Sequence[np.ndarray]):
    """``build()``'s compiled model, in the state of a new one whose weights are ``weights``.

    Local. Keras traces ``fit``'s train step once per model, and that tracing, not the training,
    is most of what a one-process reference costs. So the first call per ``key`` (one architecture,
    loss, metrics and optimizer) builds the model and its optimizer and records the optimizer's
    initial state (step counter, learning rate, zero slots); later calls put that state and
    ``weights`` back into the same model, whose traced step Keras reuses. ``build`` must give the
    same architecture and optimizer for the same ``key``.
    """
    if key not in _REUSED:
        model = build()
        model.optimizer.build(model.trainable_variables)
        _REUSED[key] = (model, [np.array(v.numpy(), copy=True) for v in model.optimizer.variables])
    model, initial = _REUSED[key]
    for variable, value in zip(model.optimizer.variables, initial, strict=True):
        variable.assign(value)
    model.set_weights(weights)
    model.stop_training = False
    return model


def once(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` computed on rank 0 alone, its result (NumPy arrays, lists) on every rank.

    Collective. A one-process reference is the same computation on every rank, and tracing and
    running it dominates these tests: with 4 ranks on 2 cores, every rank doing it took twice the
    wall time of one. The other ranks wait in mpinb's collective wait, which sleeps, so rank 0 has
    a core to itself. Return plain values only: a model does not cross ranks.
    """
    return mpinb.on_root(fn, *args, **kwargs)


def relative_error(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def sharded_order(n_total: int, per_rank: int, size: int) -> np.ndarray:
    """Row order in which :func:`sharded_reference` sees what ``size`` ranks train on, unshuffled.

    Rank r holds the contiguous shard ``mpinb.shard`` gives it and, with ``shuffle=False``, trains at
    step k on its k-th run of ``per_rank`` rows; step k of the reference is those runs in rank order.
    """
    bounds = [mpinb.shard_bounds(n_total, rank=r, size=size) for r in range(size)]
    steps = min((hi - lo) // per_rank for lo, hi in bounds)
    return np.concatenate(
        [np.arange(lo + k * per_rank, lo + (k + 1) * per_rank) for k in range(steps) for lo, _ in bounds]
    )


def sharded_reference(model, X, y, per_rank: int, epochs: int, size: int, *,
                      rank_states: Sequence[Sequence[Any]] | None = None):
    """One process doing what ``size`` data-parallel ranks do, step by step.

    At each step rank r's sub-batch is rows ``[r*per_rank, (r+1)*per_rank)`` of the global batch.
    Each sub-batch is normalised with its own BatchNorm statistics (as on its rank), gradients are
    averaged over sub-batches, and the moving statistics become the mean of what each rank would
    hold: the moving average is linear, so averaging at each step equals averaging at epoch end.
    Returns the per-epoch mean loss over all sub-batches (what MetricAverage reports).

    Integer non-trainable state (the seed of each Dropout layer's SeedGenerator) is never averaged:
    each simulated rank keeps its own and draws its masks from it, as a rank does; SyncNonTrainable
    averages floating-point variables only. ``rank_states`` gives each rank's integer state at the
    start, in rank order and in ``model.non_trainable_variables`` order (say, recorded at train
    begin on every rank and allgathered); by default every rank starts from the model's own, which
    is what ranks that built the model from the same seed hold. Afterwards the model holds rank 0's.
    """
    import keras
    import tensorflow as tf

    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    moving = [v for v in model.non_trainable_variables if _is_float(v)]
    counters = [v for v in model.non_trainable_variables if not _is_float(v)]
    if rank_states is None:
        rank_states = [[v.numpy() for v in counters]] * size
    if len(rank_states) != size or any(len(s) != len(counters) for s in rank_states):
        raise ValueError(f"rank_states needs {len(counters)} integer state(s) for each of {size} ranks.")
    states = [[np.array(s, copy=True) for s in mine] for mine in rank_states]

    @tf.function  # traced once (every sub-batch has one shape), like a rank's train step; eager is ~4x slower
    def forward_backward(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        return loss, tape.gradient(loss, model.trainable_variables)

    losses = []
    steps = len(X) // (per_rank * size)
    for _ in range(epochs):
        total = 0.0
        for k in range(steps):
            start = [v.numpy() for v in moving]
            grads, after = None, []
            for r in range(size):
                rows = slice((k * size + r) * per_rank, (k * size + r + 1) * per_rank)
                for v, s in zip(moving, start, strict=True):
                    v.assign(s)
                for v, s in zip(counters, states[r], strict=True):
                    v.assign(s)
                loss, g = forward_backward(tf.constant(X[rows]), tf.constant(y[rows]))
                grads = g if grads is None else [a + b for a, b in zip(grads, g, strict=True)]
                after.append([v.numpy() for v in moving])
                states[r] = [v.numpy() for v in counters]
                total += float(loss)
            for i, v in enumerate(moving):
                v.assign(np.mean([a[i] for a in after], axis=0))
            model.optimizer.apply_gradients(zip([g / size for g in grads], model.trainable_variables, strict=True))
        losses.append(total / (steps * size))
    for v, s in zip(counters, states[0], strict=True):
        v.assign(s)
    return losses


def proportional_batches(shards: Sequence[np.ndarray], batch_size: int) -> list[list[np.ndarray]]:
    """What each rank trains on at each step with proportional shards, unshuffled: ``[step][rank]``
    the global rows rank r takes at step k (the next ``sizes[k, r]`` of its shard ``shards[r]``)."""
    from mpinb._training.plan import proportional_sizes

    sizes = proportional_sizes([len(s) for s in shards], batch_size)
    ends = np.cumsum(sizes, axis=0)
    return [[shards[r][ends[k, r] - sizes[k, r]:ends[k, r]] for r in range(len(shards))] for k in range(len(sizes))]


def proportional_reference(model, X, y, batches: Sequence[Sequence[np.ndarray]], epochs: int) -> list[float]:
    """One process doing what the ranks do with proportional shards and BatchNorm, step by step.

    At step k rank r's local batch ``batches[k][r]`` is normalised with its own statistics; the
    gradient is the mean over the global batch, ``sum_r (b_r / B) g_r``; each rank's moving
    statistics follow its own non-empty batches (a step without rows leaves them unchanged), and at
    each epoch end every rank takes their mean weighted by each rank's rows that epoch. Returns
    the per-epoch mean loss over all rows (what fit reports). Integer state (Dropout seeds) is not
    simulated: use a model without it.
    """
    import keras
    import tensorflow as tf

    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    moving = [v for v in model.non_trainable_variables if _is_float(v)]
    if len(moving) != len(model.non_trainable_variables):
        raise ValueError("proportional_reference simulates floating-point state only (no Dropout seeds).")
    size = len(batches[0])
    rows = np.array([sum(len(step[r]) for step in batches) for r in range(size)], dtype=np.float64)
    held = [[v.numpy() for v in moving] for _ in range(size)]

    @tf.function(reduce_retracing=True)
    def forward_backward(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        return loss, tape.gradient(loss, model.trainable_variables)

    losses = []
    for _ in range(epochs):
        total = 0.0
        for step in batches:
            global_batch = sum(len(b) for b in step)
            grads = None
            for r, idx in enumerate(step):
                if len(idx) == 0:
                    continue
                for v, s in zip(moving, held[r], strict=True):
                    v.assign(s)
                loss, g = forward_backward(tf.constant(X[idx]), tf.constant(y[idx]))
                share = len(idx) / global_batch
                grads = ([a * share for a in g] if grads is None
                         else [a + b * share for a, b in zip(grads, g, strict=True)])
                held[r] = [v.numpy() for v in moving]
                total += float(loss) * len(idx)
            model.optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        merged = [np.sum([held[r][i] * rows[r] for r in range(size)], axis=0) / rows.sum() for i in range(len(moving))]
        held = [list(merged) for _ in range(size)]
        losses.append(total / rows.sum())
    for v, s in zip(moving, held[0], strict=True):
        v.assign(s)
    return losses


def _is_float(variable) -> bool:
    return np.dtype(str(variable.dtype)).kind == "f"


def spike(factor: float) -> Any:
    """A layer: the identity forward; backward, the gradient times ``factor``. Infinite on one rank:
    a non-finite gradient there with a finite loss (as when a loss scale overflows float16 there alone)."""
    return _spike_class()(factor)


@functools.cache
def _spike_class() -> Any:
    import keras

    class Spike(keras.layers.Layer):
        def __init__(self, factor: float, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.factor = factor

        def call(self, x: Any) -> Any:
            import tensorflow as tf

            @tf.custom_gradient
            def identity(v: Any) -> Any:
                return tf.identity(v), lambda g: g * tf.cast(self.factor, g.dtype)

            return identity(x)

    return Spike
