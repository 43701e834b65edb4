"""mpinb.keras.fit never runs a model on a batch of no rows: uneven tf.data pipelines and a CNN with oneDNN on.

Issue 49's case: 3 ranks with pipelines of 5, 11 and 17 batches of 32 (8x8 digits) and a model with
``Conv2D``, ``BatchNormalization``, ``MaxPooling2D`` and ``Dropout``. The ranks whose pipelines end
first take the epoch's remaining steps with no rows; TensorFlow 2.21 with oneDNN (its default on
x86) aborts the process on MaxPooling's gradient over 0 rows (``MklMaxPoolingGradOp``: ``Check
failed: dtype() == expected_dtype``), on CPUs with AVX-512. Such a step now applies zero gradients
with weight 0 without a forward or backward pass. The abort needs such a CPU, so the test also
counts what the model is called on: never 0 rows.

The step without rows keeps what a step with zero weight did before: several steps per execution
and the loss-scale optimizer's vote on non-finite gradients are the same on every rank (at 2 and 3
ranks, the last rank without rows). ``TF_ENABLE_ONEDNN_OPTS=1`` is set by ``tests/mpi/conftest.py``
before TensorFlow is imported.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from mpi4py import MPI

from support.keras_reference import spike as spike_layer
from support.mpitools import assert_everywhere, assert_same_everywhere

keras = pytest.importorskip("keras")
mk = pytest.importorskip("mpinb.keras")

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
BATCHES, BATCH, EPOCHS = (5, 11, 17), 32, 2


class RowsSeen(keras.layers.Layer):
    """Passes its input on, counting the calls in training and the ones with no rows."""

    def build(self, input_shape):
        self.calls = self.add_weight(shape=(), dtype="int64", initializer="zeros", trainable=False, name="calls")
        self.empty = self.add_weight(shape=(), dtype="int64", initializer="zeros", trainable=False, name="empty")

    def call(self, x, training=False):
        import tensorflow as tf

        if training:
            self.calls.assign_add(1)
            self.empty.assign_add(tf.cast(tf.equal(tf.shape(x)[0], 0), tf.int64))
        return x


def cnn():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        RowsSeen(),
        keras.layers.Conv2D(8, 3, padding="same"),
        keras.layers.BatchNormalization(),
        keras.layers.Activation("relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dropout(0.2),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


@pytest.mark.mpi_sizes(3)
def test_uneven_pipelines_never_feed_a_model_an_empty_batch_with_onednn_on():
    import tensorflow as tf
    from tensorflow.python.util import _pywrap_util_port

    import mpinb

    assert os.environ.get("TF_ENABLE_ONEDNN_OPTS") == "1" and _pywrap_util_port.IsMklEnabled(), "oneDNN is off"
    X, _, y, _ = mpinb.data.load_digits(shard=False)
    X, y = (X / 16.0).astype(np.float32).reshape(-1, 8, 8, 1), y.astype(np.int64)
    start, n = BATCH * sum(BATCHES[:RANK]), BATCH * BATCHES[RANK]
    pipeline = tf.data.Dataset.from_tensor_slices((X[start:start + n], y[start:start + n])).batch(BATCH)
    model = cnn()
    history = mk.fit(model, pipeline, epochs=EPOCHS, verbose=0)
    seen = model.layers[0]
    steps = max(BATCHES)
    assert_everywhere(int(seen.empty.numpy()) == 0, f"no call on 0 rows (saw {int(seen.empty.numpy())})")
    assert_everywhere(int(seen.calls.numpy()) == EPOCHS * BATCHES[RANK],
                      f"one call per batch of this rank ({int(seen.calls.numpy())} of {EPOCHS * BATCHES[RANK]})")
    assert_everywhere(history["steps"] == [steps] * EPOCHS, f"{steps} steps per epoch ({history['steps']})")
    assert_everywhere(history["rows_used"] == [[BATCH * b for b in BATCHES]] * EPOCHS,
                      f"every row once per epoch ({history['rows_used']})")
    assert_everywhere(bool(np.all(np.isfinite(history["loss"]))) and history["loss"][-1] < history["loss"][0],
                      f"a finite, falling loss ({history['loss']})")
    # One update per step on every rank, from the same averaged gradients.
    assert_everywhere(int(model.optimizer.iterations.numpy()) == EPOCHS * steps, "the optimizer's step count")
    floats = [np.ravel(w) for w in model.get_weights() if np.asarray(w).dtype.kind == "f"]
    assert_same_everywhere(np.concatenate(floats))


def without_rows_on_the_last_rank(n: int = 512):
    rng = np.random.default_rng(5)  # the same rows on every rank, split unevenly: the last gets none
    X = rng.normal(size=(n, 16)).astype(np.float32)
    y = (X[:, :4].sum(axis=1) > 0).astype(np.int64)
    bounds = np.linspace(0, n, SIZE).astype(int)  # SIZE - 1 shards for the first ranks
    lo, hi = (bounds[RANK], bounds[RANK + 1]) if RANK < SIZE - 1 else (n, n)
    return X[lo:hi], y[lo:hi]


def mlp(seed: int, steps_per_execution: int = 1, *, spike: float = 1.0):
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((16,)), keras.layers.Dense(16, activation="relu")]
    if spike != 1.0:
        layers.append(spike_layer(spike))
    model = keras.Sequential([*layers, keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy",
                  steps_per_execution=steps_per_execution)
    return model



@pytest.mark.mpi_sizes(2, 3)
def test_steps_without_rows_inside_one_execution_train_like_one_step_per_call():
    X, y = without_rows_on_the_last_rank()
    one, four = mlp(6), mlp(6, steps_per_execution=4)
    kwargs = dict(batch_size=64, epochs=2, shuffle=False, verbose=0)
    h1, h4 = mk.fit(one, X, y, **kwargs), mk.fit(four, X, y, **kwargs)
    assert_everywhere(h4["params"]["steps_per_execution"] == 4 and h4["steps"] == h1["steps"] == [8, 8],
                      f"steps ({h1['steps']}, {h4['steps']})")
    assert_everywhere(int(four.optimizer.iterations.numpy()) == 16, "an update per step, on every rank")
    w1 = np.concatenate([np.ravel(w) for w in one.get_weights()])
    w4 = np.concatenate([np.ravel(w) for w in four.get_weights()])
    err = float(np.max(np.abs(w4 - w1)) / np.max(np.abs(w1)))
    assert_everywhere(err < 1e-6, f"the same weights with 4 steps per execution ({err:.1e})")
    assert_same_everywhere(w4)


@pytest.mark.mpi_sizes(2, 3)
def test_a_rank_without_rows_takes_the_loss_scales_same_branch():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        X, y = without_rows_on_the_last_rank()
        model = mlp(7, spike=np.inf if RANK == 0 else 1.0)  # rank 0's gradient is not finite
        scale = float(model.optimizer.initial_scale)
        kernel = model.layers[0].kernel.numpy()
        mk.fit(model, X, y, batch_size=64, epochs=1, steps_per_epoch=1, shuffle=False, verbose=0)
        after = float(model.optimizer.dynamic_scale.numpy())
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert_everywhere(after == scale / 2, f"the scale halved on every rank ({scale} -> {after})")
    assert_everywhere(np.array_equal(model.layers[0].kernel.numpy(), kernel), "the step skipped: no update")
