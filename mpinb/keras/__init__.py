"""Sharded (data-parallel) Keras 3 training over MPI: exact gradient averaging, global logs, joint stops.

Collective helpers for engines; Keras and TensorFlow are imported only by this subpackage, so
``import mpinb`` stays light. Typical use on every rank::

    X_local, y_local = mpinb.shard(X, y)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    history = mpinb.keras.fit(model, X_local, y_local, batch_size=256, epochs=10)
    scores = mpinb.keras.evaluate(model, X_test_local, y_test_local)
"""

from __future__ import annotations

from mpinb._quiet_tf import import_tensorflow

import_tensorflow()  # before Keras loads it: without the C++ start-up lines on every rank

from mpinb.gpus import use_one_gpu_per_rank  # noqa: E402
from mpinb.keras.callbacks import (  # noqa: E402
    BroadcastInitialState,
    LearningRateWarmup,
    MetricAverage,
    RootCheckpoint,
    StopOnInterrupt,
    SyncNonTrainable,
    broadcast_state,
)
from mpinb.keras.evaluation import evaluate  # noqa: E402
from mpinb.keras.optimizer import DistributedOptimizer, is_distributed  # noqa: E402
from mpinb.keras.training import fit  # noqa: E402

__all__ = [
    "BroadcastInitialState",
    "DistributedOptimizer",
    "LearningRateWarmup",
    "MetricAverage",
    "RootCheckpoint",
    "StopOnInterrupt",
    "SyncNonTrainable",
    "broadcast_state",
    "evaluate",
    "fit",
    "is_distributed",
    "use_one_gpu_per_rank",
]


def __dir__() -> list[str]:
    return list(__all__)
