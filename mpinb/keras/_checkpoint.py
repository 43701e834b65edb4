"""A Keras model's checkpoint: saved on rank 0 as ``.keras`` with its epoch record, resumed from it."""

from __future__ import annotations

from typing import Any

import keras

from mpinb._training.checkpoint import save_atomically, saved_epoch
from mpinb.comm import on_root

__all__ = ["resume", "save"]


def save(model: Any, filepath: str, epoch: int) -> None:
    """Rank 0 only: write the model atomically, then the epoch record beside it."""
    save_atomically(model.save, filepath, epoch)


def resume(model: Any, path: str, comm: Any) -> int:
    """Load the checkpoint on rank 0; the broadcast at train begin then gives its state to everyone.
    Returns the first epoch to run (0 when there is no checkpoint yet). Collective."""
    opt = model.optimizer
    if not opt.built:
        # Built everywhere, so the optimizer state is part of the broadcast layout on every rank.
        opt.build(model.trainable_variables)
    return on_root(_load, model, path, comm=comm)


def _load(model: Any, path: str) -> int:
    epoch = saved_epoch(path)
    if epoch is None:
        return 0
    saved = keras.models.load_model(path, compile=True)
    if [tuple(v.shape) for v in saved.weights] != [tuple(v.shape) for v in model.weights]:
        raise ValueError(f"The checkpoint {path} holds a model with different weight shapes than this one.")
    for v, s in zip(model.weights, saved.weights, strict=True):
        v.assign(s.numpy())
    mine, theirs = model.optimizer.variables, getattr(saved.optimizer, "variables", [])
    if [tuple(v.shape) for v in mine] != [tuple(v.shape) for v in theirs]:
        raise ValueError(f"The optimizer state in {path} does not match this model's optimizer "
                         f"({type(model.optimizer).__name__}).")
    for v, s in zip(mine, theirs, strict=True):
        v.assign(s.numpy())
    return epoch + 1
