"""mpinb.keras.fit on a Conv2D + BatchNormalization + Dropout network equals one process, at 1, 2 and 4 ranks.

Dropout is the random part. Keras 3 draws its masks statelessly from the layer's SeedGenerator, whose
state is an int64 non-trainable variable of the model: the mask depends only on that state and on
the sub-batch's shape, and each draw advances the state by one. fit broadcasts ``model.weights``,
which leave seed states out, and SyncNonTrainable averages floating-point variables only, so every
rank keeps the dropout stream it built: ranks that built the model from one seed draw the same mask
for their sub-batch at every step, ranks seeded differently draw their own. The one-process reference
replays each rank's stream from the state that rank started training with (recorded after fit's
initial broadcast, so the check holds whichever state fit hands out), which makes it exact.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpinb
from support.keras_reference import once, relative_error, sharded_order, sharded_reference, weights_of
from support.mpitools import assert_everywhere, assert_same_everywhere

keras = pytest.importorskip("keras")
mk = pytest.importorskip("mpinb.keras")

pytestmark = pytest.mark.mpi_sizes(1, 2, 4)

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
GLOBAL_BATCH, EPOCHS = 64, 2  # the same global batches at 1, 2 and 4 ranks: 64, 32 or 16 rows per rank


@pytest.fixture(scope="module")
def digit_images():
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    n = 16 * GLOBAL_BATCH  # 1,024 rows: 16 steps per epoch, equal shards at 1, 2 and 4 ranks
    return (X[:n] / 16.0).astype(np.float32).reshape(-1, 8, 8, 1), y[:n].astype(np.int64)


def conv_net(seed: int):
    keras.utils.set_random_seed(seed)  # also the initial state of Dropout's SeedGenerator
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(8, 3, use_bias=False),
        keras.layers.BatchNormalization(),
        keras.layers.Activation("relu"),
        keras.layers.Flatten(),
        keras.layers.Dropout(0.3),
        keras.layers.Dense(10, activation="softmax"),
    ])
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="sparse_categorical_crossentropy")
    return model


def integer_state(model) -> list[np.ndarray]:
    """The seed states, in ``model.non_trainable_variables`` order (what ``sharded_reference`` takes)."""
    return [v.numpy() for v in model.non_trainable_variables if np.dtype(str(v.dtype)).kind != "f"]


def moving_statistics(model) -> np.ndarray:
    return np.concatenate([np.ravel(v.numpy()) for v in model.non_trainable_variables
                           if np.dtype(str(v.dtype)).kind == "f"])


class SeedStateAtTrainBegin(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.states = integer_state(self.model)


@pytest.mark.parametrize("seeding", ["same_seed"])  # "seed_per_rank" holds too; one case keeps the suite short
def test_conv_batchnorm_dropout_fit_equals_one_process(digit_images, seeding):
    X, y = digit_images
    per_rank = GLOBAL_BATCH // SIZE
    root_seed = 0 if seeding == "same_seed" else 10
    model = conv_net(root_seed + (RANK if seeding == "seed_per_rank" else 0))
    started = SeedStateAtTrainBegin()
    Xl, yl = mpinb.shard(X, y)
    history = mk.fit(model, Xl, yl, batch_size=GLOBAL_BATCH, epochs=EPOCHS, shuffle=False,
                     callbacks=[started], verbose=0)
    assert history["steps"] == [len(X) // GLOBAL_BATCH] * EPOCHS
    assert len(started.states) == 1  # Dropout's seed state, which the reference needs to replay the masks
    rank_states = COMM.allgather(started.states)
    if seeding == "same_seed":
        assert_same_everywhere(np.concatenate(started.states))  # every rank draws the same masks

    order = sharded_order(len(X), per_rank, SIZE)

    def one_process():
        reference = conv_net(root_seed)  # rank 0's initial weights, which fit broadcasts
        losses = sharded_reference(reference, X[order], y[order], per_rank, EPOCHS, SIZE, rank_states=rank_states)
        return weights_of(reference), moving_statistics(reference), losses

    ref_weights, ref_stats, ref_losses = once(one_process)
    err = relative_error(weights_of(model), ref_weights)
    assert_everywhere(err < 1e-5, f"weights within 1e-5 of one process ({err:.2e})")
    stats = moving_statistics(model)
    stats_err = relative_error(stats, ref_stats)
    assert_everywhere(stats_err < 1e-5,
                      f"BatchNorm moving statistics within 1e-5 of one process ({stats_err:.2e})")
    assert_same_everywhere(weights_of(model))  # bit-identical across ranks, moving statistics included
    assert_same_everywhere(stats)
    np.testing.assert_allclose(history["loss"], ref_losses, rtol=1e-5)
    assert history["loss"][-1] < history["loss"][0]
