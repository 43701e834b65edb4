"""fit's own callback: weight averages and epoch timings, then exact validation, the history and live progress."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import keras
import numpy as np

from mpinb._training.averaging import ArrayAverager
from mpinb.comm import gather_rows
from mpinb.keras.callbacks import MetricAverage
from mpinb.keras.evaluation import Scored, global_evaluate
from mpinb.keras.optimizer import TensorExchange
from mpinb.live import Progress

__all__ = ["FitLoop"]


class FitLoop(keras.callbacks.Callback):
    """fit's own bookkeeping: weight averaging and epoch timings (first among the callbacks), then,
    through ``recorder`` (after SyncNonTrainable and MetricAverage), exact validation, the history
    dict and live progress."""

    def __init__(self, *, comm: Any, strategy: str, average_every: int, validation: Scored | None, eval_batch: int,
                 epochs: int, metrics: MetricAverage, exchange: TensorExchange | None) -> None:
        super().__init__()
        self.exchange = exchange
        self.metrics = metrics
        self.recorder = keras.callbacks.LambdaCallback(on_epoch_end=self._record)
        self._epoch_times = [0.0, 0.0, 0.0, 0.0, 0.0]
        # Rank 0 publishes the global loss curve to the notebook each epoch (mpinb.live.watch draws
        # it while the cell runs); a no-op under plain mpiexec.
        self.progress = Progress("loss", total=epochs, comm=comm, min_interval=0.0)
        self.comm = comm
        self.strategy = strategy
        self.average_every = average_every
        self.validation = validation
        self.eval_batch = eval_batch
        self.history: dict[str, Any] = {"epoch": [], "steps": [], "rank_loss": [], "compute_seconds": [],
                                        "comm_seconds": [], "wait_seconds": [], "rows_used": []}
        self._since_average = 0
        self._t0 = 0.0
        self._at_begin = np.zeros(2)  # the exchange's (comm, wait) seconds at epoch begin
        self._weights_times = np.zeros(2)  # (comm, wait) seconds of this epoch's weight averages
        self._steps_done = 0
        self._averager = ArrayAverager(comm)
        # Set by fit on uneven shards: its train step's row counter (mpinb.keras._step.StepRows),
        # which weighs each weight average by the rows every rank took since the last one; and,
        # for a pipeline (whose rows no plan knows), what to tell every rank's rows each epoch.
        self.rows: Any = None
        self.weigh_epoch: Callable[[list[int]], None] | None = None
        self._rows_at = [0, 0]  # the counter at this epoch's begin and at the last weight average

    def _exchange_times(self) -> np.ndarray:
        return np.zeros(2) if self.exchange is None else self.exchange.times()

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._steps_done = 0
        self._weights_times = np.zeros(2)
        self._at_begin = self._exchange_times()
        if self.rows is not None:
            self._rows_at = [self.rows.rows()] * 2
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        # With steps_per_execution=N Keras calls this once per N steps, with the last step's index.
        done = int(batch) + 1
        self._since_average += done - self._steps_done
        self._steps_done = done
        self.progress.batch(done, (self.params or {}).get("steps"), logs)  # the rank panel's step (mpinb._progress)
        if self.strategy == "weights" and self._since_average >= self.average_every:
            self._average_weights()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self.strategy == "weights" and self._since_average:
            self._average_weights()
        if self.weigh_epoch is not None:
            mine = self.rows.rows() - self._rows_at[0]
            self.weigh_epoch([int(r) for r in gather_rows(np.array([mine], dtype=np.int64), root=None, comm=self.comm)])
        wall = time.perf_counter() - self._t0
        comm_s, wait_s = self._exchange_times() - self._at_begin + self._weights_times
        self._epoch_times = [wall - comm_s, comm_s, wait_s, float(self._steps_done), self._rows_seen()]

    def _rows_seen(self) -> float:
        """The rows this rank's training steps took this epoch, as Keras counted them: its loss
        tracker is a mean weighted by each batch's rows (``nan`` where there is none)."""
        tracker = next((m for m in self.model.metrics if m.name == "loss" and hasattr(m, "count")), None)
        return float("nan") if tracker is None else float(np.asarray(tracker.count))

    def _record(self, epoch: int, logs: dict | None) -> None:
        """After SyncNonTrainable and MetricAverage: exact validation, the history, live progress."""
        logs = logs if logs is not None else {}
        if self.validation is not None:
            scores = global_evaluate(self.model, self.validation, self.eval_batch, self.comm)
            logs.update({f"val_{k}": v for k, v in scores.items()})
        times = gather_rows(np.array([self._epoch_times]), root=None, comm=self.comm)
        h = self.history
        h["epoch"].append(int(epoch))
        h["steps"].append(int(times[0, 3]))
        for name in self.metrics.rank_logs[0] if self.metrics.rank_logs else ():
            h.setdefault(f"rank_{name}", []).append([r[name] for r in self.metrics.rank_logs])
        h["rows_used"].append([int(t) if np.isfinite(t) else None for t in times[:, 4]])
        h["compute_seconds"].append([float(t) for t in times[:, 0]])
        h["comm_seconds"].append([float(t) for t in times[:, 1]])
        h["wait_seconds"].append([float(t) for t in times[:, 2]])
        for k in sorted(logs):
            if np.ndim(logs[k]) == 0:
                h.setdefault(k, []).append(float(logs[k]))
        self.progress.update(int(epoch) + 1, **{k: float(logs[k]) for k in ("loss", "val_loss") if k in logs})

    def on_train_end(self, logs: dict | None = None) -> None:
        self.progress.close()

    def _average_weights(self) -> None:
        t0 = time.perf_counter()
        variables = list(self.model.weights)
        opt = self.model.optimizer
        if opt.built:
            variables += list(opt.variables)
        # Integer state (the step counter) is equal on every rank by construction; half-precision
        # variables travel as float32, which MPI can sum.
        variables = [v for v in variables if np.dtype(str(v.dtype)).kind == "f"]
        values = [np.asarray(v.numpy(), dtype=np.float32) if np.dtype(str(v.dtype)).itemsize < 4 else v.numpy()
                  for v in variables]
        rows = None
        if self.rows is not None:
            now = self.rows.rows()
            rows, self._rows_at[1] = now - self._rows_at[1], now
        averaged, wait = self._averager.average(values, rows)
        for v, a in zip(variables, averaged, strict=True):
            v.assign(a.astype(str(v.dtype), copy=False))
        self._since_average = 0
        self._weights_times += (time.perf_counter() - t0, wait)
