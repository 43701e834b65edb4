"""mpinb.keras.fit fed by data pipelines: tf.data, PyDataset and generators, steps agreed by all ranks."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpinb
from support.mpitools import assert_everywhere, assert_same_everywhere, raises_everywhere

keras = pytest.importorskip("keras")
mk = pytest.importorskip("mpinb.keras")
tf = pytest.importorskip("tensorflow")

pytestmark = pytest.mark.mpi_sizes(1, 2, 4)

RANK, SIZE = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
PER_RANK = 64 // SIZE  # the same global batch of 64 at every size


@pytest.fixture(scope="module")
def shard():
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    X, y = (X / 16.0).astype(np.float32)[:1536], y.astype(np.int64)[:1536]  # 1536 = 24 global batches
    return mpinb.shard(X, y)


@pytest.fixture(scope="module")
def trained_on_arrays(shard):
    """Weights of ``model(1)`` after fit on the arrays, unshuffled: what every kind of pipeline must
    reproduce, trained once for all of them."""
    Xl, yl = shard
    reference = model(1)
    mk.fit(reference, Xl, yl, batch_size=64, epochs=2, shuffle=False, verbose=0)
    return weights(reference)


def model(seed: int = 0):
    keras.utils.set_random_seed(seed)
    m = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                          keras.layers.Dense(10, activation="softmax")])
    m.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="sparse_categorical_crossentropy")
    return m


def weights(m) -> np.ndarray:
    return np.concatenate([np.ravel(w) for w in m.get_weights()])


class Batches(keras.utils.PyDataset):
    def __init__(self, X, y, per_rank):
        super().__init__()
        self.X, self.y, self.per_rank = X, y, per_rank
        self.epochs_ended = 0

    def __len__(self):
        return len(self.X) // self.per_rank

    def __getitem__(self, i):
        rows = slice(i * self.per_rank, (i + 1) * self.per_rank)
        return self.X[rows], self.y[rows]

    def on_epoch_end(self):
        self.epochs_ended += 1


def generator(X, y, per_rank):
    while True:
        for i in range(len(X) // per_rank):
            yield X[i * per_rank:(i + 1) * per_rank], y[i * per_rank:(i + 1) * per_rank]


@pytest.mark.parametrize("kind", ["tf.data", "PyDataset", "generator"])
def test_a_pipeline_of_the_same_rows_in_the_same_order_trains_like_the_arrays(shard, trained_on_arrays, kind):
    Xl, yl = shard
    reference = trained_on_arrays
    m = model(1)
    if kind == "tf.data":
        data, steps = tf.data.Dataset.from_tensor_slices((Xl, yl)).batch(PER_RANK, drop_remainder=True), None
    elif kind == "PyDataset":
        data, steps = Batches(Xl, yl, PER_RANK), None
    else:
        data, steps = generator(Xl, yl, PER_RANK), len(Xl) // PER_RANK
    history = mk.fit(m, data, epochs=2, steps_per_epoch=steps, verbose=0)
    err = float(np.max(np.abs(weights(m) - reference)) / np.max(np.abs(reference)))
    assert_everywhere(err <= 1e-6, f"{kind}: weights within 1e-6 of the arrays path ({err:.1e})")
    assert_same_everywhere(weights(m))
    assert history["steps"] == [len(Xl) // PER_RANK] * 2
    assert history["params"]["input"] == {"tf.data": "tf.data.Dataset"}.get(kind, kind)
    if kind == "PyDataset":
        assert data.epochs_ended == 2


@pytest.mark.parametrize(("shards", "steps"), [("equal", 10), ("proportional", 10 + 3 * (SIZE - 1))])
def test_uneven_pipelines_run_the_fewest_or_the_most_batches_on_every_rank(shard, shards, steps):
    Xl, yl = shard
    mine = 10 + 3 * RANK  # a different number of batches on every rank
    data = tf.data.Dataset.from_tensor_slices((Xl, yl)).batch(PER_RANK, drop_remainder=True).take(mine)
    counter = []

    class Count(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            counter.append(batch)

    history = mk.fit(model(2), data, epochs=2, callbacks=[Count()], shards=shards, verbose=0)
    assert history["steps"] == [steps, steps]
    assert len(counter) == 2 * steps
    # Equal: every rank its first 10 batches; proportional: each of its own, once per epoch.
    assert history["rows_used"][-1] == [(10 if shards == "equal" else 10 + 3 * r) * PER_RANK for r in range(SIZE)]


@pytest.mark.mpi_sizes(1, 2)  # an error path: every rank raises alike at 2 ranks already; 4 costs suite time
def test_an_infinite_pipeline_needs_steps_per_epoch(shard):
    Xl, yl = shard
    data = tf.data.Dataset.from_tensor_slices((Xl, yl)).batch(PER_RANK).repeat()
    with raises_everywhere(ValueError, match=r"x is a tf.data.Dataset of unknown or infinite length on this rank; "
                                             r"pass steps_per_epoch="):
        mk.fit(model(3), data, epochs=1, verbose=0)
    history = mk.fit(model(3), data, epochs=2, steps_per_epoch=5, verbose=0)
    assert history["steps"] == [5, 5]


@pytest.mark.mpi_sizes(1, 2)  # an error path: every rank raises alike at 2 ranks already; 4 costs suite time
def test_a_generator_without_steps_per_epoch_fails_on_every_rank(shard):
    Xl, yl = shard
    with raises_everywhere(ValueError, match="x is a generator of unknown or infinite length"):
        mk.fit(model(4), generator(Xl, yl, PER_RANK), epochs=1, verbose=0)


@pytest.mark.mpi_sizes(1, 2)  # an error path: every rank raises alike at 2 ranks already; 4 costs suite time
@pytest.mark.parametrize(("shards", "steps", "match"), [
    ("equal", 6, r"yields 4 batches per pass, fewer than steps_per_epoch=6"),  # every rank must have them
    ("proportional", 9, r"steps_per_epoch=9 is more than the \d batches the longest tf.data.Dataset yields"),
])
def test_steps_per_epoch_above_what_ranks_have_fails_on_every_rank(shard, shards, steps, match):
    Xl, yl = shard
    data = tf.data.Dataset.from_tensor_slices((Xl, yl)).batch(PER_RANK).take(4 if RANK == SIZE - 1 else 8)
    with raises_everywhere(ValueError, match=match):
        mk.fit(model(5), data, epochs=1, steps_per_epoch=steps, shards=shards, verbose=0)


@pytest.mark.mpi_sizes(1, 2)  # an error path: every rank raises alike at 2 ranks already; 4 costs suite time
@pytest.mark.parametrize("kwargs, match", [
    ({"batch_size": 64}, "batch_size must be omitted when x is a tf.data.Dataset"),
    ({"y": np.zeros(3)}, "y must be None when x is a tf.data.Dataset"),
])
def test_arguments_a_pipeline_does_not_take(shard, kwargs, match):
    Xl, yl = shard
    data = tf.data.Dataset.from_tensor_slices((Xl, yl)).batch(PER_RANK)
    with raises_everywhere(ValueError, match=match):
        mk.fit(model(6), data, verbose=0, **kwargs)


# --- gradient accumulation ------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 4])
def test_accumulating_n_steps_equals_one_step_on_an_n_times_larger_batch(shard, n, monkeypatch):
    from mpinb._training import exchange
    from support.counting import count_calls

    Xl, yl = shard
    reference = model(7)
    mk.fit(reference, Xl, yl, batch_size=64 * n, epochs=2, shuffle=False, verbose=0)
    m = model(7)
    exchanges = count_calls(monkeypatch, exchange, "sum_over_ranks")
    history = mk.fit(m, Xl, yl, batch_size=64, epochs=2, shuffle=False, accumulate_steps=n, verbose=0)
    err = float(np.max(np.abs(weights(m) - weights(reference))) / np.max(np.abs(weights(reference))))
    assert_everywhere(err <= 1e-5, f"accumulate_steps={n}: weights within 1e-5 of the {n}x batch ({err:.1e})")
    assert_same_everywhere(weights(m))
    assert history["steps"] == [24, 24] and history["params"]["accumulate_steps"] == n
    assert int(m.optimizer.iterations.numpy()) == 2 * 24 // n  # one optimizer iteration per update
    if SIZE > 1:
        assert len(exchanges) == 2 * 24 // n  # n-fold fewer exchanges


@pytest.mark.mpi_sizes(1, 2)  # an error path: every rank raises alike at 2 ranks already; 4 costs suite time
def test_accumulate_steps_must_divide_the_steps(shard):
    Xl, yl = shard
    with raises_everywhere(ValueError, match=r"accumulate_steps=5 must divide the 24 steps per epoch"):
        mk.fit(model(8), Xl, yl, batch_size=64, accumulate_steps=5, verbose=0)
