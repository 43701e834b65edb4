"""`fit` and `evaluate` over sharded data: equal steps on every rank, global logs, exact evaluation."""

from __future__ import annotations

import json
import math
import os
import secrets
import time
import warnings
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np

from mpinb import _collective
from mpinb.comm import allreduce, gather_rows, limit_threads, on_root, threads_chosen
from mpinb.errors import _check_int, _resolve, check_all, check_same, raise_together
from mpinb.keras._inputs import Stream, as_stream
from mpinb.keras._sync import ArrayAverager, epoch_batches, steps_per_epoch, sum_arrays
from mpinb.keras.callbacks import (
    BroadcastInitialState,
    MetricAverage,
    RootCheckpoint,
    StopOnInterrupt,
    SyncNonTrainable,
)
from mpinb.keras.optimizer import DistributedOptimizer, is_distributed
from mpinb.live import Progress

__all__ = ["evaluate", "fit"]

_STRATEGIES = ("gradients", "weights")


def fit(
    model: Any,
    x: Any,
    y: Any = None,
    *,
    batch_size: int | None = None,
    epochs: int = 1,
    steps_per_epoch: int | None = None,
    accumulate_steps: int | None = None,
    validation_data: tuple[Any, Any] | None = None,
    strategy: str = "gradients",
    average_every: int = 1,
    shuffle: bool = True,
    seed: int | None = None,
    callbacks: list[Any] | None = None,
    checkpoint: str | os.PathLike | None = None,
    resume: bool = False,
    verbose: int | str = "auto",
    comm: Any = None,
) -> dict[str, Any]:
    """Train a compiled Keras model data-parallel over MPI ranks, each rank holding its own shard.

    Collective: every rank calls it with its own ``x, y`` and the same other arguments. The result
    does not depend on the number of ranks beyond float round-off: ``batch_size`` is the *global*
    batch, split into ``batch_size // n_ranks`` rows per rank, and with ``strategy="gradients"``
    one step on N ranks computes the same update as one step on the concatenated batch in one
    process.

    Every rank runs the same number of steps per epoch (the fewest full per-rank batches any rank
    holds; the rest of each shard is left out that epoch, a different part each epoch when
    shuffling), so uneven shards never hang a collective. Rank 0's initial weights are broadcast,
    epoch logs are global (averaged in sorted key order before any callback sees them),
    validation metrics are exact over uneven shards, BatchNorm statistics are averaged each epoch,
    and any stop (EarlyStopping, Ctrl-C, a NaN loss) happens on every rank at the same step.

    Parameters
    ----------
    model : keras.Model
        Compiled, with the same architecture on every rank. With ``strategy="gradients"`` its
        optimizer is replaced by ``DistributedOptimizer(optimizer)`` unless it already is one, and
        XLA (``jit_compile``) is turned off. ``compile(..., steps_per_execution=N)`` is honoured and
        worth setting: Keras's fixed cost of about 1.5 ms per call (on a 2-core machine) is then
        paid once per N steps, while the gradients are still averaged every step. Epochs and weight
        averages end on execution boundaries (N is lowered for this fit, with a warning, when it
        does not divide them), and a stop takes effect at the end of an execution.
    x, y : array_like, or a data pipeline and None
        This rank's training rows (arrays, or a list/dict of arrays for multi-input models); or,
        with ``y=None``, a pipeline yielding this rank's batches ``(x, y)`` or ``(x, y,
        sample_weight)``: a ``tf.data.Dataset`` (see :func:`mpinb.data.shard_files` and
        :func:`mpinb.data.shard_dataset`), a ``keras.utils.PyDataset`` (read in index order,
        ``on_epoch_end`` called after each epoch, no worker processes) or a Python generator.
        Every rank runs the same number of steps per epoch: ``steps_per_epoch``, or the fewest
        batches one pass of any rank's pipeline yields; a finite pipeline starts a new pass each
        epoch, an infinite ``tf.data`` one continues. Each rank's gradient counts equally, so give
        every rank batches of one size (``drop_remainder=True``) for the mean over the global batch.
    batch_size : int
        Global batch size: rows per step summed over ranks; a multiple of the number of ranks.
        Required with arrays; omitted with a pipeline (its batches are the per-rank batches).
    epochs : int, default 1
    steps_per_epoch : int, optional
        Steps per epoch on every rank. Required for a generator and for an infinite or
        unknown-length pipeline; with arrays, at most the full per-rank batches every rank holds.
    validation_data : (x_val, y_val), optional
        This rank's validation shard (may be empty on some ranks); scored exactly each epoch as
        ``val_*`` logs.
    strategy : {"gradients", "weights"}, default "gradients"
        ``"gradients"``: gradients averaged every step (one fused Allreduce). ``"weights"``: each
        rank takes local steps and weights plus optimizer state are averaged every
        ``average_every`` steps and at each epoch end.
    average_every : int, default 1
        Steps between weight averages for ``strategy="weights"``.
    shuffle : bool, default True
        Reshuffle each rank's shard every epoch from a seed shared by all ranks (arrays only: a
        pipeline shuffles itself).
    seed : int, optional
        The shared shuffling seed; drawn on rank 0 and broadcast when omitted.
    accumulate_steps : int, optional
        Gradient accumulation (strategy ``"gradients"``): each rank sums this many steps' gradients
        before one exchange and one update, which equals one step on the N times larger batch
        with N times fewer exchanges (for memory-bound batches, or slow networks). It must divide
        the steps per epoch. By default what the ``DistributedOptimizer`` was made with (1).
    callbacks : list of keras.callbacks.Callback, optional
        They receive global epoch logs (this is also the hook for live progress plots). fit is
        plain ``model.fit`` driven by mpinb's collective callbacks (:class:`BroadcastInitialState`,
        :class:`SyncNonTrainable`, :class:`MetricAverage`, :class:`StopOnInterrupt`); an instance
        of one of them given here is used in its place (say, ``BroadcastInitialState(root=3)``,
        or a ``MetricAverage`` whose ``rank_logs`` you want to read), and two of one kind are an
        error.
    checkpoint : str or os.PathLike, optional
        A ``.keras`` path rank 0 saves to after every epoch (:class:`RootCheckpoint`).
    resume : bool, default False
        Continue from ``checkpoint`` when it exists: weights and optimizer state from the file, on
        every rank, from the epoch after the saved one.
    verbose : int or "auto", default "auto"
        Keras verbosity on rank 0 ("auto": one line per epoch); other ranks are silent.
    comm : mpi4py.MPI.Comm, optional
        Defaults to ``MPI.COMM_WORLD``.

    Returns
    -------
    dict
        Identical on every rank. ``"epoch"`` (0-based), every global metric (``"loss"``,
        ``"val_loss"``, ...) as lists over epochs, ``"rank_loss"`` (per epoch, each rank's own
        training loss), ``"compute_seconds"`` and ``"comm_seconds"`` (per epoch, per rank; the
        latter waiting included), ``"wait_seconds"`` (the part of ``comm_seconds`` spent waiting for
        the slowest rank: load imbalance, not data transfer),
        ``"steps"`` per epoch, and ``"params"``.

    Raises
    ------
    ValueError
        Bad arguments or data (``len(x) != len(y)``, a shard with fewer rows than one per-rank
        batch, NaN inputs), on every rank, before training.
    CollectiveMismatchError
        The model or the arguments differ across ranks.
    FloatingPointError
        The loss became NaN or infinite; every rank stopped at the same step.
    KeyboardInterrupt
        Ctrl-C (or a ``StopFlag`` request) on any rank; every rank stopped at the same step.

    Examples
    --------
    >>> X_local, y_local = mpinb.shard(X, y)
    >>> history = mpinb.keras.fit(model, X_local, y_local, batch_size=256, epochs=10)
    >>> history["loss"][-1], history["rank_loss"][-1]
    """
    comm = _resolve(comm)
    user_callbacks = list(callbacks or [])
    stopper = next((cb for cb in user_callbacks if isinstance(cb, StopOnInterrupt)), None)
    if stopper is None:
        stopper = StopOnInterrupt(comm=comm)
    # SIGINT only sets the stopper's flag from the first line on: a Ctrl-C during validation, the
    # broadcast or the first trace reaches every rank through the first step's vote, instead of
    # raising on one rank while the others wait in a collective.
    settings = _FitSettings(batch_size, epochs, strategy, average_every, bool(shuffle), seed,
                            None if checkpoint is None else os.fspath(checkpoint), bool(resume), verbose,
                            steps_per_epoch, accumulate_steps)
    with stopper.flag:
        return _fit(model, x, y, validation_data, settings, user_callbacks, stopper, comm)


@dataclass(frozen=True)
class _FitSettings:
    """fit's arguments that every rank must pass alike (all but the data, callbacks and comm)."""

    batch_size: int
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

    def check(self, size: int, callbacks: list[Any], stream: Stream | None) -> None:
        """Local checks, with the messages users see on every rank."""
        if self.steps_per_epoch is not None:
            _check_int(self.steps_per_epoch, "steps_per_epoch", minimum=1)
        if stream is not None:
            if self.batch_size is not None:
                raise ValueError(
                    f"batch_size must be omitted when x is a {stream.kind}: each rank's batches come from its "
                    "data (the global batch is their sum)."
                )
        else:
            self._check_batch_size(size)
        _check_int(self.epochs, "epochs", minimum=0)
        if self.strategy not in _STRATEGIES:
            raise ValueError(f"strategy must be 'gradients' or 'weights'; got {self.strategy!r}.")
        _check_int(self.average_every, "average_every", minimum=1, unit="number of steps")
        if self.accumulate_steps is not None:
            _check_int(self.accumulate_steps, "accumulate_steps", minimum=1)
            if self.accumulate_steps > 1 and self.strategy == "weights":
                raise ValueError("accumulate_steps sums gradients before they are averaged: use it with "
                                 "strategy='gradients' (the weight strategy averages weights, not gradients).")
        for cb in callbacks:
            if not isinstance(cb, keras.callbacks.Callback):
                raise TypeError(f"callbacks must be keras.callbacks.Callback instances; got {cb!r}.")
        if self.resume and self.checkpoint is None:
            raise ValueError("resume=True needs checkpoint='path.keras' to resume from.")

    def _check_batch_size(self, size: int) -> None:
        if self.batch_size is None:
            raise ValueError("batch_size is required with in-memory arrays: the global batch over all ranks.")
        _check_int(self.batch_size, "batch_size", minimum=1, unit="(the global batch over all ranks)")
        if self.batch_size % size:
            lower = max(size, self.batch_size // size * size)
            raise ValueError(
                f"batch_size is the global batch and must be a multiple of the number of ranks ({size}); "
                f"got {self.batch_size}. Use {lower} or {lower + size}."
            )

    def agreed(self) -> tuple:
        """What :func:`check_same` compares across ranks (verbosity is rank 0's business)."""
        return (self.batch_size, self.epochs, self.strategy, self.average_every, self.shuffle, self.seed,
                self.checkpoint, self.resume, self.steps_per_epoch, self.accumulate_steps)


def _fit(model: Any, x: Any, y: Any, validation_data: Any, settings: _FitSettings, user_callbacks: list[Any],
         stopper: Any, comm: Any) -> dict[str, Any]:
    rank, size = comm.Get_rank(), comm.Get_size()
    s = settings
    batch_size, epochs, strategy, average_every = s.batch_size, s.epochs, s.strategy, s.average_every
    shuffle, seed, checkpoint, resume = s.shuffle, s.seed, s.checkpoint, s.resume
    stream = as_stream(x)
    with raise_together(comm=comm):
        settings.check(size, user_callbacks, stream)
        if stream is None:
            n_local = _check_xy(x, y, "x", "y")
            _check_finite_inputs(x, y)
        elif y is not None:
            raise ValueError(f"y must be None when x is a {stream.kind}: it yields (x, y) batches.")
        if validation_data is not None:
            if (not isinstance(validation_data, (tuple, list)) or len(validation_data) != 2
                    or as_stream(validation_data[0]) is not None):
                raise TypeError("validation_data must be a pair (x_val, y_val) of this rank's validation rows, as "
                                "arrays (scored exactly over uneven shards); a pipeline is not accepted there.")
            _check_xy(*validation_data, "validation_data[0]", "validation_data[1]")
        _check_model(model, strategy)
    check_same(
        (*settings.agreed(), validation_data is None, None if stream is None else stream.kind),
        "fit()'s arguments (batch_size, epochs, strategy, average_every, shuffle, seed, checkpoint, resume, "
        "steps_per_epoch, accumulate_steps, validation, kind of x)",
        comm=comm,
    )
    if stream is None:
        per_rank = batch_size // size
        counts = _collective.allgather(n_local, comm=comm, name="fit's row counts")
        check_all(
            n_local >= per_rank,
            f"this rank holds {n_local} training rows, fewer than one per-rank batch of {per_rank} "
            f"(batch_size={batch_size} over {size} ranks); give every rank at least {per_rank} rows or lower batch_size",
            comm=comm,
        )
        steps = _agreed_steps(steps_per_epoch(counts, per_rank), s.steps_per_epoch, "full per-rank batches", comm)
        if not model.built:
            model(_take(x, np.arange(min(1, n_local))))
    else:
        per_rank, counts = None, None
        steps = _stream_steps(stream, s.steps_per_epoch, comm)
        if not model.built:
            model(stream.first_inputs())
    if seed is None:
        seed = on_root(lambda: secrets.randbits(62), comm=comm)

    if not threads_chosen():
        # Nobody chose a budget: share the node's cores rather than let every rank take them all.
        # (Local after the collectives above set up the channel, so ranks may differ here.)
        with warnings.catch_warnings():
            # TensorFlow's pools are fixed once it runs; limit_threads says so, and that is expected here.
            warnings.simplefilter("ignore", RuntimeWarning)
            limit_threads(comm=comm)

    if strategy == "gradients":
        if not is_distributed(model.optimizer):
            model.optimizer = DistributedOptimizer(model.optimizer, comm=comm)
            model.train_function = None  # retrace: the cached step still calls the old optimizer
        if model.jit_compile:
            if rank == 0:
                warnings.warn(
                    "mpinb.keras.fit turned jit_compile off: XLA cannot compile the MPI Allreduce.",
                    RuntimeWarning,
                    stacklevel=2,
                )
            model.jit_compile = False
            model.train_function = None

    exchange = model.optimizer._mpinb_exchange if is_distributed(model.optimizer) else None
    # Micro-steps summed before one exchange: fit's argument, else what the optimizer was made with.
    accumulate = 1 if exchange is None else int(s.accumulate_steps or exchange.accumulate)
    if steps % accumulate:
        raise ValueError(
            f"accumulate_steps={accumulate} must divide the {steps} steps per epoch, so that every epoch ends "
            "on an update; change batch_size, steps_per_epoch or accumulate_steps."
        )

    initial_epoch = 0
    if checkpoint is not None and resume:
        initial_epoch = _resume(model, os.fspath(checkpoint), comm)
    # Before any step: same starting point everywhere (and a model that differs across ranks fails
    # here, on every rank, with the shapes it found).
    applied = _applied_callbacks(user_callbacks, comm)
    applied[BroadcastInitialState].broadcast(model)

    loop = _FitLoop(
        comm=comm, strategy=strategy, average_every=average_every,
        validation_data=validation_data, eval_batch=max(per_rank or 0, 32), epochs=epochs,
        metrics=applied[MetricAverage],
    )
    stopper.raise_errors = False
    # Order matters: weight averages and timings close the epoch; BatchNorm statistics are synced
    # and logs made global before validation runs and user callbacks (EarlyStopping, live plots)
    # read them; the checkpoint saves the synced state; the stopper, last, turns every stop
    # request made by the callbacks before it into a decision shared by all ranks.
    ordered = [
        loop,
        applied[SyncNonTrainable],
        applied[MetricAverage],
        loop.recorder,
        *[cb for cb in user_callbacks if not isinstance(cb, (StopOnInterrupt, *_APPLIED))],
    ]
    if checkpoint is not None:
        ordered.append(RootCheckpoint(checkpoint, comm=comm))
    ordered.append(stopper)

    requested = int(getattr(model, "steps_per_execution", 1) or 1)
    # Weight averages happen between executions, so an execution must also end on every average.
    boundary = math.gcd(steps, average_every) if strategy == "weights" else steps
    per_execution = _steps_per_execution(requested, boundary)
    if per_execution != requested and rank == 0:
        what = f"the {steps} steps per epoch" + (f" and average_every={average_every}" if strategy == "weights" else "")
        warnings.warn(
            f"steps_per_execution={requested} does not divide {what}; this fit runs {per_execution} "
            "step(s) per execution so that epochs (and weight averages) end on their own last step.",
            RuntimeWarning,
            stacklevel=3,
        )
    history = loop.history
    history["params"] = {
        "batch_size": batch_size, "per_rank_batch": per_rank, "steps_per_epoch": steps, "ranks": size,
        "strategy": strategy, "average_every": average_every, "seed": int(seed), "shuffle": bool(shuffle),
        "rows_per_rank": None if counts is None else [int(c) for c in counts], "initial_epoch": initial_epoch,
        "epochs": epochs, "steps_per_execution": per_execution, "input": "arrays" if stream is None else stream.kind,
        "accumulate_steps": accumulate,
    }
    if initial_epoch < epochs:
        if stream is None:
            dataset = _dataset(x, y, n_local, per_rank, steps, initial_epoch, epochs, seed, rank, shuffle)
        else:
            dataset = stream.feed(steps, epochs - initial_epoch)
        if per_execution != requested:
            model.steps_per_execution = per_execution
            model.train_function = None
        accumulated_before = None if exchange is None else exchange.accumulate
        if exchange is not None:
            exchange.error = None
            if accumulate != exchange.accumulate:
                exchange.accumulate = accumulate
                model.train_function = None
            if accumulate > 1:
                # Built now, outside the traced step: the update runs inside a tf.cond branch,
                # where no variable may be created.
                if not model.optimizer.built:
                    model.optimizer.build(model.trainable_variables)
                exchange.sums_for(list(model.trainable_variables))
        try:
            model.fit(
                dataset,
                epochs=epochs,
                initial_epoch=initial_epoch,
                steps_per_epoch=steps,
                callbacks=ordered,
                shuffle=False,  # the dataset is already in the epoch's order
                verbose=(2 if s.verbose == "auto" else s.verbose) if rank == 0 else 0,
            )
        except Exception as err:
            if exchange is not None and exchange.error is not None:
                # The gradient exchange failed inside TensorFlow's step (a CollectiveTimeout naming
                # the missing rank): raise that, not TensorFlow's wrapper around its message.
                original, exchange.error = exchange.error, None
                raise original from err
            raise
        finally:
            stopper.release()
            if exchange is not None and exchange.accumulate != accumulated_before:
                exchange.accumulate = accumulated_before
                model.train_function = None
            if per_execution != requested:
                model.steps_per_execution = requested
                model.train_function = None
    if stopper.stopped is not None:
        try:
            stopper.raise_if_stopped()
        except BaseException as err:
            err.add_note("mpinb: the history up to the stop is in this exception's .history")
            err.history = history  # type: ignore[attr-defined]
            raise
    return history


def evaluate(model: Any, x: Any, y: Any, *, batch_size: int = 32, comm: Any = None) -> dict[str, float]:
    """Exact global metrics of a compiled model over test shards of any sizes.

    Collective. Each rank evaluates its own rows; then every metric's state variables (totals and
    counts, confusion counts, ...) are summed over ranks before the results are read, so the numbers
    equal one process evaluating all rows, even when shards are uneven or some are empty. (Averaging
    per-rank results would weight small shards too much.) Metrics whose state does not add up
    across rows, such as a running maximum, are not supported.

    Parameters
    ----------
    model : keras.Model
        Compiled; the same on every rank.
    x, y : array_like
        This rank's rows; zero rows are fine as long as some rank has rows.
    batch_size : int, default 32
        Rows per evaluation batch on each rank (affects speed, not the result).
    comm : mpi4py.MPI.Comm, optional
        Defaults to ``MPI.COMM_WORLD``.

    Returns
    -------
    dict
        Metric name → value (``"loss"`` first among sorted keys), identical on every rank.

    Examples
    --------
    >>> scores = mpinb.keras.evaluate(model, X_test_local, y_test_local)
    >>> scores["accuracy"]
    """
    comm = _resolve(comm)
    with raise_together(comm=comm):
        _check_int(batch_size, "batch_size", minimum=1)
        n_local = _check_xy(x, y, "x", "y")
        if not getattr(model, "compiled", False):
            raise ValueError("evaluate needs a compiled model: call model.compile(loss=..., metrics=...) first.")
    (total,) = allreduce([np.int64(n_local)], comm=comm)
    if total == 0:
        raise ValueError("evaluate got no rows on any rank; pass each rank's test shard.")
    return _global_evaluate(model, x, y, n_local, batch_size, comm)


class _FitLoop(keras.callbacks.Callback):
    """fit's own bookkeeping: weight averaging and epoch timings (first among the callbacks), then,
    through ``recorder`` (after SyncNonTrainable and MetricAverage), exact validation, the history
    dict and live progress."""

    def __init__(self, *, comm: Any, strategy: str, average_every: int, validation_data: Any, eval_batch: int,
                 epochs: int, metrics: MetricAverage) -> None:
        super().__init__()
        self.metrics = metrics
        self.recorder = keras.callbacks.LambdaCallback(on_epoch_end=self._record)
        self._epoch_times = [0.0, 0.0, 0.0, 0.0]
        # Rank 0 publishes the global loss curve to the notebook each epoch (mpinb.live.watch draws
        # it while the cell runs); a no-op under plain mpiexec.
        self.progress = Progress("loss", total=epochs, comm=comm, min_interval=0.0)
        self.comm = comm
        self.strategy = strategy
        self.average_every = average_every
        self.validation_data = validation_data
        self.eval_batch = eval_batch
        self.history: dict[str, Any] = {"epoch": [], "steps": [], "rank_loss": [], "compute_seconds": [],
                                        "comm_seconds": [], "wait_seconds": []}
        self._since_average = 0
        self._t0 = 0.0
        self._at_begin = np.zeros(2)  # the exchange's (comm, wait) seconds at epoch begin
        self._weights_times = np.zeros(2)  # (comm, wait) seconds of this epoch's weight averages
        self._steps_done = 0
        self._averager = ArrayAverager(comm)

    def _exchange_times(self) -> np.ndarray:
        opt = self.model.optimizer
        if not is_distributed(opt):
            return np.zeros(2)
        return np.array([opt._mpinb_exchange.seconds, opt._mpinb_exchange.wait_seconds])

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._steps_done = 0
        self._weights_times = np.zeros(2)
        self._at_begin = self._exchange_times()
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        # With steps_per_execution=N Keras calls this once per N steps, with the last step's index.
        done = int(batch) + 1
        self._since_average += done - self._steps_done
        self._steps_done = done
        if self.strategy == "weights" and self._since_average >= self.average_every:
            self._average_weights()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self.strategy == "weights" and self._since_average:
            self._average_weights()
        wall = time.perf_counter() - self._t0
        comm_s, wait_s = self._exchange_times() - self._at_begin + self._weights_times
        self._epoch_times = [wall - comm_s, comm_s, wait_s, float(self._steps_done)]

    def _record(self, epoch: int, logs: dict | None) -> None:
        """After SyncNonTrainable and MetricAverage: exact validation, the history, live progress."""
        logs = logs if logs is not None else {}
        if self.validation_data is not None:
            xv, yv = self.validation_data
            scores = _global_evaluate(self.model, xv, yv, _length(xv), self.eval_batch, self.comm)
            logs.update({f"val_{k}": v for k, v in scores.items()})
        times = gather_rows(np.array([self._epoch_times]), root=None, comm=self.comm)
        h = self.history
        h["epoch"].append(int(epoch))
        h["steps"].append(int(times[0, 3]))
        ranks = self.metrics.rank_logs
        if ranks and "loss" in ranks[0]:
            h["rank_loss"].append([r["loss"] for r in ranks])
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
        averaged, wait = self._averager.average(values)
        for v, a in zip(variables, averaged):
            v.assign(a.astype(str(v.dtype), copy=False))
        self._since_average = 0
        self._weights_times += (time.perf_counter() - t0, wait)


def _global_evaluate(model: Any, x: Any, y: Any, n_local: int, batch_size: int, comm: Any) -> dict[str, float]:
    if n_local > 0:
        model.evaluate(x, y, batch_size=batch_size, verbose=0, return_dict=True)
    else:
        # Metric variables are created on the first update; an empty shard evaluates one dummy row
        # so its metrics have the same layout as everyone else's, then zeroes their state.
        model.evaluate(_dummy_row(x), _dummy_row(y), verbose=0, return_dict=True)
        for m in model.metrics:
            m.reset_state()
    variables = list(model.metrics_variables)
    local = [np.array(v.numpy(), copy=True) for v in variables]
    for v, s in zip(variables, sum_arrays(local, comm=comm)):
        v.assign(s)
    results = model.get_metrics_result()
    for v, mine in zip(variables, local):
        v.assign(mine)  # leave this rank's own state as Keras left it
    return {k: float(np.asarray(results[k])) for k in sorted(results)}


def _dataset(x: Any, y: Any, n_local: int, per_rank: int, steps: int, first_epoch: int, epochs: int,
             seed: int, rank: int, shuffle: bool) -> Any:
    """A tf.data pipeline yielding exactly ``steps`` batches per epoch, each epoch's order drawn by
    :func:`epoch_batches` (so it is NumPy-defined and reproducible), gathered from tensors in memory."""
    import tensorflow as tf

    xt = tf.nest.map_structure(tf.convert_to_tensor, _as_arrays(x))
    yt = tf.nest.map_structure(tf.convert_to_tensor, _as_arrays(y))

    def order(epoch: np.ndarray) -> np.ndarray:
        return epoch_batches(n_local, per_rank_batch=per_rank, steps=steps, epoch=int(epoch), seed=seed,
                             rank=rank, shuffle=shuffle)

    def epoch_indices(epoch: Any) -> Any:
        idx = tf.numpy_function(order, [epoch], tf.int64, stateful=False)
        return tf.data.Dataset.from_tensor_slices(tf.ensure_shape(idx, (steps, per_rank)))

    def gather(idx: Any) -> Any:
        return (tf.nest.map_structure(lambda t: tf.gather(t, idx), xt),
                tf.nest.map_structure(lambda t: tf.gather(t, idx), yt))

    return (tf.data.Dataset.range(first_epoch, epochs)
            .flat_map(epoch_indices)
            .map(gather, num_parallel_calls=1, deterministic=True)
            .prefetch(2))


def _agreed_steps(available: int, requested: int | None, what: str, comm: Any) -> int:
    """``steps_per_epoch`` when given (at most what every rank has), else what every rank has."""
    if requested is None:
        return available
    check_all(available >= requested,
              f"steps_per_epoch={requested} is more than the {available} {what} every rank has", comm=comm)
    return requested


def _stream_steps(stream: Stream, requested: int | None, comm: Any) -> int:
    """Steps per epoch for pipelines: the fewest batches any rank's pipeline yields per pass, or
    ``steps_per_epoch``. Collective: every rank runs the same steps, or every rank raises."""
    local = stream.batches_per_epoch()
    if requested is None:
        check_all(local is not None,
                  f"x is a {stream.kind} of unknown or infinite length on this rank; pass steps_per_epoch= "
                  "(the same on every rank)", comm=comm)
        counts = _collective.allgather(local, comm=comm, name="fit's batches per rank")
        check_all(min(counts) > 0, f"some rank's {stream.kind} yields no batch (batches per rank: {counts})", comm=comm)
        return int(min(counts))
    check_all(local is None or local >= requested,
              f"this rank's {stream.kind} yields {local} batches per pass, fewer than steps_per_epoch={requested}",
              comm=comm)
    return requested


def _steps_per_execution(requested: int, steps: int) -> int:
    """The largest number of steps per execution, at most ``requested``, that divides ``steps``
    (steps per epoch, or the steps between two weight averages).

    Keras runs whole executions: with ``steps_per_execution`` not dividing ``steps_per_epoch`` the
    last execution of an epoch would take batches from the next epoch (and the last epoch would
    come up short), so epoch-end callbacks would see the wrong steps.
    """
    return max(d for d in range(1, max(1, min(requested, steps)) + 1) if steps % d == 0)


def _resume(model: Any, path: str, comm: Any) -> int:
    """Load the checkpoint on rank 0; the broadcast at train begin then gives its state to everyone.
    Returns the first epoch to run (0 when there is no checkpoint yet)."""
    opt = model.optimizer
    if not opt.built:
        # Built everywhere, so the optimizer state is part of the broadcast layout on every rank.
        opt.build(model.trainable_variables)
    return on_root(_load_checkpoint, model, path, comm=comm)


def _load_checkpoint(model: Any, path: str) -> int:
    if not os.path.exists(path):
        return 0
    record_path = f"{path}.json"
    if not os.path.exists(record_path):
        raise FileNotFoundError(f"{path} exists but its epoch record {record_path} does not; was it written by RootCheckpoint?")
    with open(record_path) as fh:
        epoch = int(json.load(fh)["epoch"])
    saved = keras.models.load_model(path, compile=True)
    if [tuple(v.shape) for v in saved.weights] != [tuple(v.shape) for v in model.weights]:
        raise ValueError(f"The checkpoint {path} holds a model with different weight shapes than this one.")
    for v, s in zip(model.weights, saved.weights):
        v.assign(s.numpy())
    mine, theirs = model.optimizer.variables, getattr(saved.optimizer, "variables", [])
    if [tuple(v.shape) for v in mine] != [tuple(v.shape) for v in theirs]:
        raise ValueError(f"The optimizer state in {path} does not match this model's optimizer ({type(model.optimizer).__name__}).")
    for v, s in zip(mine, theirs):
        v.assign(s.numpy())
    return epoch + 1


# The collective callbacks fit always applies: a user's instance is used in place of fit's own.
_APPLIED = (BroadcastInitialState, SyncNonTrainable, MetricAverage)


def _applied_callbacks(callbacks: list[Any], comm: Any) -> dict[type, Any]:
    """fit's instance of each collective callback it applies: the user's when given, else a new one."""
    from mpi4py import MPI

    applied: dict[type, Any] = {}
    for kind in _APPLIED:
        given = [cb for cb in callbacks if isinstance(cb, kind)]
        if len(given) > 1:
            raise ValueError(f"callbacks holds {len(given)} {kind.__name__} instances; fit applies one.")
        if given and MPI.Comm.Compare(given[0].comm, comm) not in (MPI.IDENT, MPI.CONGRUENT):
            raise ValueError(f"the {kind.__name__} in callbacks uses another communicator than fit's comm.")
        applied[kind] = given[0] if given else kind(comm=comm)
    return applied


def _check_model(model: Any, strategy: str) -> None:
    if not isinstance(model, keras.Model):
        raise TypeError(f"model must be a keras.Model; got {type(model).__name__}.")
    if not getattr(model, "compiled", False) or getattr(model, "optimizer", None) is None:
        raise ValueError("The model is not compiled: call model.compile(optimizer=..., loss=...) before fit.")
    opt = model.optimizer
    inner = getattr(opt, "inner_optimizer", None)
    if inner is not None and is_distributed(inner) and not is_distributed(opt):
        raise ValueError(
            "The model's LossScaleOptimizer wraps a DistributedOptimizer; wrap the outermost one instead: "
            "compile(optimizer=DistributedOptimizer(LossScaleOptimizer(opt))), or pass a plain optimizer."
        )
    if strategy == "weights" and is_distributed(opt):
        raise ValueError(
            "strategy='weights' averages weights, so the optimizer must not also average gradients: "
            "compile with the plain optimizer, not a DistributedOptimizer."
        )


def _check_xy(x: Any, y: Any, xname: str, yname: str) -> int:
    nx, ny = _length(x), _length(y)
    if nx != ny:
        raise ValueError(f"{xname} and {yname} must have the same number of rows; got {nx} and {ny}.")
    return nx


def _check_finite_inputs(x: Any, y: Any) -> None:
    for name, value in (("x", x), ("y", y)):
        for leaf in _leaves(_as_arrays(value)):
            if leaf.dtype.kind == "f" and not np.isfinite(leaf).all():
                raise ValueError(f"{name} contains NaN or infinity; clean the data before training.")


def _length(data: Any) -> int:
    lengths = {len(leaf) if leaf.ndim else -1 for leaf in _leaves(_as_arrays(data))}
    if len(lengths) != 1 or -1 in lengths:
        raise ValueError(f"every input array needs the same number of rows along axis 0; got lengths {sorted(lengths)}.")
    return lengths.pop()


def _as_arrays(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: np.asarray(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)) and data and all(hasattr(v, "shape") for v in data):
        return type(data)(np.asarray(v) for v in data)
    return np.asarray(data)


def _leaves(data: Any) -> list[np.ndarray]:
    if isinstance(data, dict):
        return [data[k] for k in sorted(data)]
    if isinstance(data, (list, tuple)):
        return list(data)
    return [data]


def _take(data: Any, idx: np.ndarray) -> Any:
    data = _as_arrays(data)
    if isinstance(data, dict):
        return {k: v[idx] for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(v[idx] for v in data)
    return data[idx]


def _dummy_row(data: Any) -> Any:
    data = _as_arrays(data)

    def one(v: np.ndarray) -> np.ndarray:
        return np.zeros((1, *v.shape[1:]), dtype=v.dtype)

    if isinstance(data, dict):
        return {k: one(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(one(v) for v in data)
    return one(data)

