"""mpinb.keras under mpiexec at 1, 2 and 4 ranks: exactness, agreement across ranks, errors together.

TensorFlow costs ~10 s to import per process, so everything runs in the one pytest process per world
size, with small models (64-32-10) and few epochs.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest
from mpi4py import MPI

import mpinb
from support.keras_reference import once, relative_error, sharded_reference, snapshot, weights_of
from support.mpitools import assert_everywhere, assert_same_everywhere, raises_everywhere

keras = pytest.importorskip("keras")
mk = pytest.importorskip("mpinb.keras")

pytestmark = pytest.mark.mpi_sizes(1, 2, 4)

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
LOSS = "sparse_categorical_crossentropy"


@pytest.fixture(scope="module")
def digits():
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    return (X / 16.0).astype(np.float32), y.astype(np.int64)


@pytest.fixture(scope="module")
def trained_on_1400(digits):
    """A model's weights after one epoch on the first 1,400 rows, and its one-process scores on the
    other 397: the same for every case, so trained and scored once, on rank 0."""
    X, y = digits

    def one_process():
        model = mlp(3)
        model.fit(X[:1400], y[:1400], batch_size=64, epochs=1, verbose=0)
        return snapshot(model), model.evaluate(X[1400:], y[1400:], batch_size=64, verbose=0, return_dict=True)

    return once(one_process)


def mlp(seed: int = 0, *, hidden: int = 32, batchnorm: bool = False, optimizer=None, metrics=("accuracy",)):
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((64,)), keras.layers.Dense(hidden, activation="relu")]
    if batchnorm:
        layers.append(keras.layers.BatchNormalization())
    layers.append(keras.layers.Dense(10, activation="softmax"))
    model = keras.Sequential(layers)
    model.compile(optimizer=optimizer or keras.optimizers.SGD(0.05, momentum=0.9), loss=LOSS, metrics=list(metrics))
    return model


def global_batches_order(n_total: int, per_rank: int) -> np.ndarray:
    """Row order for one process that sees, at step k, the concatenation of every rank's k-th batch."""
    bounds = [mpinb.shard_bounds(n_total, rank=r, size=SIZE) for r in range(SIZE)]
    steps = min((hi - lo) // per_rank for lo, hi in bounds)
    return np.concatenate(
        [np.arange(lo + k * per_rank, lo + (k + 1) * per_rank) for k in range(steps) for lo, _ in bounds]
    )


def statistics(model) -> np.ndarray:
    """Every non-trainable variable (BatchNorm's moving statistics), flattened."""
    return np.concatenate([np.ravel(v.numpy()) for v in model.non_trainable_variables] or [np.zeros(0)])


class CountBatches(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.batches = 0

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1


# --- exactness of the gradient strategy -------------------------------------------------------------


@pytest.mark.parametrize(
    "make_optimizer",
    [lambda: keras.optimizers.SGD(0.05, momentum=0.9), lambda: keras.optimizers.Adam(0.01)],
    ids=["sgd_momentum", "adam"],
)
def test_gradients_equal_single_process_full_batch(digits, make_optimizer, packing):
    X, y = digits
    X, y = X[:1792], y[:1792]  # 1792 = 4 × 448: equal shards at 1, 2 and 4 ranks
    global_batch = 64
    Xl, yl = mpinb.shard(X, y)
    model = mlp(1, optimizer=make_optimizer())
    initial = snapshot(model)

    history = mk.fit(model, Xl, yl, batch_size=global_batch, epochs=3, shuffle=False, verbose=0)
    order = global_batches_order(len(X), global_batch // SIZE)

    def one_process():
        reference = mlp(1, optimizer=make_optimizer())
        reference.set_weights(initial)
        fitted = reference.fit(X[order], y[order], batch_size=global_batch, epochs=3, shuffle=False, verbose=0)
        return weights_of(reference), fitted.history

    ref, ref_history = once(one_process)
    mine = weights_of(model)
    assert_everywhere(relative_error(mine, ref) < 1e-5,
                      f"weights within 1e-5 of one process ({relative_error(mine, ref):.2e})")
    assert_same_everywhere(mine)  # bit-identical across ranks
    # Global logs are the single-process ones: the mean over ranks of equal-sized per-rank means.
    np.testing.assert_allclose(history["loss"], ref_history["loss"], rtol=1e-5)
    np.testing.assert_allclose(history["accuracy"], ref_history["accuracy"], rtol=1e-5)
    assert history["steps"] == [len(X) // global_batch] * 3
    np.testing.assert_allclose(np.mean(history["rank_loss"], axis=1), history["loss"], rtol=1e-6)


def test_constant_gradients_come_back_averaged_every_step(packing):
    """Gradients TensorFlow can fold into constants (and, packed in the graph, their packing too):
    the exchange sums in place, so it must never write into a buffer the graph keeps. Each call
    would then start from the last call's sum."""
    import tensorflow as tf

    from mpinb.keras.optimizer import TensorExchange

    shapes = [(5, 3), (3,), (3, 2)]

    def grads_of(rank):
        rng = np.random.default_rng(rank)
        return [rng.normal(size=s).astype(np.float32) for s in shapes]

    expected = [np.mean(parts, axis=0) for parts in zip(*(grads_of(r) for r in range(SIZE)), strict=True)]
    exchange = TensorExchange(MPI.COMM_WORLD)
    step = tf.function(lambda: exchange.average([tf.constant(g) for g in grads_of(RANK)]))
    for _ in range(3):
        for got, want in zip(step(), expected, strict=True):
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-7)


def test_gradients_that_are_tensorflow_buffers_stay_untouched(packing):
    """The arrays a numpy_function receives are TensorFlow's own buffers, not copies: a variable's
    value, an input of the step, a tensor another op reads after the exchange (measured: writing
    into them changes the variable, the caller's tensor and that op's result). The exchange sums in
    place, so it must only ever write into buffers of its own: each call averages afresh, and
    nothing it was given changes."""
    import tensorflow as tf

    from mpinb.keras.optimizer import TensorExchange

    shapes = [(5, 3), (3,), (3, 2)]

    def grads_of(rank):
        rng = np.random.default_rng(rank + 7)
        return [rng.normal(size=s).astype(np.float32) for s in shapes]

    mine = grads_of(RANK)
    expected = [np.mean(parts, axis=0) for parts in zip(*(grads_of(r) for r in range(SIZE)), strict=True)]
    exchange = TensorExchange(MPI.COMM_WORLD)
    held = tf.Variable(mine[0])
    given = tf.constant(mine[1])

    @tf.function
    def step(passed):
        later = tf.identity(mine[2]) * 1.0  # a fresh tensor, also read after the exchange
        averaged = exchange.average([held.read_value(), passed, later])
        with tf.control_dependencies(averaged):
            again = tf.identity(later) + 0.0
        return averaged, again

    for _ in range(3):
        averaged, again = step(given)
        for got, want in zip(averaged, expected, strict=True):
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(held.numpy(), mine[0])
        np.testing.assert_array_equal(given.numpy(), mine[1])
        np.testing.assert_array_equal(again.numpy(), mine[2])


def test_uneven_digits_run_the_same_steps_everywhere(digits):
    X, y = digits  # 1,797 rows: uneven shards at 2 and 4 ranks
    Xl, yl = mpinb.shard(X, y)
    counter = CountBatches()
    history = mk.fit(mlp(2), Xl, yl, batch_size=32, epochs=2, seed=5, callbacks=[counter], shards="equal", verbose=0)
    per_rank = 32 // SIZE
    bounds = [mpinb.shard_bounds(len(X), rank=r, size=SIZE) for r in range(SIZE)]
    expected = min((hi - lo) // per_rank for lo, hi in bounds)
    assert_same_everywhere(counter.batches)
    assert counter.batches == 2 * expected
    assert history["steps"] == [expected, expected]
    assert len(history["rank_loss"][0]) == SIZE
    assert np.array(history["compute_seconds"]).shape == (2, SIZE)
    assert np.array(history["comm_seconds"]).shape == (2, SIZE)
    wait = np.array(history["wait_seconds"])
    assert wait.shape == (2, SIZE) and np.all(wait >= 0) and np.all(wait <= np.array(history["comm_seconds"]))
    assert history["params"]["rows_per_rank"] == [hi - lo for lo, hi in bounds]
    assert_same_everywhere(history["loss"])


@pytest.mark.parametrize("empty_rank", [False, True], ids=["uneven", "one_rank_empty"])
def test_evaluate_is_exact_over_uneven_shards(digits, trained_on_1400, empty_rank):
    X, y = digits
    Xt, yt = X[1400:], y[1400:]  # 397 rows
    weights, whole = trained_on_1400
    model = mlp(3)
    model.set_weights(weights)
    mk.broadcast_state(model)  # one model everywhere, so the one-process reference is the same
    if empty_rank and SIZE > 1:
        lo, hi = (0, 0) if RANK == SIZE - 1 else mpinb.shard_bounds(len(Xt), rank=RANK, size=SIZE - 1)
    else:
        lo, hi = mpinb.shard_bounds(len(Xt), rank=RANK, size=SIZE)
    scores = mk.evaluate(model, Xt[lo:hi], yt[lo:hi], batch_size=16)
    assert sorted(scores) == sorted(whole)
    for key in whole:
        np.testing.assert_allclose(scores[key], whole[key], rtol=1e-6, err_msg=key)
    assert_same_everywhere([scores[k] for k in sorted(scores)])


def test_validation_logs_are_exact(digits):
    X, y = digits
    Xl, yl = mpinb.shard(X[:1200], y[:1200])
    Xv, yv = mpinb.shard(X[1200:], y[1200:])
    model = mlp(4)
    history = mk.fit(model, Xl, yl, batch_size=64, epochs=1, validation_data=(Xv, yv), verbose=0)
    whole = once(model.evaluate, X[1200:], y[1200:], verbose=0, return_dict=True)
    np.testing.assert_allclose(history["val_loss"][-1], whole["loss"], rtol=1e-6)
    np.testing.assert_allclose(history["val_accuracy"][-1], whole["accuracy"], rtol=1e-6)


# --- callbacks: joint stopping, BatchNorm, checkpoints ---------------------------------------------


def test_early_stopping_and_batchnorm_agree_across_ranks(digits):
    X, y = digits
    Xl, yl = mpinb.shard(X, y)
    model = mlp(5, batchnorm=True)
    stop = keras.callbacks.EarlyStopping(monitor="loss", min_delta=10.0, patience=1)
    history = mk.fit(model, Xl, yl, batch_size=64, epochs=6, callbacks=[stop], seed=1, verbose=0)
    assert len(history["epoch"]) == 2  # no epoch improves by 10: stop after patience + 1 epochs
    assert_same_everywhere(len(history["epoch"]))
    bn = model.layers[1]
    assert_same_everywhere(np.concatenate([np.ravel(v) for v in bn.non_trainable_weights]))
    assert_same_everywhere(weights_of(model))


def test_a_stop_on_one_rank_mid_epoch_stops_every_rank_at_the_same_step(digits):
    X, y = digits
    Xl, yl = mpinb.shard(X, y)

    class StopHere(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            if RANK == SIZE - 1 and self.epoch == 1 and batch == 3:
                self.model.stop_training = True  # this rank only, e.g. TerminateOnNaN on a local loss

    counter = CountBatches()
    model = mlp(6)
    history = mk.fit(model, Xl, yl, batch_size=32, epochs=3, callbacks=[StopHere(), counter], verbose=0)
    steps = history["steps"][0]
    assert_same_everywhere(counter.batches)
    # Epoch 0 complete, then batches 0..3 of epoch 1; with several ranks the stop vote rides the next
    # step's gradient buffer, so every rank runs exactly one more step.
    assert counter.batches == steps + 4 + (SIZE > 1)
    assert history["epoch"] == [0, 1]
    assert_same_everywhere(weights_of(model))


def test_checkpoint_resume_continues_exactly(digits):
    X, y = digits
    Xl, yl = mpinb.shard(X, y)
    folder = mpinb.on_root(lambda: tempfile.mkdtemp(prefix="mpinb-keras-ckpt-"))
    path = os.path.join(folder, "model.keras")
    try:
        straight = mlp(7)
        mk.fit(straight, Xl, yl, batch_size=64, epochs=4, seed=3, verbose=0)

        first = mlp(7)
        h1 = mk.fit(first, Xl, yl, batch_size=64, epochs=2, seed=3, checkpoint=path, verbose=0)
        assert h1["epoch"] == [0, 1]
        resumed = mlp(99)  # different initial weights: the checkpoint must replace them
        h2 = mk.fit(resumed, Xl, yl, batch_size=64, epochs=4, seed=3, checkpoint=path, resume=True, verbose=0)
        assert h2["epoch"] == [2, 3]
        assert_same_everywhere(weights_of(resumed))
        mine = weights_of(resumed)
        assert_everywhere(relative_error(mine, weights_of(straight)) < 1e-6, "resumed run equals the straight run")

        def load_and_flatten():
            loaded = keras.models.load_model(path)
            return weights_of(loaded), type(loaded.optimizer).__name__

        saved, opt_name = mpinb.on_root(load_and_flatten)
        assert opt_name == "SGD"
        np.testing.assert_array_equal(saved, mine)  # the last epoch's checkpoint is the final state
    finally:
        COMM.Barrier()
        if RANK == 0:
            import shutil

            shutil.rmtree(folder, ignore_errors=True)


# --- several steps per execution (compile(steps_per_execution=N)) ----------------------------------


@pytest.mark.parametrize("strategy", ["gradients", "weights"])
def test_steps_per_execution_trains_exactly_like_one_step_per_call(digits, strategy, packing):
    X, y = digits
    Xl, yl = mpinb.shard(X[:1024], y[:1024])  # 16 steps of 64 rows per epoch at every world size
    one = mlp(15, optimizer=keras.optimizers.Adam(0.01))
    four = mlp(15, optimizer=keras.optimizers.Adam(0.01))
    four.compile(optimizer=keras.optimizers.Adam(0.01), loss=LOSS, metrics=["accuracy"], steps_per_execution=4)
    kwargs = dict(batch_size=64, epochs=2, seed=3, strategy=strategy, average_every=4, verbose=0)
    h1 = mk.fit(one, Xl, yl, **kwargs)
    h4 = mk.fit(four, Xl, yl, **kwargs)
    assert h4["params"]["steps_per_execution"] == 4
    assert h4["steps"] == h1["steps"] == [16, 16]
    assert int(four.optimizer.iterations.numpy()) == 32
    assert_everywhere(relative_error(weights_of(four), weights_of(one)) < 1e-6,
                      "same weights with 4 steps per execution "
                      f"({relative_error(weights_of(four), weights_of(one)):.1e})")
    assert_same_everywhere(weights_of(four))
    np.testing.assert_allclose(h4["loss"], h1["loss"], rtol=1e-5)


@pytest.mark.parametrize(("strategy", "expected"), [("gradients", 7), ("weights", 2)])
def test_steps_per_execution_is_lowered_to_end_on_epochs_and_averages(digits, strategy, expected):
    import warnings

    X, y = digits
    Xl, yl = mpinb.shard(X[:1792], y[:1792])
    model = mlp(16)
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss=LOSS, steps_per_execution=8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = mk.fit(model, Xl, yl, batch_size=64, epochs=2, seed=1, strategy=strategy, average_every=6, verbose=0)
    lowered = [w for w in caught if "steps_per_execution=8" in str(w.message)]
    assert len(lowered) == (1 if RANK == 0 else 0)  # 28 steps per epoch: 7 divides them (and 2 divides 6 too)
    assert history["params"]["steps_per_execution"] == expected
    assert history["steps"] == [28, 28]
    assert int(model.optimizer.iterations.numpy()) == 56  # no epoch borrowed batches from the next
    assert model.steps_per_execution == 8  # the user's setting is back
    assert_same_everywhere(weights_of(model))


# --- the weight-averaging strategy --------------------------------------------------------------------


def test_weights_strategy_every_step_equals_gradients_for_momentum_sgd(digits):
    # Momentum SGD is linear in the gradients, so averaging weights and momenta after every step is
    # the same update as averaging gradients: a sharp check that optimizer state is averaged too.
    X, y = digits
    Xl, yl = mpinb.shard(X[:1792], y[:1792])
    a, b = mlp(8), mlp(8)
    mk.fit(a, Xl, yl, batch_size=64, epochs=2, seed=2, strategy="gradients", verbose=0)
    mk.fit(b, Xl, yl, batch_size=64, epochs=2, seed=2, strategy="weights", average_every=1, verbose=0)
    assert_everywhere(relative_error(weights_of(b), weights_of(a)) < 1e-5, "weights strategy matches gradients")
    assert_same_everywhere(weights_of(b))


def test_weights_strategy_identical_after_each_average_and_accurate(digits):
    X, y = digits
    Xl, yl = mpinb.shard(X[:1400], y[:1400])
    Xt, yt = mpinb.shard(X[1400:], y[1400:])
    snapshots = []

    class Snapshot(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if (batch + 1) % 4 == 0:
                snapshots.append(float(np.sum(weights_of(self.model), dtype=np.float64)))

    opt = lambda: keras.optimizers.Adam(0.01)  # noqa: E731
    by_weights = mlp(9, optimizer=opt())
    mk.fit(by_weights, Xl, yl, batch_size=64, epochs=5, strategy="weights", average_every=4, seed=4,
           callbacks=[Snapshot()], verbose=0)
    by_gradients = mlp(9, optimizer=opt())
    mk.fit(by_gradients, Xl, yl, batch_size=64, epochs=5, seed=4, verbose=0)
    assert snapshots
    assert_same_everywhere(np.array(snapshots))
    assert_same_everywhere(weights_of(by_weights))
    acc_w = mk.evaluate(by_weights, Xt, yt)["accuracy"]
    acc_g = mk.evaluate(by_gradients, Xt, yt)["accuracy"]
    assert acc_g > 0.85
    if SIZE > 1:  # Adam is not linear in the gradients: the two schemes really differ
        assert relative_error(weights_of(by_weights), weights_of(by_gradients)) > 1e-4
    assert abs(acc_w - acc_g) <= 0.02, (acc_w, acc_g)


# --- bad input: the same error on every rank, never a hang ----------------------------------------


@pytest.mark.skipif(SIZE == 1, reason="needs ranks that can differ")
def test_weight_shapes_differ_across_ranks(digits):
    X, y = digits
    Xl, yl = mpinb.shard(X, y)
    model = mlp(10, hidden=32 + (RANK == SIZE - 1))
    with raises_everywhere(mpinb.CollectiveMismatchError, match="weight shapes"):
        mk.fit(model, Xl, yl, batch_size=32, epochs=1, verbose=0)


def test_len_x_differs_from_len_y_on_one_rank(digits):
    X, y = digits
    Xl, yl = mpinb.shard(X, y)
    if RANK == SIZE - 1:
        yl = yl[:-1]
    with raises_everywhere(ValueError, match="same number of rows"):
        mk.fit(mlp(11), Xl, yl, batch_size=32, epochs=1, verbose=0)


def test_empty_shard_on_one_rank(digits):
    X, y = digits
    Xl, yl = mpinb.shard(X, y)
    if RANK == SIZE - 1:
        Xl, yl = Xl[:0], yl[:0]
    with raises_everywhere(ValueError, match="fewer than one per-rank batch"):
        mk.fit(mlp(12), Xl, yl, batch_size=32, epochs=1, shards="equal", verbose=0)


def test_no_rows_on_any_rank(digits):
    X, y = digits
    with raises_everywhere(ValueError, match="no rank holds any training rows"):
        mk.fit(mlp(12), X[:0], y[:0], batch_size=32, epochs=1, verbose=0)


@pytest.mark.parametrize("batch_size", [0, -4])
def test_batch_size_below_one(digits, batch_size):
    X, y = digits
    Xl, yl = mpinb.shard(X, y)
    with raises_everywhere(ValueError, match="batch_size must be a positive integer"):
        mk.fit(mlp(13), Xl, yl, batch_size=batch_size, epochs=1, verbose=0)


@pytest.mark.parametrize("strategy", ["gradients", "weights"])
def test_nan_loss_stops_every_rank_together(strategy, packing):
    rng = np.random.default_rng(RANK)
    n = 64 * 4
    Xl = rng.normal(size=(n, 8)).astype(np.float32)
    yl = rng.normal(size=(n, 1)).astype(np.float32)
    if RANK == SIZE - 1:
        yl[40:] = 3e38  # finite data whose squared error overflows to inf on this rank only
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    counter = CountBatches()
    with raises_everywhere(FloatingPointError, match="NaN or infinite") as info:
        mk.fit(model, Xl, yl, batch_size=8 * SIZE, epochs=3, shuffle=False, callbacks=[counter], verbose=0,
               strategy=strategy)
    assert_same_everywhere(counter.batches)
    assert info.value.history["epoch"] == [0]


@pytest.mark.parametrize("strategy", ["gradients", "weights"])
def test_interrupt_request_on_one_rank_stops_all_at_the_same_step(digits, strategy):
    from mpinb.interrupt import StopFlag

    X, y = digits
    Xl, yl = mpinb.shard(X, y)
    flag = StopFlag()

    class PressCtrlC(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            if RANK == SIZE - 1 and self.epoch == 1 and batch == 2:
                flag.request()

    counter = CountBatches()
    model = mlp(14)
    with raises_everywhere(KeyboardInterrupt, match="every rank stopped") as info:
        mk.fit(model, Xl, yl, batch_size=32, epochs=3, strategy=strategy,
               callbacks=[PressCtrlC(), counter, mk.StopOnInterrupt(flag)], verbose=0)
    assert_same_everywhere(counter.batches)
    # With a DistributedOptimizer on several ranks the vote rides the next step's gradient buffer;
    # otherwise a small Allreduce after each step decides at once.
    assert counter.batches == info.value.history["steps"][0] + 3 + (strategy == "gradients" and SIZE > 1)
    assert_same_everywhere(weights_of(model))


DEADLINE = 2.0  # seconds the ranks wait for each other from the third step on
STALL = 2 * DEADLINE  # seconds the stuck rank sleeps


@pytest.mark.skipif(SIZE == 1, reason="needs a rank that can be late")
@pytest.mark.parametrize("strategy", ["gradients", "weights"])
def test_a_rank_stuck_mid_training_is_named_by_the_collective_deadline(digits, strategy, monkeypatch):
    import re
    import time

    from mpinb import CollectiveAbandoned, CollectiveTimeout, deadline

    X, y = digits
    Xl, yl = mpinb.shard(X, y)
    stuck = SIZE - 1
    dup = COMM.Dup()

    reached = {}

    class Stall(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if batch == 2:
                # From here on, a 2 s deadline: late enough that the first step's tracing (which can
                # differ by seconds between ranks sharing cores) is not what times out.
                deadline.set_collective_timeout(DEADLINE)
            if batch == 3:
                reached["t"] = time.monotonic()
                if RANK == stuck:
                    time.sleep(STALL)

    model = mlp(18)
    monkeypatch.setattr(deadline, "_setting", None)
    try:
        with pytest.raises((CollectiveTimeout, CollectiveAbandoned)) as info:
            mk.fit(model, Xl, yl, batch_size=32, epochs=1, strategy=strategy, average_every=1,
                   callbacks=[Stall()], comm=dup, verbose=0)
    finally:
        deadline.set_collective_timeout(None)
    elapsed = time.monotonic() - reached.get("t", float("nan"))
    COMM.Barrier()
    name = "gradient exchange" if strategy == "gradients" else "fit's weight average"
    text = str(info.value)
    if RANK == stuck:
        # It comes back and learns at once that the others gave up on this very exchange while it
        # slept: no second deadline of its own (that would end at STALL + DEADLINE or later).
        ok = (re.match(rf"{name} #\d+ on rank {stuck} came too late: rank \d+ abandoned {name} #\d+ [\d.]+ s ago "
                       r"\(timed out after 2 s\)", text) is not None and elapsed < STALL + DEADLINE)
    elif isinstance(info.value, CollectiveAbandoned):  # another waiting rank gave up first and said so
        ok = f"gave up on {name} #" in text
    else:  # the others name the missing rank (had they waited for it, nothing would have raised)
        ok = text.startswith(f"{name} #") and f"waiting for rank {stuck}" in text
    assert_everywhere(ok, f"{elapsed:.1f} s: {text}")
    # No restart: the same communicator works again.
    (total,) = mpinb.allreduce([np.ones(2)], comm=dup, timeout=30)
    assert_everywhere(np.array_equal(total, np.full(2, SIZE)))
    dup.Free()


def test_fit_and_evaluate_communicate_only_through_the_layer(digits):
    from support.counting import CountingComm

    X, y = digits
    Xl, yl = mpinb.shard(X, y)
    base = COMM.Dup()
    comm = CountingComm(base)
    for strategy in ("gradients", "weights"):
        model = mlp(5, batchnorm=True)
        mk.fit(model, Xl, yl, batch_size=32 * SIZE, epochs=1, strategy=strategy, average_every=2,
               validation_data=(Xl[:50], yl[:50]), comm=comm, verbose=0)
        mk.evaluate(model, Xl, yl, comm=comm)
    outside = comm.outside()
    inside = sum(1 for _, who in comm.calls if who.startswith("mpinb._collective"))
    COMM.Barrier()
    base.Free()
    assert_everywhere(not outside, f"MPI calls outside the collective layer: {outside[:5]}")
    assert_everywhere((inside > 0) == (SIZE > 1), f"{inside} calls in the layer")


def test_fit_keeps_the_thread_budget_the_user_chose(digits, monkeypatch):
    from threadpoolctl import threadpool_info

    import mpinb.comm

    X, y = digits
    Xl, yl = mpinb.shard(X, y)
    # As in a fresh process with no budget in its environment: fit would pick one, unless chosen.
    for var in mpinb.comm.thread_env(1):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(mpinb.comm, "_chosen_threads", None)
    assert not mpinb.comm.threads_chosen()
    # A budget other than the one fit would pick by itself, so that resetting it shows.
    chosen = 2 if mpinb.comm._default_threads(None, None) == 1 else 1
    try:
        assert mpinb.limit_threads(chosen) == chosen
        mk.fit(mlp(14), Xl, yl, batch_size=64, epochs=1, verbose=0)
        assert_everywhere(os.environ["OMP_NUM_THREADS"] == os.environ["TF_NUM_INTRAOP_THREADS"] == str(chosen),
                          f"fit changed the thread variables limit_threads({chosen}) set")
        pools = {p["internal_api"]: p["num_threads"] for p in threadpool_info()}
        assert_everywhere(all(n == chosen for n in pools.values()), f"fit resized BLAS/OpenMP pools: {pools}")
    finally:
        mpinb.limit_threads(1)


# --- the Horovod way: plain model.fit with DistributedOptimizer and the callbacks ------------------


@pytest.mark.parametrize("batchnorm", [False, True], ids=["mlp", "batchnorm"])
def test_plain_model_fit_with_distributed_optimizer_and_callbacks_equals_one_process(digits, batchnorm):
    X, y = digits
    B, epochs = 64, 2  # the same global batches at 1, 2 and 4 ranks
    per_rank = B // SIZE
    X, y = X[: len(X) // B * B], y[: len(X) // B * B]
    # Global batch k is rows [k*B, (k+1)*B); rank r holds its sub-batches of every global batch.
    mine = np.concatenate([np.arange(k * B + RANK * per_rank, k * B + (RANK + 1) * per_rank)
                           for k in range(len(X) // B)])
    model = mlp(20 + RANK, batchnorm=batchnorm,
                optimizer=mk.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)))
    callbacks = [mk.BroadcastInitialState(), mk.MetricAverage(), mk.SyncNonTrainable()]
    history = model.fit(X[mine], y[mine], batch_size=per_rank, epochs=epochs, shuffle=False, callbacks=callbacks,
                        verbose=0)

    def one_process():
        reference = mlp(20, batchnorm=batchnorm)  # rank 0's initial weights, as BroadcastInitialState gives
        losses = sharded_reference(reference, X, y, per_rank, epochs, SIZE)
        return weights_of(reference), statistics(reference), losses

    ref_weights, ref_stats, ref_losses = once(one_process)
    err = relative_error(weights_of(model), ref_weights)
    assert_everywhere(err < 1e-5, f"weights within 1e-5 of one process ({err:.2e})")
    assert_same_everywhere(weights_of(model))
    if batchnorm:
        stats = statistics(model)
        assert_everywhere(relative_error(stats, ref_stats) < 1e-5, "BatchNorm moving statistics match one process")
        assert_same_everywhere(stats)
    np.testing.assert_allclose(history.history["loss"], ref_losses, rtol=1e-5)
    assert_same_everywhere(np.array(history.history["loss"]))


def test_fit_uses_the_collective_callbacks_it_is_given_and_never_drops_them(digits):
    X, y = digits
    Xl, yl = mpinb.shard(X, y)
    model = mlp(30 + RANK)
    # epochs=0: only the initial broadcast runs, from the root the user's instance names.
    mk.fit(model, Xl, yl, batch_size=64, epochs=0, callbacks=[mk.BroadcastInitialState(root=SIZE - 1)], verbose=0)
    assert_everywhere(np.array_equal(weights_of(model), weights_of(mlp(30 + SIZE - 1))), "started from the last rank")
    average = mk.MetricAverage()
    history = mk.fit(model, Xl, yl, batch_size=64, epochs=2, callbacks=[average], verbose=0)
    assert len(average.rank_logs) == SIZE
    assert history["rank_loss"][-1] == [r["loss"] for r in average.rank_logs]
    # Weighted by each rank's rows (proportional shards): a rank with more rows counts more.
    rows = history["rows_used"][-1]
    assert rows == COMM.allgather(len(Xl))
    expected = np.dot([r["loss"] for r in average.rank_logs], rows) / sum(rows)
    assert history["loss"][-1] == pytest.approx(expected, rel=1e-12)


def test_fit_refuses_two_of_a_callback_it_applies(digits):
    X, y = digits
    Xl, yl = mpinb.shard(X, y)
    with raises_everywhere(ValueError, match="callbacks holds 2 SyncNonTrainable instances; fit applies one"):
        mk.fit(mlp(31), Xl, yl, batch_size=64, callbacks=[mk.SyncNonTrainable(), mk.SyncNonTrainable()], verbose=0)
