"""Collective Keras callbacks: same initial state, global logs, synced statistics, root-only saving, joint stops."""

from __future__ import annotations

import os
from typing import Any

import keras
import numpy as np

from mpinb._checks import check_int, default_comm
from mpinb._training.averaging import ArrayAverager, gather_logs
from mpinb._training.packing import bcast_arrays
from mpinb._training.stopping import JointStop
from mpinb.agreement import check_same
from mpinb.comm import on_root
from mpinb.interrupt import StopFlag
from mpinb.keras._checkpoint import save
from mpinb.keras.optimizer import exchange_of

__all__ = [
    "BroadcastInitialState",
    "LearningRateWarmup",
    "MetricAverage",
    "RootCheckpoint",
    "StopOnInterrupt",
    "SyncNonTrainable",
    "broadcast_state",
]


class BroadcastInitialState(keras.callbacks.Callback):
    """Copy rank 0's weights, non-trainable variables and optimizer state to every rank at train begin.

    Collective (every rank's ``fit`` must hold it). Ranks initialise their weights independently, so
    without this they start from different points and the averaged gradients fit none of them. The
    optimizer state is copied too when the optimizer is already built (resuming); the weight shapes
    are checked first, so a model that differs across ranks raises
    :class:`~mpinb.CollectiveMismatchError` on every rank instead of hanging.

    Parameters
    ----------
    root : int, default 0
    comm : mpi4py.MPI.Comm, optional
        Defaults to ``MPI.COMM_WORLD``.
    """

    def __init__(self, root: int = 0, *, comm: Any = None) -> None:
        super().__init__()
        self.root = root
        self.comm = default_comm(comm)

    def on_train_begin(self, logs: dict | None = None) -> None:
        """Keras hook: every rank starts from root's weights and optimizer state. Collective."""
        self.broadcast(self.model)

    def broadcast(self, model: Any) -> None:
        """Copy root's state of ``model`` now (what ``mpinb.keras.fit`` does before its first step)."""
        broadcast_state(model, root=self.root, comm=self.comm)


class MetricAverage(keras.callbacks.Callback):
    """Replace each epoch's logs by their mean over ranks, in sorted key order.

    Collective. Put it first in ``callbacks`` so that EarlyStopping, ReduceLROnPlateau and
    checkpoints see the same global numbers on every rank and decide the same way. With the same
    number of steps and the same per-rank batch size on every rank, the mean of per-rank means is
    the global mean; with ``weights`` (what ``mpinb.keras.fit`` sets with proportional shards:
    each rank's rows that epoch) the weighted mean, which for metrics that are means over rows
    (loss, accuracy) is the global one. For exact metrics of any kind over uneven shards use
    :func:`mpinb.keras.evaluate`. Ranks whose logs have different names raise
    :class:`~mpinb.CollectiveMismatchError` on every rank.

    Attributes
    ----------
    rank_logs : list of dict
        After each epoch, every rank's own logs before averaging, in rank order (``fit`` keeps
        each one as the history's ``rank_<name>``).
    weights : list of float, optional
        One weight per rank for the mean (``None``: a plain mean).
    """

    def __init__(self, *, comm: Any = None) -> None:
        super().__init__()
        self.comm = default_comm(comm)
        self.rank_logs: list[dict[str, float]] = []
        self.weights: list[float] | None = None

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        """Keras hook: ``logs`` become the global means (each rank's own values kept in ``rank_logs``). Collective."""
        if logs is None:
            return
        means, self.rank_logs = gather_logs(logs, comm=self.comm, weights=self.weights)
        # Keras hands the same dict to the callbacks that follow, so update it in place.
        logs.update(means)


class SyncNonTrainable(keras.callbacks.Callback):
    """Average non-trainable floating-point variables (BatchNorm moving statistics) at each epoch end.

    Collective. Each rank's BatchNorm layers see only its own batches, so their moving mean and
    variance drift apart; ``BatchNormalization(synchronized=True)`` does nothing outside
    ``tf.distribute``. Averaging at epoch end makes them identical on every rank before evaluation
    and checkpoints. With ``share`` (this rank's rows over all rows, what ``mpinb.keras.fit`` sets
    with proportional shards) the mean is weighted by rows.
    """

    def __init__(self, *, comm: Any = None) -> None:
        super().__init__()
        self.comm = default_comm(comm)
        self.share: float | None = None

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        """Keras hook: the non-trainable weights (BatchNormalization's moving statistics) agree again. Collective."""
        sync_non_trainable(self.model, comm=self.comm, share=self.share)


class LearningRateWarmup(keras.callbacks.Callback):
    """Ramp the learning rate linearly from ``start_factor × lr`` to ``lr`` over the first epochs.

    Local: every rank computes the same rate from the step count, so nothing is communicated.
    Useful when scaling the learning rate with the number of ranks (a larger global batch): large
    rates at the very start can diverge. The optimizer's learning rate must be a number, not a
    schedule.

    Parameters
    ----------
    warmup_epochs : float, default 5
        Length of the ramp, in epochs (fractions allowed).
    start_factor : float, optional
        Initial rate as a fraction of the target; defaults to ``1 / number of ranks``.
    comm : mpi4py.MPI.Comm, optional
        Only used for the default ``start_factor``.
    """

    def __init__(self, warmup_epochs: float = 5, *, start_factor: float | None = None, comm: Any = None) -> None:
        super().__init__()
        if not warmup_epochs > 0:
            raise ValueError(f"warmup_epochs must be > 0; got {warmup_epochs!r}.")
        if start_factor is not None and not 0 < start_factor <= 1:
            raise ValueError(f"start_factor must be in (0, 1]; got {start_factor!r}.")
        self.warmup_epochs = warmup_epochs
        self.start_factor = start_factor
        self.comm = default_comm(comm)
        self._target: float | None = None
        self._epoch = 0

    def on_train_begin(self, logs: dict | None = None) -> None:
        """Keras hook: remember the compiled learning rate, the warm-up's target. Local."""
        lr = self.model.optimizer.learning_rate
        if isinstance(lr, keras.optimizers.schedules.LearningRateSchedule) or callable(lr):
            raise TypeError("LearningRateWarmup needs a constant learning rate, not a LearningRateSchedule.")
        self._target = float(np.asarray(lr))

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        """Keras hook: remember the epoch, for the warm-up's progress. Local."""
        self._epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        """Keras hook: set this step's learning rate on the linear ramp. Local (the same on every rank)."""
        steps = (self.params or {}).get("steps") or 1
        progress = (self._epoch + batch / steps) / self.warmup_epochs
        if progress > 1 or self._target is None:
            return
        start = self.start_factor if self.start_factor is not None else 1.0 / self.comm.Get_size()
        self.model.optimizer.learning_rate = self._target * (start + (1.0 - start) * progress)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        """Keras hook: the target learning rate from the end of the warm-up on. Local."""
        if self._target is not None and epoch + 1 >= self.warmup_epochs:
            self.model.optimizer.learning_rate = self._target


class RootCheckpoint(keras.callbacks.Callback):
    """Save the model (with optimizer state) as ``.keras`` on rank 0 after each epoch; others wait.

    Collective. Rank 0 writes to a temporary file and renames it, so a crash never leaves a
    half-written checkpoint, and records the finished epoch in ``<filepath>.json`` for
    ``fit(..., resume=True)``. Its outcome, or its exception, reaches every rank, which is also the
    barrier: no rank reads the file before it is complete. Put it after :class:`MetricAverage` and
    :class:`SyncNonTrainable` so the saved state is the global one.

    Parameters
    ----------
    filepath : str or os.PathLike
        Must end in ``.keras``.
    every : int, default 1
        Save every ``every`` epochs (and always at the last one).
    comm : mpi4py.MPI.Comm, optional
        Defaults to ``MPI.COMM_WORLD``.
    """

    def __init__(self, filepath: str | os.PathLike, *, every: int = 1, comm: Any = None) -> None:
        super().__init__()
        filepath = os.fspath(filepath)
        if not filepath.endswith(".keras"):
            raise ValueError("RootCheckpoint saves the native Keras format: filepath must end in .keras; "
                             f"got {filepath!r}.")
        check_int(every, "every", minimum=1, unit="number of epochs")
        self.filepath = filepath
        self.every = every
        self.comm = default_comm(comm)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        """Keras hook: root saves every ``every`` epochs and after the last one. Collective."""
        last = epoch + 1 >= (self.params or {}).get("epochs", epoch + 1)
        if (epoch + 1) % self.every and not last:
            return
        on_root(save, self.model, self.filepath, epoch, comm=self.comm)


class StopOnInterrupt(keras.callbacks.Callback):
    """Make every stop collective: Ctrl-C, a NaN loss, or any callback's ``model.stop_training``.

    Collective. Put it **last** in ``callbacks``. While training runs, SIGINT only sets a
    :class:`~mpinb.interrupt.StopFlag`. With a ``DistributedOptimizer`` the vote rides in the
    gradient exchange's arrival (no extra message): every rank learns after the same step that some rank asked
    to stop, and stops there. With any other optimizer one three-number Allreduce per step decides.
    A stop requested locally by another callback mid-epoch (``TerminateOnNaN`` seeing this rank's
    loss) takes effect on all ranks one step later; at epoch end one small Allreduce agrees.
    Non-finite averaged gradients stop every rank at that very step.

    After training, ``stopped`` holds ``(reason, epoch, step)`` with reason ``"interrupt"``,
    ``"nonfinite"`` or ``"callback"``, identical on every rank; with ``raise_errors=True`` an
    interrupt raises ``KeyboardInterrupt`` and a non-finite loss ``FloatingPointError`` on every rank.

    Parameters
    ----------
    flag : mpinb.interrupt.StopFlag, optional
        The flag to watch (``flag.request()`` stops like Ctrl-C); a new one by default.
    raise_errors : bool, default True
    comm : mpi4py.MPI.Comm, optional
        Defaults to ``MPI.COMM_WORLD``.
    """

    def __init__(self, flag: StopFlag | None = None, *, raise_errors: bool = True, comm: Any = None) -> None:
        super().__init__()
        self.raise_errors = raise_errors
        self.comm = default_comm(comm)
        self._joint = JointStop(flag if flag is not None else StopFlag(), self.comm)
        self._epoch = 0
        self._exchange: Any = None

    @property
    def flag(self) -> StopFlag:
        """The flag watched: ``flag.request()`` stops like Ctrl-C."""
        return self._joint.flag

    @property
    def stopped(self) -> tuple[str, int, int] | None:
        """``(reason, epoch, step)`` of the joint stop, or ``None``; the same on every rank."""
        return self._joint.stopped

    def on_train_begin(self, logs: dict | None = None) -> None:
        """Keras hook: start the joint stop; the gradient exchange carries its votes where there is one. Local."""
        self._joint.begin()
        # One rank has no gradient exchange to carry the votes (the optimizer skips it there).
        ex = exchange_of(self.model.optimizer)
        self._exchange = ex if ex is not None and ex.carries_votes else None
        if self._exchange is not None:
            self._exchange.take_votes()  # votes of an earlier run are not this run's

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        """Keras hook: remember the epoch, for the report of where training stopped. Local."""
        self._epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        """Keras hook: this step's exchange carries this rank's stop votes. Local."""
        if self._exchange is not None:
            self._exchange.votes = self._joint.votes

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        """Keras hook: a stop asked for on this rank only waits until every rank agrees on it."""
        if self.model.stop_training:
            # Another callback stopped this rank only: hold it back until every rank agrees.
            self.model.stop_training = False
            self._joint.hold()
        if self._exchange is not None:
            votes = self._exchange.take_votes()
        else:
            votes = self._joint.vote((logs or {}).get("loss"))
        interrupt, stop, nonfinite = votes
        self.model.stop_training = self._joint.decide(interrupt, nonfinite, stop, self._epoch, batch)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        """Keras hook: every rank votes on stopping, and all stop together or none. Collective."""
        interrupt, stop, nonfinite = self._joint.vote((logs or {}).get("loss"), bool(self.model.stop_training))
        self.model.stop_training = self._joint.decide(interrupt, nonfinite, stop, self._epoch, None)

    def on_train_end(self, logs: dict | None = None) -> None:
        """Keras hook: restore the SIGINT handler; raise what stopped training, if ``raise_errors``. Local."""
        self.release()
        if self.raise_errors:
            self.raise_if_stopped()

    def release(self) -> None:
        """Give SIGINT back to its previous handler (idempotent; on_train_end calls it)."""
        self._joint.release()

    def raise_if_stopped(self) -> None:
        """Raise the error that matches ``stopped`` (the same on every rank); nothing otherwise."""
        self._joint.raise_if_stopped()


def broadcast_state(model: Any, *, root: int = 0, comm: Any = None) -> None:
    """Copy ``root``'s model weights (and built optimizer variables) to every rank.

    Collective. Shapes and dtypes are checked first: a model that differs across ranks raises
    :class:`~mpinb.CollectiveMismatchError` on every rank.
    """
    comm = default_comm(comm)
    if not model.built:
        raise ValueError(
            "The model has no weights yet; build it (keras.Input(...) as first layer, or call it on "
            "one batch) before broadcasting its state."
        )
    variables = list(model.weights)
    opt = getattr(model, "optimizer", None)
    built = bool(opt is not None and opt.built)
    check_same(built, "whether the optimizer is built (has state to broadcast)", comm=comm)
    if built and opt is not None:
        variables += list(opt.variables)
    check_same([(tuple(v.shape), str(v.dtype)) for v in variables], "the model's weight shapes and dtypes", comm=comm,
               labels=[getattr(v, "path", v.name) for v in variables])
    if comm.Get_size() == 1:
        return
    values = [np.array(v.numpy(), copy=True) for v in variables]
    for v, value in zip(variables, bcast_arrays(values, root=root, comm=comm), strict=True):
        v.assign(value)


def sync_non_trainable(model: Any, *, comm: Any = None, share: float | None = None) -> None:
    """Average the model's floating-point non-trainable variables over ranks (weighted, with
    ``share`` this rank's weight over all ranks' weights). Collective."""
    comm = default_comm(comm)
    variables = [v for v in model.non_trainable_variables if np.dtype(str(v.dtype)).kind == "f"]
    if comm.Get_size() == 1 or not variables:
        return
    means, _ = ArrayAverager(comm).average([v.numpy() for v in variables], share)
    for v, value in zip(variables, means, strict=True):
        v.assign(value)
