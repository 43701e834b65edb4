"""mpinb.keras.fit never runs a model on a batch of no rows: uneven tf.data pipelines and a CNN with oneDNN on.

Issue 49's case: 3 ranks with pipelines of 5, 11 and 17 batches of 32 (8x8 digits) and a model with
``Conv2D``, ``BatchNormalization``, ``MaxPooling2D`` and ``Dropout``. The ranks whose pipelines end
first take the epoch's remaining steps with no rows; TensorFlow 2.21 with oneDNN (its default on
x86) aborts the process on MaxPooling's gradient over 0 rows (``MklMaxPoolingGradOp``: ``Check
failed: dtype() == expected_dtype``), on CPUs with AVX-512. Such a step now applies zero gradients
with weight 0 without a forward or backward pass. The abort needs such a CPU, so the test also
counts what the model is called on: never 0 rows.

``TF_ENABLE_ONEDNN_OPTS=1`` is set by ``tests/mpi/conftest.py`` before TensorFlow is imported.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from mpi4py import MPI

from support.mpitools import assert_everywhere, assert_same_everywhere

keras = pytest.importorskip("keras")
mk = pytest.importorskip("mpinb.keras")

pytestmark = pytest.mark.mpi_sizes(3)

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
