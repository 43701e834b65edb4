"""A Keras callback timing training steps, shared by the Keras benchmarks (a sibling module)."""

from __future__ import annotations

import functools
import time
from typing import Any

__all__ = ["StepClock"]


def StepClock() -> Any:  # noqa: N802 - reads as the class it makes
    """A new callback measuring the time per step from the end of the first execution to the end of
    the last (so per-call set-up and tracing stay out); ``per_step()`` reads it after ``fit``.

    Keras is imported at the first call, not at import: a GPU benchmark must choose its device first.
    """
    return _clock_class()()


@functools.cache
def _clock_class() -> type:
    import keras

    class _StepClock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            now = time.perf_counter()
            if not hasattr(self, "first"):
                self.first, self.first_batch = now, batch
            self.last, self.steps = now, batch - self.first_batch

        def per_step(self) -> float:
            return (self.last - self.first) / max(self.steps, 1)

    return _StepClock
