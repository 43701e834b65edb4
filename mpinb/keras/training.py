"""`fit` over sharded data: every row once per epoch (or equal steps), global logs, joint stops, exact validation.

fit is plain ``model.fit`` driven by mpinb's collective callbacks; the steps below set it up.
"""

from __future__ import annotations

import os
import secrets
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import keras

from mpinb._checks import default_comm
from mpinb._collective import collective_call
from mpinb._training.plan import check_accumulate, execution_boundary
from mpinb._training.plan import steps_per_execution as _steps_per_execution
from mpinb.agreement import check_same, raise_together
from mpinb.comm import limit_threads, on_root, threads_chosen
from mpinb.gpus import ensure_chosen
from mpinb.keras import _arrays, _compat
from mpinb.keras._checkpoint import resume as _resume
from mpinb.keras._inputs import Stream, as_stream
from mpinb.keras._loop import FitLoop
from mpinb.keras._settings import FitSettings
from mpinb.keras._shards import plan_batches, weighted_by_rows
from mpinb.keras.callbacks import (
    BroadcastInitialState,
    MetricAverage,
    RootCheckpoint,
    StopOnInterrupt,
    SyncNonTrainable,
)
from mpinb.keras.evaluation import Scored, validation_rows
from mpinb.keras.optimizer import DistributedOptimizer, TensorExchange, exchange_of, is_distributed

__all__ = ["fit"]

# The collective callbacks fit always applies: a user's instance is used in place of fit's own.
_APPLIED = (BroadcastInitialState, SyncNonTrainable, MetricAverage)


def fit(
    model: Any,
    x: Any,
    y: Any = None,
    *,
    batch_size: int | None = None,
    epochs: int = 1,
    steps_per_epoch: int | None = None,
    accumulate_steps: int | None = None,
    validation_data: Any = None,
    validation_steps: int | None = None,
    shards: str | None = None,
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

    Collective: every rank calls it with its own ``x, y`` and the same other arguments. Each *step*
    does not depend on the number of ranks beyond float round-off: ``batch_size`` is the *global*
    batch, and with ``strategy="gradients"`` one step on N ranks computes the same update as one
    step of one process on the union of the ranks' local batches. Which rows meet in a batch does
    depend on how the rows are sharded and shuffled (each rank shuffles its own shard), so after
    several shuffled epochs the weights differ from one process's as two runs with different
    shuffles do (3 ranks against one process after 4 epochs: up to 0.15 in a weight), not by
    round-off; with ``shuffle=False`` and the rows dealt so that each rank's k-th batch holds the
    one process's k-th batch, the runs agree to round-off epoch after epoch.

    By default (``shards="proportional"``) every rank uses each of its rows once per epoch, as Keras
    does in one process, however uneven the shards: each step's global batch of ``batch_size`` rows
    (the epoch's last one the remainder) is split over the ranks in proportion to their rows, and
    each rank's gradient counts by its local batch, so a rank with three times the rows takes three
    times the rows each step and weighs three times more; a rank with no rows in a step (or none
    at all) joins the exchange with weight 0. ``shards="equal"`` keeps every rank's batch the same
    (``batch_size // n_ranks``) and runs the fewest full per-rank batches any rank holds, leaving
    the rest of each larger shard out that epoch (a different part each epoch when shuffling), as
    Horovod does. Either way every rank runs the same number of steps, so uneven shards never hang
    a collective. Rank 0's initial weights are broadcast, epoch logs are global (weighted by each
    rank's rows, in sorted key order, before any callback sees them), validation metrics are exact
    over uneven shards, BatchNorm statistics (per local batch) are averaged each epoch weighted by
    rows, and any stop (EarlyStopping, Ctrl-C, a NaN loss) happens on every rank at the same step.

    Parameters
    ----------
    model : keras.Model
        Compiled, with the same architecture on every rank. With ``strategy="gradients"`` its
        optimizer is replaced by ``DistributedOptimizer(optimizer)`` unless it already is one, and
        XLA (``jit_compile``) is turned off. ``compile(..., steps_per_execution=N)`` is honoured and
        worth setting: Keras's fixed cost of about 1.5 ms per call (on a 2-core machine) is then
        paid once per N steps, while the gradients are still averaged every step. Epochs and weight
        averages end on execution boundaries (N is lowered for this fit, with a warning, when it
        does not divide them), and a stop takes effect at the end of an execution. The train step
        is traced once per model: the next ``fit`` of the same model (the next cell) reuses it,
        unless the model was compiled again or the step changed (accumulation, steps per
        execution, the gradient weighting of arrays against pipelines).
    x, y : array_like, or a data pipeline and None
        This rank's training rows (arrays, or a list/dict of arrays for multi-input models; a
        ``scipy.sparse`` matrix for ``x``, as Keras accepts, is fed as sparse batches); or,
        with ``y=None``, a pipeline yielding this rank's batches ``(x, y)`` or ``(x, y,
        sample_weight)``: a ``tf.data.Dataset`` (see :func:`mpinb.data.shard_files` and
        :func:`mpinb.data.shard_dataset`), a ``keras.utils.PyDataset`` (read in index order,
        ``on_epoch_end`` called after each epoch, no worker processes) or a Python generator.
        A finite pipeline starts a new pass each epoch, an infinite ``tf.data`` one continues.
        With ``shards="proportional"`` (the default) and pipelines of known length on every rank
        (a ``tf.data.Dataset`` of known cardinality, a ``PyDataset`` with ``__len__``), an epoch
        runs as many steps as the longest pipeline yields batches, so every batch of every rank is
        used once per epoch: step k combines each rank's k-th batch, each rank's gradient weighted
        by the rows of that batch (counted as the step runs), and a rank whose pipeline has ended
        takes the remaining steps with no rows (weight 0). That equals one process whose k-th
        batch is the union of every rank's k-th batch (within float round-off), whatever the
        batch sizes; with batches of one size ``b`` on every rank it is one process on batches of
        ``n_ranks * b``. Of unknown length (a generator, a filtered or infinite ``tf.data``) a
        pipeline needs ``steps_per_epoch`` and must yield that many batches each epoch (each still
        weighted by its rows): no rank can tell in advance when another's ends, and a per-step vote
        would add a collective on the input thread beside the gradient exchange's; give it a
        length (``dataset.apply(tf.data.experimental.assert_cardinality(n))``) to have every
        batch used. ``shards="equal"`` runs the fewest batches any rank yields (or
        ``steps_per_epoch``), every rank's gradient counting alike, as before.
    batch_size : int
        Global batch size: rows per step summed over ranks (with ``shards="equal"`` a multiple of
        the number of ranks). Required with arrays; omitted with a pipeline (its batches are the
        per-rank batches).
    epochs : int, default 1
    steps_per_epoch : int, optional
        Steps per epoch on every rank. Required for a generator and for an infinite or
        unknown-length pipeline; with arrays, at most the steps of the plan (the first ones run).
    validation_data : (x_val, y_val) or a data pipeline, optional
        This rank's validation shard (may be empty on some ranks), or a pipeline of this rank's
        validation batches (a ``tf.data.Dataset``, ``keras.utils.PyDataset`` or generator, as for
        ``x``); scored exactly over every rank's rows each epoch (weighted by rows, as one process
        on all of them) as ``val_*`` logs.
    validation_steps : int, optional
        Batches of this rank's validation pipeline scored each epoch; required where its length is
        unknown or infinite, and for a generator (which each epoch continues).
    shards : {"proportional", "equal"}, optional
        How uneven shards share each step (see above). ``"proportional"`` (the default, for arrays
        and pipelines under either strategy): every row once per epoch, local batches proportional
        to each rank's rows (a pipeline's own batches), gradients, weight averages and logs
        weighted by rows. ``"equal"``: the same local batch on every rank, the fewest full batches
        any rank holds, every rank counting alike.
    strategy : {"gradients", "weights"}, default "gradients"
        ``"gradients"``: gradients averaged every step (one fused Allreduce). ``"weights"``: each
        rank takes local steps and weights plus optimizer state are averaged every
        ``average_every`` steps and at each epoch end; with proportional shards the average is
        weighted by the rows each rank trained on since the last one (a rank that took none
        takes no part), so with ``average_every=1`` and momentum SGD it equals the gradient
        strategy.
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
        with N times fewer exchanges (for memory-bound batches, or slow networks); with
        proportional shards each micro-step counts by its rows. It must divide the steps per epoch. By default
        what the ``DistributedOptimizer`` was made with (1).
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
        ``"val_loss"``, ...) as lists over epochs, ``"rank_<name>"`` for every training metric
        (``"rank_loss"``, ``"rank_accuracy"``, ...: per epoch, each rank's own value over its own
        rows), ``"rows_used"`` (per epoch, the rows each rank trained on), ``"compute_seconds"`` and
        ``"comm_seconds"`` (per epoch, per rank; the latter waiting included), ``"wait_seconds"`` (the part of
        ``comm_seconds`` spent waiting for the slowest rank: load imbalance, not data transfer), ``"steps"`` per
        epoch, and ``"params"``.

    Raises
    ------
    ValueError
        Bad arguments or data (``len(x) != len(y)``, no rows on any rank, with ``shards="equal"`` a
        shard with fewer rows than one per-rank batch, NaN inputs), on every rank, before training.
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
    comm = default_comm(comm)
    ensure_chosen(comm)  # one GPU per rank, if nothing has initialised TensorFlow's devices yet
    user_callbacks = list(callbacks or [])
    stopper = next((cb for cb in user_callbacks if isinstance(cb, StopOnInterrupt)), None)
    if stopper is None:
        stopper = StopOnInterrupt(comm=comm)
    # SIGINT only sets the stopper's flag from the first line on: a Ctrl-C during validation, the
    # broadcast or the first trace reaches every rank through the first step's vote, instead of
    # raising on one rank while the others wait in a collective.
    settings = FitSettings(batch_size, epochs, strategy, average_every, bool(shuffle), seed,
                            None if checkpoint is None else os.fspath(checkpoint), bool(resume), verbose,
                            steps_per_epoch, accumulate_steps, shards)
    # Outermost: an error of this rank's own step or callback, raised between two collectives,
    # ends the other ranks' waits (in a script nothing else would).
    with collective_call("mpinb.keras.fit", comm), stopper.flag:
        return _fit(model, x, y, (validation_data, validation_steps), settings, user_callbacks, stopper, comm)


def _fit(model: Any, x: Any, y: Any, validation_data: Any, settings: FitSettings, user_callbacks: list[Any],
         stopper: StopOnInterrupt, comm: Any) -> dict[str, Any]:
    s = settings
    stream = as_stream(x)
    n_local, validation = _check_inputs(model, x, y, validation_data, s, user_callbacks, stream, comm)
    shards = s.shards_for(stream)
    plan, empty = plan_batches(model, x, n_local, stream, s.steps_per_epoch, s.batch_size, shards, comm)
    seed = s.seed if s.seed is not None else on_root(lambda: secrets.randbits(62), comm=comm)
    _share_cores(comm)
    exchange = _prepare_optimizer(model, s.strategy, comm)
    # Micro-steps summed before one exchange: fit's argument, else what the optimizer was made with.
    accumulate = 1 if exchange is None else int(s.accumulate_steps or exchange.accumulate)
    check_accumulate(accumulate, plan.steps)

    initial_epoch = 0 if s.checkpoint is None or not s.resume else _resume(model, s.checkpoint, comm)
    # Before any step: same starting point everywhere (and a model that differs across ranks fails
    # here, on every rank, with the shapes it found).
    applied = _applied_callbacks(user_callbacks, comm)
    applied[BroadcastInitialState].broadcast(model)
    loop = FitLoop(
        comm=comm, strategy=s.strategy, average_every=s.average_every, validation=validation,
        eval_batch=max(plan.per_rank or -(-(s.batch_size or 0) // comm.Get_size()), 32), epochs=s.epochs,
        metrics=applied[MetricAverage], exchange=exchange,
    )
    stopper.raise_errors = False
    callbacks = _ordered_callbacks(loop, applied, user_callbacks, s.checkpoint, stopper, comm)
    requested = int(getattr(model, "steps_per_execution", 1) or 1)
    per_execution = _execution_steps(requested, plan.steps, s, comm)
    history = loop.history
    history["params"] = {
        "batch_size": s.batch_size, "per_rank_batch": plan.largest_local_batch, "steps_per_epoch": plan.steps,
        "ranks": comm.Get_size(), "strategy": s.strategy, "average_every": s.average_every, "seed": int(seed),
        "shuffle": bool(s.shuffle), "rows_per_rank": None if plan.counts is None else list(plan.counts),
        "initial_epoch": initial_epoch, "epochs": s.epochs, "steps_per_execution": per_execution,
        "input": "arrays" if stream is None else stream.kind, "accumulate_steps": accumulate, "shards": shards,
    }
    if initial_epoch < s.epochs:
        if stream is None:
            assert n_local is not None, "arrays: _check_inputs counts their rows"
            data = _arrays.dataset(x, y, n_local, plan, initial_epoch, s.epochs, seed, comm.Get_rank(), s.shuffle)
        else:
            real = None if plan.batches is None else plan.batches[comm.Get_rank()]
            data = stream.feed(plan.steps, s.epochs - initial_epoch, real, empty)
        with _this_fit(model, exchange, accumulate, per_execution, requested, stopper), \
                weighted_by_rows(model, plan, shards, exchange, applied, loop, comm):
            model.fit(
                data,
                epochs=s.epochs,
                initial_epoch=initial_epoch,
                steps_per_epoch=plan.steps,
                callbacks=callbacks,
                shuffle=False,  # the data is already in the epoch's order
                verbose=(2 if s.verbose == "auto" else s.verbose) if comm.Get_rank() == 0 else 0,
            )
    _raise_if_stopped(stopper, history)
    return history


def _check_inputs(model: Any, x: Any, y: Any, validation_data: tuple[Any, int | None], settings: FitSettings,
                  callbacks: list[Any], stream: Stream | None, comm: Any) -> tuple[int | None, Scored | None]:
    """Every check before training, raised together on every rank; returns this rank's rows
    (``None`` for a pipeline) and its validation rows. Collective."""
    n_local, validation = None, None
    data, steps = validation_data
    with raise_together(comm=comm):
        settings.check(comm.Get_size(), callbacks, stream)
        if stream is None:
            n_local = _arrays.check_xy(x, y, "x", "y")
            _arrays.check_finite_inputs(x, y)
        elif y is not None:
            raise ValueError(f"y must be None when x is a {stream.kind}: it yields (x, y) batches.")
        if data is not None:
            validation = validation_rows(data, steps)
        elif steps is not None:
            raise ValueError("validation_steps needs validation_data.")
        _check_model(model, settings.strategy)
    check_same(
        (*settings.agreed(), None if validation is None else validation.kind, None if stream is None else stream.kind),
        "fit()'s arguments (batch_size, epochs, strategy, average_every, shuffle, seed, checkpoint, resume, "
        "steps_per_epoch, accumulate_steps, shards, kind of validation_data, kind of x)",
        comm=comm,
    )
    return n_local, validation


def _share_cores(comm: Any) -> None:
    if not threads_chosen():
        # Nobody chose a budget: share the node's cores rather than let every rank take them all.
        # (Local after the collectives above set up the channel, so ranks may differ here.)
        with warnings.catch_warnings():
            # TensorFlow's pools are fixed once it runs; limit_threads says so, and that is expected here.
            warnings.simplefilter("ignore", RuntimeWarning)
            limit_threads(comm=comm)


def _prepare_optimizer(model: Any, strategy: str, comm: Any) -> TensorExchange | None:
    """For the gradient strategy: a DistributedOptimizer, and XLA off. Returns the exchange."""
    if strategy == "gradients":
        if not is_distributed(model.optimizer):
            model.optimizer = DistributedOptimizer(model.optimizer, comm=comm)
            _compat.retrace(model)  # the cached step still calls the old optimizer
        if model.jit_compile:
            if comm.Get_rank() == 0:
                warnings.warn(
                    "mpinb.keras.fit turned jit_compile off: XLA cannot compile the MPI Allreduce.",
                    RuntimeWarning,
                    stacklevel=3,
                )
            model.jit_compile = False
            _compat.retrace(model)
    return exchange_of(model.optimizer)


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


def _ordered_callbacks(loop: FitLoop, applied: dict[type, Any], user_callbacks: list[Any], checkpoint: str | None,
                       stopper: StopOnInterrupt, comm: Any) -> list[Any]:
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
    return ordered


def _execution_steps(requested: int, steps: int, s: FitSettings, comm: Any) -> int:
    """Steps per execution for this fit: the compiled value, lowered (with a warning) until it
    divides the epoch and, for the weight strategy, the steps between weight averages."""
    per_execution = _steps_per_execution(requested, execution_boundary(steps, s.strategy, s.average_every))
    if per_execution != requested and comm.Get_rank() == 0:
        weights = s.strategy == "weights"
        what = f"the {steps} steps per epoch" + (f" and average_every={s.average_every}" if weights else "")
        warnings.warn(
            f"steps_per_execution={requested} does not divide {what}; this fit runs {per_execution} "
            "step(s) per execution so that epochs (and weight averages) end on their own last step.",
            RuntimeWarning,
            stacklevel=4,
        )
    return per_execution


@contextmanager
def _this_fit(model: Any, exchange: TensorExchange | None, accumulate: int, per_execution: int, requested: int,
              stopper: StopOnInterrupt) -> Iterator[None]:
    """This fit's steps per execution and accumulation while ``model.fit`` runs, the user's after;
    an exchange that failed inside TensorFlow's step raises its own error, not TensorFlow's wrapper."""
    if per_execution != requested:
        _compat.set_steps_per_execution(model, per_execution)
    accumulated_before = None if exchange is None else exchange.accumulate
    if exchange is not None:
        exchange.take_error()
        if accumulate != exchange.accumulate:
            exchange.accumulate = accumulate
            _compat.retrace(model)
        if accumulate > 1:
            # Built now, outside the traced step: the update runs inside a tf.cond branch, where
            # no variable may be created.
            if not model.optimizer.built:
                model.optimizer.build(model.trainable_variables)
            exchange.sums_for(list(model.trainable_variables))
    try:
        yield
    except Exception as err:
        original = None if exchange is None else exchange.take_error()
        if original is not None:
            # The gradient exchange failed inside TensorFlow's step (a CollectiveTimeout naming
            # the missing rank): raise that, not TensorFlow's wrapper around its message.
            raise original from err
        raise
    finally:
        stopper.release()
        if exchange is not None and accumulated_before is not None and exchange.accumulate != accumulated_before:
            exchange.accumulate = accumulated_before
            _compat.retrace(model)
        if per_execution != requested:
            _compat.set_steps_per_execution(model, requested)


def _raise_if_stopped(stopper: StopOnInterrupt, history: dict[str, Any]) -> None:
    if stopper.stopped is not None:
        try:
            stopper.raise_if_stopped()
        except BaseException as err:
            err.add_note("mpinb: the history up to the stop is in this exception's .history")
            err.history = history  # type: ignore[attr-defined]
            raise


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
