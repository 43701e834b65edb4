"""How fit's steps share uneven shards: the batch plan, the batches of no rows a shorter pipeline
ends its epochs with, and the row weights of gradients, weight averages, logs and statistics.

Collective where it plans (:func:`plan_batches`); local otherwise.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from mpinb._training.plan import BatchPlan, plan_arrays, plan_stream
from mpinb.keras import _arrays
from mpinb.keras._inputs import Stream, stand_in
from mpinb.keras._loop import FitLoop
from mpinb.keras._step import StepRows
from mpinb.keras.callbacks import MetricAverage, SyncNonTrainable
from mpinb.keras.optimizer import TensorExchange

__all__ = ["plan_batches", "weighted_by_rows"]


def plan_batches(model: Any, x: Any, n_local: int | None, stream: Stream | None, requested: int | None,
                 batch_size: int | None, shards: str, comm: Any) -> tuple[BatchPlan, Any]:
    """The steps every rank runs per epoch, and for a pipeline that ends before the epoch does
    the batch of no rows it gives after its end (else ``None``). Collective; builds a model that
    has no weights yet."""
    empty = None
    if stream is None:
        assert n_local is not None and batch_size is not None, "arrays: fit's checks give both"
        rows = n_local
        plan = plan_arrays(rows, batch_size, requested, comm=comm, shards=shards)
        first = lambda: _arrays.take(x, np.arange(min(1, rows)), dense=True)  # noqa: E731
    else:
        plan = plan_stream(stream.batches_per_epoch(), stream.kind, requested, comm=comm, shards=shards)
        mine = plan.steps if plan.batches is None else plan.batches[comm.Get_rank()]
        if mine < plan.steps or (plan.batches is not None and min(plan.batches) == 0):
            empty = stream.empty_batch() if mine > 0 else None
        if plan.batches is not None and min(plan.batches) == 0:
            # A rank whose pipeline yields nothing cannot cut a batch of its own: another's stands in.
            borrowed = stand_in(empty, comm=comm, name="fit's empty batches")
            if borrowed is None:  # the same on every rank: decided from what every rank offered
                raise ValueError(f"no rank's {stream.kind} yields a batch to learn its structure from; "
                                 "give some rank batches.")
            empty = borrowed if empty is None else empty
        stand: Any = empty  # a batch of no rows, whenever this rank's pipeline yields none
        first = stream.first_inputs if mine > 0 else (lambda: stand[0])  # noqa: E731
    if not model.built:
        model(first())
    return plan, empty


@contextmanager
def weighted_by_rows(model: Any, plan: BatchPlan, shards: str, exchange: TensorExchange | None,
                     applied: dict[type, Any], loop: FitLoop, comm: Any) -> Iterator[None]:
    """With proportional shards, while ``model.fit`` runs: gradients weighted by each step's local
    batch (the plan's, for arrays; counted as each step runs, for a pipeline), weight averages by
    the rows each rank took since the last one, epoch logs and BatchNorm statistics by each rank's
    rows, and statistics kept through the steps where this rank has no rows."""
    if shards != "proportional":
        yield
        return
    rank, size = comm.Get_rank(), comm.Get_size()
    metrics, sync = applied[MetricAverage], applied[SyncNonTrainable]
    if plan.sizes is not None:  # in-memory arrays: every step's local batches are known
        sizes = plan.sizes
        rows = [int(sizes[:, r].sum()) for r in range(size)]
        metrics.weights, sync.share = rows, rows[rank] / sum(rows)
        empty_steps = bool(sizes[:, rank].min() == 0)
    else:
        def weigh_epoch(rows: list[int]) -> None:
            metrics.weights = rows
            sync.share = rows[rank] / sum(rows) if sum(rows) else None

        loop.weigh_epoch = weigh_epoch
        empty_steps = plan.batches is not None and plan.batches[rank] < plan.steps
    if exchange is not None:
        if plan.sizes is not None:
            # Also on one rank: accumulated micro-steps count by their rows (the epoch's last is smaller).
            exchange.weigh_by_rows(plan.local_sizes(rank), plan.sizes.sum(axis=1))
        else:
            exchange.weigh_by_batch(True)
    guard = [v for v in model.non_trainable_variables if np.dtype(str(v.dtype)).kind == "f"] if empty_steps else []
    counter = StepRows.enter(model, exchange=exchange, guard=guard, skip_empty=empty_steps)
    loop.rows = counter
    completed = False
    try:
        yield
        completed = True
    finally:
        counter.leave(model, completed=completed)
        metrics.weights = None
        sync.share = None
        loop.rows = loop.weigh_epoch = None
        if exchange is not None:
            exchange.weigh_by_rows(None, None)
            exchange.weigh_by_batch(False)
