"""Batch plans: how many steps every rank runs per epoch, which rows each step takes, and how the
steps group into executions, updates and weight averages.

Every rank must run the same number of steps, or the per-step gradient exchange hangs; the counts
here are agreed collectively (or every rank raises the same error), the rest is local arithmetic.
Two plans for in-memory rows: *proportional* (every row once per epoch, each rank's local batch
proportional to its share of the rows, see :func:`proportional_sizes`) and *equal* (the same
per-rank batch everywhere, the fewest full batches any rank holds, the rest left out). For
pipelines, whose batches are their own, *proportional* runs as many steps as the longest pipeline
yields, a rank that has run out taking steps without rows, and *equal* the fewest any yields.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mpinb import _collective
from mpinb.agreement import check_all

__all__ = [
    "BatchPlan",
    "check_accumulate",
    "epoch_batches",
    "epoch_rows",
    "execution_boundary",
    "plan_arrays",
    "plan_stream",
    "proportional_sizes",
    "steps_per_epoch",
    "steps_per_execution",
]


SHARDS = ("proportional", "equal")


@dataclass(frozen=True)
class BatchPlan:
    """The steps per epoch every rank runs, and for in-memory rows every rank's row count and
    either the per-rank batch (equal shards) or the local batch of every rank at every step,
    ``sizes[step, rank]`` (proportional shards). For a pipeline, whose batches are its own, the
    batches each rank's pipeline gives per epoch, ``batches[rank]`` (the rest of the steps it takes
    without rows)."""

    steps: int
    per_rank: int | None = None
    counts: tuple[int, ...] | None = None
    sizes: np.ndarray | None = None
    batches: tuple[int, ...] | None = None

    def local_sizes(self, rank: int) -> np.ndarray | None:
        """This rank's local batch at each step of an epoch (``None``: the pipeline's own batches)."""
        if self.sizes is not None:
            return self.sizes[:, rank]
        return None if self.per_rank is None else np.full(self.steps, self.per_rank, dtype=np.int64)

    @property
    def largest_local_batch(self) -> int | None:
        """The per-rank batch (equal shards), or the largest local batch of any rank and step."""
        return int(self.sizes.max()) if self.sizes is not None else self.per_rank

    def rows_used(self, rank: int) -> int | None:
        """The rows this rank trains on per epoch (``None`` for a pipeline)."""
        local = self.local_sizes(rank)
        return None if local is None else int(local.sum())


def plan_arrays(n_local: int, batch_size: int, requested: int | None, *, comm: Any,
                shards: str = "equal") -> BatchPlan:
    """The plan for ``n_local`` rows on this rank and a global ``batch_size``. Collective: every
    rank gets the same plan, or every rank raises.

    ``shards="proportional"``: every row once per epoch, in global batches of ``batch_size`` (the
    last one smaller), each split over the ranks in proportion to their rows
    (:func:`proportional_sizes`). ``shards="equal"``: ``batch_size // size`` rows per rank and step
    (a multiple of the number of ranks), the fewest full batches any rank holds."""
    size = comm.Get_size()
    counts = _collective.allgather(n_local, comm=comm, name="fit's row counts")
    if shards == "proportional":
        total = int(sum(counts))
        check_all(total > 0, "no rank holds any training rows; give some rank its shard", comm=comm)
        sizes = proportional_sizes(counts, batch_size)
        steps = _agreed_steps(len(sizes), requested, "global batches", comm)
        return BatchPlan(steps, None, tuple(int(c) for c in counts), sizes[:steps])
    per_rank = batch_size // size
    check_all(
        n_local >= per_rank,
        f"this rank holds {n_local} training rows, fewer than one per-rank batch of {per_rank} "
        f"(batch_size={batch_size} over {size} ranks); give every rank at least {per_rank} rows or lower batch_size",
        comm=comm,
    )
    steps = _agreed_steps(steps_per_epoch(counts, per_rank), requested, "full per-rank batches", comm)
    return BatchPlan(steps, per_rank, tuple(int(c) for c in counts))


def plan_stream(local: int | None, kind: str, requested: int | None, *, comm: Any,
                shards: str = "equal") -> BatchPlan:
    """The plan for a pipeline of ``kind`` yielding ``local`` batches per pass on this rank (``None``:
    unknown or infinite). Collective: every rank runs the same steps, or every rank raises.

    ``shards="proportional"``: as many steps as the longest pipeline yields (or ``requested``, at
    most that), each rank giving its batches then steps without rows; a pipeline of unknown length
    needs ``requested`` and must yield that many. ``shards="equal"``: the fewest batches any rank's
    pipeline yields, or ``requested``, which every rank must yield."""
    if shards == "proportional":
        return _proportional_stream(local, kind, requested, comm)
    if requested is None:
        check_all(local is not None,
                  f"x is a {kind} of unknown or infinite length on this rank; pass steps_per_epoch= "
                  "(the same on every rank)", comm=comm)
        counts = _collective.allgather(local, comm=comm, name="fit's batches per rank")
        check_all(min(counts) > 0, f"some rank's {kind} yields no batch (batches per rank: {counts})", comm=comm)
        return BatchPlan(int(min(counts)))
    check_all(local is None or local >= requested,
              f"this rank's {kind} yields {local} batches per pass, fewer than steps_per_epoch={requested}",
              comm=comm)
    return BatchPlan(requested)


def _proportional_stream(local: int | None, kind: str, requested: int | None, comm: Any) -> BatchPlan:
    if requested is None:
        check_all(local is not None,
                  f"x is a {kind} of unknown or infinite length on this rank; pass steps_per_epoch= "
                  "(the same on every rank), or give it a known length", comm=comm)
    counts = _collective.allgather(local, comm=comm, name="fit's batches per rank")
    known = [int(c) for c in counts if c is not None]
    longest = max(known) if len(known) == len(counts) else None
    if requested is None:
        assert longest is not None  # every rank's length is known (checked above, on every rank)
        check_all(longest > 0, f"no rank's {kind} yields any batch (batches per rank: {counts})", comm=comm)
        steps = longest
    else:
        # Checked against every rank's known length here, so the same verdict everywhere; the
        # verdict rides a collective anyway, to keep the sequence of operations data-independent.
        check_all(longest is None or longest >= requested,
                  f"steps_per_epoch={requested} is more than the {longest} batches the longest {kind} yields "
                  f"per pass (batches per rank: {counts})", comm=comm)
        steps = requested
    return BatchPlan(steps, batches=tuple(steps if c is None else min(int(c), steps) for c in counts))


def proportional_sizes(counts: Sequence[int], batch_size: int) -> np.ndarray:
    """Every rank's local batch at every step of an epoch, ``sizes[step, rank]``, so that each rank
    uses each of its rows once per epoch and every step's global batch is ``batch_size`` (the last
    one the remainder, as Keras's last batch).

    Local, and a pure function of the row counts and the batch size, so identical on every rank.
    The rows of all ranks are merged into one sequence, rank r's i-th row at position
    ``(i + 1/2) / counts[r]`` of the epoch (ties in rank order), and step k takes positions
    ``[k * batch_size, (k + 1) * batch_size)``: each rank's share of every global batch is within
    one row of ``batch_size * counts[r] / total``, and a rank with one row uses it once, mid-epoch.
    """
    rows = np.asarray([int(c) for c in counts], dtype=np.int64)
    total, batch = int(rows.sum()), int(batch_size)
    steps = -(-total // batch)
    owner = np.repeat(np.arange(len(rows)), rows)
    index = np.arange(total) - np.repeat(np.cumsum(rows) - rows, rows)
    # Correctly rounded float64 divisions: the same order on every rank and every host.
    position = (2 * index + 1) / (2.0 * np.maximum(rows, 1)[owner])
    merged = owner[np.lexsort((owner, position))]
    sizes = np.zeros((steps, len(rows)), dtype=np.int64)
    np.add.at(sizes, (np.arange(total) // batch, merged), 1)
    return sizes


def steps_per_epoch(counts: Sequence[int], per_rank_batch: int) -> int:
    """Steps every rank can run in one epoch: the fewest full per-rank batches on any rank.

    Local (given every rank's row count). Each rank drops the rows beyond ``steps * per_rank_batch``;
    with shuffling a different subset is dropped each epoch. Running the same number of steps on
    every rank is what keeps the per-step gradient Allreduce from hanging.
    """
    return int(min(int(c) // int(per_rank_batch) for c in counts))


def epoch_batches(
    n_local: int, *, per_rank_batch: int, steps: int, epoch: int, seed: int, rank: int, shuffle: bool
) -> np.ndarray:
    """Row indices of this rank's equal batches for one epoch, shape ``(steps, per_rank_batch)``.
    Local; see :func:`epoch_rows`."""
    used = steps * per_rank_batch
    order = epoch_rows(n_local, used, epoch=epoch, seed=seed, rank=rank, shuffle=shuffle)
    return order.reshape(steps, per_rank_batch)


def epoch_rows(n_local: int, used: int, *, epoch: int, seed: int, rank: int, shuffle: bool) -> np.ndarray:
    """The ``used`` row indices this rank trains on in one epoch, in order (batch k is the next
    local batch of them).

    Local. The permutation depends on ``(seed, epoch, rank)`` only, so it is reproducible, differs
    between epochs and ranks, and needs no communication (the seed itself is shared).
    """
    if shuffle:
        order = np.random.default_rng([int(seed), int(epoch), int(rank)]).permutation(n_local)[:used]
    else:
        order = np.arange(used)
    return order.astype(np.int64)


def check_accumulate(accumulate: int, steps: int) -> None:
    """Local: gradient accumulation must end every epoch on an update."""
    if steps % accumulate:
        raise ValueError(
            f"accumulate_steps={accumulate} must divide the {steps} steps per epoch, so that every epoch ends "
            "on an update; change batch_size, steps_per_epoch or accumulate_steps."
        )


def execution_boundary(steps: int, strategy: str, average_every: int) -> int:
    """The steps an execution must divide: the epoch's, and for the weight strategy also the steps
    between two weight averages (which happen between executions). Local."""
    return math.gcd(steps, average_every) if strategy == "weights" else steps


def steps_per_execution(requested: int, steps: int) -> int:
    """The largest number of steps per execution, at most ``requested``, that divides ``steps``
    (steps per epoch, or the steps between two weight averages). Local.

    A framework that runs whole executions (Keras's ``steps_per_execution``) would otherwise let the
    last execution of an epoch take batches from the next epoch (and the last epoch come up short),
    so epoch-end callbacks would see the wrong steps.
    """
    return max(d for d in range(1, max(1, min(requested, steps)) + 1) if steps % d == 0)


def _agreed_steps(available: int, requested: int | None, what: str, comm: Any) -> int:
    """``steps_per_epoch`` when given (at most what every rank has), else what every rank has."""
    if requested is None:
        return available
    check_all(available >= requested,
              f"steps_per_epoch={requested} is more than the {available} {what} every rank has", comm=comm)
    return requested
