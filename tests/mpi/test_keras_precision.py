"""Mixed precision under mpinb.keras.fit at 1, 2 and 4 ranks: a step equals one process under the
same policy, and under mixed_float16 every rank takes the loss-scale optimizer's same branch."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpinb
from support.keras_reference import once, relative_error, snapshot, spike, weights_of
from support.mpitools import assert_everywhere, assert_same_everywhere

keras = pytest.importorskip("keras")
mk = pytest.importorskip("mpinb.keras")

pytestmark = pytest.mark.mpi_sizes(1, 2, 4)

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
N, GLOBAL_BATCH = 256, 64  # 256 = 4 x 64: equal shards at 1, 2 and 4 ranks


@pytest.fixture
def policy(request):
    keras.mixed_precision.set_global_policy(request.param)
    yield request.param
    keras.mixed_precision.set_global_policy("float32")


def data():
    rng = np.random.default_rng(7)  # drawn whole on every rank, then sharded: the same rows everywhere
    X = rng.normal(size=(N, 16)).astype(np.float32)
    y = (X[:, :4].sum(axis=1) > 0).astype(np.int64) + 2 * (X[:, 4] > 0)
    return X, y


def model_for(seed: int, initial_scale: float | None = None):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(4, activation="softmax")])
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    if initial_scale is not None:
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer, initial_scale=initial_scale)
    # Under mixed_float16 compile wraps a plain optimizer in a LossScaleOptimizer itself.
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
    return model


def order(per_rank: int) -> np.ndarray:
    bounds = [mpinb.shard_bounds(N, rank=r, size=SIZE) for r in range(SIZE)]
    steps = (bounds[0][1] - bounds[0][0]) // per_rank
    return np.concatenate([np.arange(lo + k * per_rank, lo + (k + 1) * per_rank)
                           for k in range(steps) for lo, _ in bounds])


@pytest.mark.parametrize(("policy", "tolerance"), [("mixed_bfloat16", 3e-2), ("mixed_float16", 5e-3)],
                         indirect=["policy"])
def test_a_mixed_precision_fit_equals_one_process_under_the_same_policy(policy, tolerance, packing):
    X, y = data()
    Xl, yl = mpinb.shard(X, y)
    # A scale that overflows in no step: a full batch's float16 gradient can overflow where its
    # quarters do not, and a step one process skips is not a difference of mpinb's.
    scale = 2.0**8 if policy == "mixed_float16" else None
    model = model_for(3, scale)
    assert model.layers[0].compute_dtype == policy.split("_")[1]
    if policy == "mixed_float16":
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    initial = snapshot(model)
    history = mk.fit(model, Xl, yl, batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0)
    rows = order(GLOBAL_BATCH // SIZE)

    def one_process():
        reference = model_for(3, scale)
        reference.set_weights(initial)
        fitted = reference.fit(X[rows], y[rows], batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0)
        return weights_of(reference), fitted.history["loss"]

    ref, ref_loss = once(one_process)
    mine = weights_of(model)
    err = relative_error(mine, ref)
    assert_everywhere(err < tolerance, f"{policy}: weights within {tolerance} of one process ({err:.2e})")
    assert_same_everywhere(mine)
    np.testing.assert_allclose(history["loss"], ref_loss, rtol=tolerance)



@pytest.mark.parametrize("policy", ["mixed_float16"], indirect=True)
def test_a_non_finite_gradient_on_one_rank_skips_the_step_on_every_rank(policy, packing):
    X, y = data()
    Xl, yl = mpinb.shard(X, y)
    keras.utils.set_random_seed(4)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(16, activation="relu"),
                              spike(np.inf if RANK == SIZE - 1 else 1.0),
                              keras.layers.Dense(4, activation="softmax")])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    scale = float(model.optimizer.initial_scale)
    kernel = model.layers[0].kernel.numpy()  # the same on every rank: built from the same seed
    mk.fit(model, Xl, yl, batch_size=GLOBAL_BATCH, epochs=1, steps_per_epoch=1, shuffle=False, verbose=0)
    after = model.optimizer.dynamic_scale.numpy()
    assert_same_everywhere(np.array([after]))
    assert_everywhere(after == scale / 2, f"the scale halved on every rank ({scale} -> {after})")
    assert_same_everywhere(weights_of(model))
    assert_everywhere(bool(np.all(np.isfinite(weights_of(model)))), "the weights stay finite")
    assert_everywhere(np.array_equal(model.layers[0].kernel.numpy(), kernel), "the step skipped: no update")
