"""fit's arguments that every rank must pass alike, and their local checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import keras

from mpinb._checks import check_int
from mpinb._training.plan import SHARDS
from mpinb.keras._inputs import Stream

__all__ = ["FitSettings"]

_STRATEGIES = ("gradients", "weights")


@dataclass(frozen=True)
class FitSettings:
    """fit's arguments that every rank must pass alike (all but the data, callbacks and comm)."""

    batch_size: int | None  # None with a pipeline: its own batches
    epochs: int
    strategy: str
    average_every: int
    shuffle: bool
    seed: int | None
    checkpoint: str | None
    resume: bool
    verbose: Any
    steps_per_epoch: int | None
    accumulate_steps: int | None
    shards: str | None = None

    def shards_for(self, stream: Stream | None) -> str:
        """The plan this fit runs: proportional (every row once per epoch, weighted by rows) unless
        asked otherwise, for arrays and pipelines, under either strategy."""
        return "proportional" if self.shards is None else self.shards

    def check(self, size: int, callbacks: list[Any], stream: Stream | None) -> None:
        """Local checks, with the messages users see on every rank."""
        if self.steps_per_epoch is not None:
            check_int(self.steps_per_epoch, "steps_per_epoch", minimum=1)
        if self.shards is not None and self.shards not in SHARDS:
            raise ValueError(f"shards must be 'proportional' or 'equal'; got {self.shards!r}.")
        if stream is not None:
            if self.batch_size is not None:
                raise ValueError(
                    f"batch_size must be omitted when x is a {stream.kind}: each rank's batches come from its "
                    "data (the global batch is their sum)."
                )
        else:
            self._check_batch_size(size, self.shards_for(stream) == "equal")
        check_int(self.epochs, "epochs", minimum=0)
        if self.strategy not in _STRATEGIES:
            raise ValueError(f"strategy must be 'gradients' or 'weights'; got {self.strategy!r}.")
        check_int(self.average_every, "average_every", minimum=1, unit="number of steps")
        if self.accumulate_steps is not None:
            check_int(self.accumulate_steps, "accumulate_steps", minimum=1)
            if self.accumulate_steps > 1 and self.strategy == "weights":
                raise ValueError("accumulate_steps sums gradients before they are averaged: use it with "
                                 "strategy='gradients' (the weight strategy averages weights, not gradients).")
        for cb in callbacks:
            if not isinstance(cb, keras.callbacks.Callback):
                raise TypeError(f"callbacks must be keras.callbacks.Callback instances; got {cb!r}.")
        if self.resume and self.checkpoint is None:
            raise ValueError("resume=True needs checkpoint='path.keras' to resume from.")

    def _check_batch_size(self, size: int, equal: bool) -> None:
        if self.batch_size is None:
            raise ValueError("batch_size is required with in-memory arrays: the global batch over all ranks.")
        check_int(self.batch_size, "batch_size", minimum=1, unit="(the global batch over all ranks)")
        if equal and self.batch_size % size:
            lower = max(size, self.batch_size // size * size)
            raise ValueError(
                f"batch_size is the global batch and must be a multiple of the number of ranks ({size}) with "
                f"shards='equal'; got {self.batch_size}. Use {lower} or {lower + size}."
            )

    def agreed(self) -> tuple:
        """What :func:`check_same` compares across ranks (verbosity is rank 0's business)."""
        return (self.batch_size, self.epochs, self.strategy, self.average_every, self.shuffle, self.seed,
                self.checkpoint, self.resume, self.steps_per_epoch, self.accumulate_steps, self.shards)
