"""mpinb.keras.fit on uneven shards, at 1, 2, 3 and 4 ranks: every row once per epoch, each step equal
to one process on the same global batch of the union of the rows (proportional shards)."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from support.keras_reference import (
    fresh,
    once,
    proportional_batches,
    proportional_reference,
    relative_error,
    snapshot,
    weights_of,
)
from support.mpitools import assert_everywhere, assert_same_everywhere

keras = pytest.importorskip("keras")
mk = pytest.importorskip("mpinb.keras")

pytestmark = pytest.mark.mpi_sizes(1, 2, 3, 4)

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
LOSS = "sparse_categorical_crossentropy"
N, BATCH = 600, 64  # 10 steps per epoch, the last one of 24 rows
OPTIMIZERS = {"adam": lambda: keras.optimizers.Adam(0.01), "sgd": lambda: keras.optimizers.SGD(0.05, momentum=0.9)}


@pytest.fixture(scope="module")
def digits():
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    return (X[:N] / 16.0).astype(np.float32), y[:N].astype(np.int64)


def split(kind: str) -> list[np.ndarray]:
    """Every rank's global row indices: contiguous shards of the N rows, in the proportions of ``kind``."""
    if kind == "1:2:3":
        weights = np.arange(1, SIZE + 1, dtype=float)
    else:
        weights = np.ones(SIZE)
    if kind == "empty_rank" and SIZE > 1:
        weights[-1] = 0
    ends = np.round(np.cumsum(weights) / weights.sum() * N).astype(int)
    if kind == "single_row" and SIZE > 1:
        ends[-2] = N - 1
    return [np.arange(lo, hi) for lo, hi in zip([0, *ends[:-1]], ends, strict=True)]


def mlp(seed: int, *, batchnorm: bool = False, optimizer: str = "adam"):
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((64,)), keras.layers.Dense(32, activation="relu")]
    if batchnorm:
        layers.append(keras.layers.BatchNormalization())
    layers.append(keras.layers.Dense(10, activation="softmax"))
    model = keras.Sequential(layers)
    model.compile(optimizer=OPTIMIZERS[optimizer](), loss=LOSS, metrics=["accuracy"])
    return model


def one_process(initial, train, *, batchnorm: bool = False, optimizer: str = "adam"):
    """The one-process reference, computed on rank 0 alone (see ``once``): an ``mlp`` of the same
    kind in the state of a new one with the weights ``initial`` (see ``fresh``), trained by
    ``train(reference)``. Every rank gets its weights and what ``train`` returned."""
    def run():
        reference = fresh(f"rows-{optimizer}-{batchnorm}", lambda: mlp(0, batchnorm=batchnorm, optimizer=optimizer),
                          initial)
        result = train(reference)
        return weights_of(reference), result

    return once(run)


def union_order(shards: list[np.ndarray]) -> np.ndarray:
    """The rows of every step's global batch, step after step: what one process trains on."""
    return np.concatenate([idx for step in proportional_batches(shards, BATCH) for idx in step])


SPLITS = ["even", "1:2:3", "single_row", "empty_rank"]


@pytest.mark.parametrize("kind", SPLITS)
def test_every_row_once_and_each_step_equals_one_process_on_the_union(digits, kind):
    X, y = digits
    shards = split(kind)
    mine = shards[RANK]
    model = mlp(1)
    order = union_order(shards)
    assert sorted(order.tolist()) == list(range(N))  # the plan uses every row once
    initial = snapshot(model)
    history = mk.fit(model, X[mine], y[mine], batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    ref_weights, ref = one_process(
        initial, lambda r: r.fit(X[order], y[order], batch_size=BATCH, epochs=2, shuffle=False, verbose=0).history)

    err = relative_error(weights_of(model), ref_weights)
    assert_everywhere(err < 1e-5, f"{kind}: weights within 1e-5 of one process on the union ({err:.1e})")
    assert_same_everywhere(weights_of(model))
    assert history["steps"] == [-(-N // BATCH)] * 2
    rows = [len(s) for s in shards]
    assert history["rows_used"] == [rows, rows]  # Keras's own count of the rows each rank trained on
    assert history["params"]["shards"] == "proportional"
    # Global logs are the one-process ones: each rank's own means, weighted by its rows.
    np.testing.assert_allclose(history["loss"], ref["loss"], rtol=1e-5)
    np.testing.assert_allclose(history["accuracy"], ref["accuracy"], rtol=1e-5)
    for name in ("loss", "accuracy"):
        per_rank = np.array(history[f"rank_{name}"])
        assert per_rank.shape == (2, SIZE)
        np.testing.assert_allclose(per_rank @ np.array(rows) / N, history[name], rtol=1e-6)


@pytest.mark.parametrize("kind", ["1:2:3", "empty_rank", "single_row"])
def test_batchnorm_statistics_per_local_batch_weighted_by_rows(digits, kind):
    X, y = digits
    shards = split(kind)
    mine = shards[RANK]
    # SGD, not Adam: the bias before BatchNorm has a zero gradient up to round-off, which Adam
    # would blow up to full-size steps, different in each summation order.
    model = mlp(2, batchnorm=True, optimizer="sgd")
    initial = snapshot(model)
    history = mk.fit(model, X[mine], y[mine], batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
                     validation_data=(X[mine], y[mine]))
    # Validation on every rank's rows with the synced statistics: one process on all rows.
    ref_weights, (losses, whole) = one_process(
        initial, lambda r: (proportional_reference(r, X, y, proportional_batches(shards, BATCH), epochs=2),
                            r.evaluate(X, y, batch_size=128, verbose=0, return_dict=True)),
        batchnorm=True, optimizer="sgd")

    err = relative_error(weights_of(model), ref_weights)  # moving statistics included
    assert_everywhere(err < 1e-5, f"{kind}: BatchNorm model within 1e-5 of the reference ({err:.1e})")
    assert_same_everywhere(weights_of(model))
    assert_everywhere(np.all(np.isfinite(weights_of(model))), "no NaN from the steps without rows")
    np.testing.assert_allclose(history["loss"], losses, rtol=1e-5)
    np.testing.assert_allclose(history["val_loss"][-1], whole["loss"], rtol=1e-5)


@pytest.mark.parametrize("kind", ["even", "1:2:3", "empty_rank"])
def test_accumulating_two_steps_equals_one_process_on_twice_the_batch(digits, kind, packing):
    X, y = digits
    shards = split(kind)
    mine = shards[RANK]
    model = mlp(3)
    order = union_order(shards)
    initial = snapshot(model)
    history = mk.fit(model, X[mine], y[mine], batch_size=BATCH, epochs=2, shuffle=False, accumulate_steps=2, verbose=0)
    ref_weights, _ = one_process(
        initial, lambda r: r.fit(X[order], y[order], batch_size=2 * BATCH, epochs=2, shuffle=False, verbose=0).history)
    err = relative_error(weights_of(model), ref_weights)
    assert_everywhere(err < 1e-5, f"{kind}: accumulate_steps=2 within 1e-5 of one process on 2x the batch ({err:.1e})")
    assert history["steps"] == [10, 10] and history["params"]["accumulate_steps"] == 2


def test_shuffled_epochs_still_use_every_row_once(digits):
    X, y = digits
    mine = split("1:2:3")[RANK]
    history = mk.fit(mlp(4), X[mine], y[mine], batch_size=BATCH, epochs=3, seed=11, verbose=0)
    rows = COMM.allgather(len(mine))
    assert history["rows_used"] == [rows] * 3
    assert_same_everywhere(history["loss"])


def test_equal_shards_stay_an_option(digits):
    X, y = digits
    mine = split("1:2:3")[RANK]
    history = mk.fit(mlp(5), X[mine], y[mine], batch_size=BATCH - BATCH % SIZE, epochs=1, shards="equal", verbose=0)
    per_rank = BATCH // SIZE
    steps = min(COMM.allgather(len(mine))) // per_rank
    assert history["steps"] == [steps] and history["params"]["shards"] == "equal"
    assert history["rows_used"] == [[steps * per_rank] * SIZE]


# --- pipelines for validation and evaluation: exact over the union of every rank's rows -------------


class Rows(keras.utils.PyDataset):
    def __init__(self, X, y, batch):
        super().__init__()
        self.X, self.y, self.batch = X, y, batch

    def __len__(self):
        return -(-len(self.X) // self.batch)

    def __getitem__(self, i):
        return self.X[i * self.batch:(i + 1) * self.batch], self.y[i * self.batch:(i + 1) * self.batch]


def pipeline(kind: str, X, y, batch: int = 16):
    """This rank's rows as a pipeline of ``kind``, the last batch smaller; with the steps it needs."""
    import tensorflow as tf

    steps = -(-len(X) // batch)
    if kind == "tf.data":
        return tf.data.Dataset.from_tensor_slices((X, y)).batch(batch), None
    if kind == "PyDataset":
        return Rows(X, y, batch), None
    if steps == 0:
        return iter(()), 1  # an empty generator: this rank scores no rows

    def forever():
        while True:
            for i in range(steps):
                yield X[i * batch:(i + 1) * batch], y[i * batch:(i + 1) * batch]

    return forever(), steps


@pytest.mark.parametrize(("kind", "shards"), [("tf.data", "1:2:3"), ("PyDataset", "1:2:3"), ("generator", "1:2:3"),
                                             ("tf.data", "empty_rank"), ("generator", "empty_rank")])
def test_evaluate_and_validation_pipelines_score_the_union_of_the_rows(digits, kind, shards):
    X, y = digits
    mine = split(shards)[RANK]  # uneven, so weighting by batches or ranks would be wrong
    model = mlp(6)
    validation, validation_steps = pipeline(kind, X[mine], y[mine])
    history = mk.fit(model, X[mine], y[mine], batch_size=BATCH, epochs=2, verbose=0,
                     validation_data=validation, validation_steps=validation_steps)
    whole = once(model.evaluate, X, y, batch_size=128, verbose=0, return_dict=True)  # one model everywhere
    np.testing.assert_allclose(history["val_loss"][-1], whole["loss"], rtol=1e-6)
    np.testing.assert_allclose(history["val_accuracy"][-1], whole["accuracy"], rtol=1e-6)
    data, steps = pipeline(kind, X[mine], y[mine], batch=7)
    scores = mk.evaluate(model, data, steps=steps)
    assert sorted(scores) == sorted(whole)
    for key in whole:
        np.testing.assert_allclose(scores[key], whole[key], rtol=1e-6, err_msg=key)
    assert_same_everywhere([scores[k] for k in sorted(scores)])


@pytest.mark.mpi_sizes(1, 2)  # an error path: every rank raises alike at 2 ranks already
def test_evaluating_pipelines_empty_on_every_rank_fails_on_every_rank(digits):
    from support.mpitools import raises_everywhere

    with raises_everywhere(ValueError, match="evaluate got no batch from any rank's generator"):
        mk.evaluate(mlp(7), iter(()), steps=1)


# --- pipelines of known length as training x: every batch of every rank once per epoch --------------


class UnionBatches(keras.utils.PyDataset):
    """One process's batches: step k is every rank's k-th batch, in rank order."""

    def __init__(self, X, y, shards, batch):
        super().__init__()
        steps = max(-(-len(s) // batch) for s in shards)
        self.steps = [np.concatenate([s[k * batch:(k + 1) * batch] for s in shards]) for k in range(steps)]
        self.X, self.y = X, y

    def __len__(self):
        return len(self.steps)

    def __getitem__(self, k):
        return self.X[self.steps[k]], self.y[self.steps[k]]


@pytest.mark.parametrize(("kind", "kind_of_split"), [("tf.data", "1:2:3"), ("PyDataset", "1:2:3"),
                                                     ("tf.data", "empty_rank"), ("PyDataset", "single_row")])
def test_known_length_pipelines_use_every_batch_weighted_by_rows(digits, kind, kind_of_split, packing):
    X, y = digits
    shards = split(kind_of_split)
    mine = shards[RANK]
    model = mlp(8)
    union = UnionBatches(X, y, shards, 16)
    initial = snapshot(model)
    data, _ = pipeline(kind, X[mine], y[mine])  # batches of 16, each rank's last one smaller
    history = mk.fit(model, data, epochs=2, verbose=0)
    ref_weights, ref = one_process(initial, lambda r: r.fit(union, epochs=2, shuffle=False, verbose=0).history)

    err = relative_error(weights_of(model), ref_weights)
    assert_everywhere(err < 1e-5, f"{kind} {kind_of_split}: within 1e-5 of one process on the union ({err:.1e})")
    assert_same_everywhere(weights_of(model))
    assert history["steps"] == [len(union)] * 2 and history["params"]["shards"] == "proportional"
    assert history["rows_used"] == [[len(s) for s in shards]] * 2
    np.testing.assert_allclose(history["loss"], ref["loss"], rtol=1e-5)


# --- the weight strategy on uneven shards: averages weighted by the rows since the last one ---------


@pytest.mark.parametrize("kind", ["1:2:3", "empty_rank"])
def test_weight_averages_weighted_by_rows_equal_one_process_on_the_union(digits, kind):
    # Momentum SGD is linear in the gradients: averaging weights and momenta after every step,
    # each rank weighted by its step's rows, is the row-weighted gradient step of the union.
    X, y = digits
    shards = split(kind)
    mine = shards[RANK]
    model = mlp(9, optimizer="sgd")
    order = union_order(shards)
    initial = snapshot(model)
    history = mk.fit(model, X[mine], y[mine], batch_size=BATCH, epochs=2, shuffle=False, strategy="weights",
                     average_every=1, verbose=0)
    ref_weights, ref = one_process(
        initial, lambda r: r.fit(X[order], y[order], batch_size=BATCH, epochs=2, shuffle=False, verbose=0).history,
        optimizer="sgd")
    err = relative_error(weights_of(model), ref_weights)
    assert_everywhere(err < 1e-5, f"{kind}: weights strategy within 1e-5 of one process on the union ({err:.1e})")
    assert_same_everywhere(weights_of(model))
    assert history["rows_used"] == [[len(s) for s in shards]] * 2
    np.testing.assert_allclose(history["loss"], ref["loss"], rtol=1e-5)
