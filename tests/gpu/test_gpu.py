"""GPU checks, for a machine with an NVIDIA GPU; everything skips in one line elsewhere.

Run at 1 rank (``python -m pytest tests/gpu``) and at 2 ranks sharing one GPU
(``MPINB_GPUS=share MPINB_GPU_MEMORY_LIMIT_MB=4000 mpiexec -n 2 python -m mpi4py -m pytest tests/gpu``).
The device choice must come first, before TensorFlow initialises, so it runs at import.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from mpinb import gpus

if not gpus.inventory():
    pytest.skip("no GPU on this machine (CUDA_VISIBLE_DEVICES / nvidia-smi / /proc/driver/nvidia)",
                allow_module_level=True)

CHOICE = gpus.use_one_gpu_per_rank()

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from mpi4py import MPI  # noqa: E402

import mpinb  # noqa: E402
import mpinb.keras as mk  # noqa: E402

COMM = MPI.COMM_WORLD


def test_each_rank_sees_exactly_its_one_gpu():
    assert os.environ["CUDA_VISIBLE_DEVICES"] == CHOICE.gpu
    assert len(tf.config.list_physical_devices("GPU")) == 1
    if CHOICE.sharers == 1:
        assert os.environ["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    chosen = COMM.allgather(CHOICE.gpu)
    if CHOICE.sharers == 1:
        hosts = COMM.allgather(mpinb.world().host)
        assert len(set(zip(hosts, chosen, strict=True))) == COMM.Get_size(), f"two ranks on one GPU: {chosen}"


@pytest.mark.parametrize("policy", ["float32", "mixed_float16", "mixed_bfloat16"])
def test_fit_on_the_gpu_equals_one_process(policy):
    keras.mixed_precision.set_global_policy(policy)
    try:
        rng = np.random.default_rng(0)
        X = rng.normal(size=(1024, 32)).astype(np.float32)
        y = (X[:, 0] > 0).astype(np.int64)
        Xl, yl = mpinb.shard(X, y)

        def build():
            keras.utils.set_random_seed(1)
            m = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                                  keras.layers.Dense(2, activation="softmax")])
            m.compile(optimizer=keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy")
            return m

        model = build()
        initial = model.get_weights()
        mk.fit(model, Xl, yl, batch_size=128, epochs=1, shuffle=False, verbose=0)
        size = COMM.Get_size()
        per = 128 // size
        bounds = [mpinb.shard_bounds(len(X), rank=r, size=size) for r in range(size)]
        order = np.concatenate([np.arange(lo + k * per, lo + (k + 1) * per)
                                for k in range((bounds[0][1] - bounds[0][0]) // per) for lo, _ in bounds])
        ref = build()
        ref.set_weights(initial)
        ref.fit(X[order], y[order], batch_size=128, epochs=1, shuffle=False, verbose=0)
        mine = np.concatenate([np.ravel(w) for w in model.get_weights()])
        theirs = np.concatenate([np.ravel(w) for w in ref.get_weights()])
        tol = 1e-4 if policy == "float32" else 3e-2
        assert np.linalg.norm(mine - theirs) / np.linalg.norm(theirs) < tol
    finally:
        keras.mixed_precision.set_global_policy("float32")
