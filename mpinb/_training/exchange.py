"""The gradient exchange: one fused sum over the ranks per step, each rank's gradient weighted by its
local batch, every rank's stop votes riding in the arrival."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from mpinb._training.packing import Packer, divide_by_rows, scale_in_place, sum_over_ranks

__all__ = ["GradientExchange"]


class GradientExchange:
    """The NumPy side of data-parallel training: averages a step's gradients over the ranks.

    Collective in use: every rank calls :meth:`reduce` once per update, with arrays of the same
    shapes and dtypes. A framework's glue hands it the step's gradients as NumPy arrays (from a
    TensorFlow ``numpy_function``, say) and gets their means back, as views of a persistent MPI
    buffer: packing happens once, scaled on the way in, and nothing is copied out.

    Each rank's gradient is the mean over its local batch, so the gradient of the global batch is
    ``sum_r (b_r / B) g_r``: with :meth:`weigh_by_rows` (every rank's local batch ``b_r`` at every
    step, from the batch plan) each rank scales by ``b_r / B`` before the sum, which is exact and
    costs no extra message; without it by ``1/size`` (equal local batches). A rank with no rows in
    a step sends zeros. With :meth:`weigh_by_batch` the weights come with the step instead (a
    pipeline's batches are its own): each rank scales by its rows ``b_r`` and adds ``b_r`` to one
    extra slot of the same buffer, and the sum is divided by the slot's total ``B``, which is
    exact too and costs no extra message, only one pass over the summed buffer.

    The operation's arrival carries three votes, this rank's interrupt, stop and non-finite-gradient
    votes (the last found while packing), so that a collective stop costs no extra message: after
    each step every rank knows whether any rank asked to stop, or met a NaN or an infinity, and
    stops at the same step (:class:`~mpinb._training.stopping.JointStop` decides).

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
    accumulate : int, default 1
        Local steps whose gradients are summed before one exchange (the glue does the summing).
    check_finite : bool, default True
        Whether a non-finite gradient votes for a stop; ``False`` under a loss-scale optimizer,
        whose overflowing steps are normal.
    """

    def __init__(self, comm: Any, *, accumulate: int = 1, check_finite: bool = True) -> None:
        self.comm = comm
        self.accumulate = accumulate
        self.check_finite = check_finite
        self.votes = (0.0, 0.0)  # this rank's (interrupt, stop) votes for the next step
        self.seconds = 0.0  # in the exchange, waiting included
        self.wait_seconds = 0.0  # of which waiting for the slowest rank to arrive
        self.error: BaseException | None = None  # what interrupted the last exchange, for fit to raise
        # Sticky until taken: some rank voted in a step reduced since the last take_votes().
        self._interrupt = self._stop = self._nonfinite = False
        self._packers: dict[tuple, Packer] = {}
        self._rows: tuple[np.ndarray, np.ndarray] | None = None  # (this rank's, the global) batch per step
        self.by_batch = False  # each reduce brings this rank's rows (weigh_by_batch)
        self._step = 0  # (micro-)steps taken in this epoch's plan

    def weigh_by_rows(self, local: np.ndarray | None, total: np.ndarray | None) -> None:
        """Weight this rank's gradient at step k by ``local[k] / total[k]`` (its rows over the
        global batch; the plan repeats every epoch), from the next step on; ``None``: equal weights.
        Local: every rank passes its own column of the same plan."""
        self._rows = None if local is None else (np.asarray(local, np.float64), np.asarray(total, np.float64))
        self._step = 0

    def weigh_by_batch(self, on: bool) -> None:
        """Weight this rank's gradient by the rows of its own batch, given to each :meth:`reduce`
        as its last array (for a pipeline, whose batches no plan knows). Local."""
        self.by_batch = bool(on)

    def micro_weight(self) -> np.float32:
        """With gradient accumulation: the weight of this micro-step's (local mean) gradient in the
        update's sum, so that the sum is this rank's part of the mean over all the update's rows.
        Local; called once per micro-step, in order."""
        n = self.accumulate
        if self._rows is None:
            weight = 1.0 / (n * self.comm.Get_size())
        else:
            local, total = self._rows
            k = self._step % len(local)
            first = k - k % n
            weight = local[k] / total[first:first + n].sum()
        self._step += 1
        return np.float32(weight)

    def _scale(self) -> float:
        """This update's factor for this rank's gradient (accumulated sums come weighted)."""
        if self.accumulate > 1:
            return 1.0
        if self._rows is None:
            return 1.0 / self.comm.Get_size()
        local, total = self._rows
        k = self._step % len(local)
        self._step += 1
        return float(local[k] / total[k])

    @property
    def carries_votes(self) -> bool:
        """Whether :meth:`reduce` runs at all: on one rank there is nothing to exchange, so stop
        decisions need their own vote."""
        return self.comm.Get_size() > 1

    def reduce(self, *grads: np.ndarray) -> list[np.ndarray]:
        """The mean over ranks of each array (views of the buffer, valid until TensorFlow drops them).

        Collective; called once per update, on whichever thread the framework runs it.
        """
        t0 = time.perf_counter()
        rows = None
        if self.by_batch:
            # The last array is this rank's rows: of the step's batch (the gradients are its mean),
            # or with accumulation of the update's micro-steps (the sums come weighted by rows).
            *means, last = grads
            rows = float(last)
            slot, scale = self._rows_slot(rows)
            grads = (*means, np.full(1, slot, dtype=means[0].dtype))
        else:
            scale = self._scale()
        key = tuple((g.shape, g.dtype.str) for g in grads)
        packer = self._packers.get(key)
        if packer is None:
            packer = self._packers[key] = Packer(grads)
        bufs, out, finite = packer.fill(grads, scale)
        self._sum_and_vote(bufs, finite, out)
        if rows is not None:
            divide_by_rows(out, bufs)  # by the global batch (or the update's rows); none: all zero already
        self.seconds += time.perf_counter() - t0
        return out

    def reduce_packed(self, packed: np.ndarray) -> np.ndarray:
        """:meth:`reduce` for gradients the framework packed itself, into one flat array whose last
        element is a slot: this rank's rows when weighing by batch, else unused. Returns the mean
        over ranks in the same array, summed in place.

        Collective; called once per update. The caller guarantees the array is its own: a fresh
        buffer nothing else reads (TensorFlow: a concatenation no other op consumes, of which one
        part is read at run time so it can never be folded into a constant; on a GPU, the copy to
        the host made for this call). Scaling, the finiteness check and the sum then all happen in
        that buffer, with no copy.
        """
        t0 = time.perf_counter()
        rows = None
        if self.by_batch:
            rows = float(packed[-1])
            packed[-1], scale = self._rows_slot(rows)
        else:
            packed[-1] = 0.0
            scale = self._scale()
        finite = scale_in_place(packed, scale)
        self._sum_and_vote([packed], finite, [packed])  # its first element is a gradient's
        if rows is not None:
            divide_by_rows([packed[-1:]], [packed])
        self.seconds += time.perf_counter() - t0
        return packed

    def _rows_slot(self, rows: float) -> tuple[float, float]:
        """Weighing by batch: the rows slot's value before scaling, and this rank's scale, so that
        after scaling the slot holds this rank's ``rows`` (of the step's batch, whose mean the
        gradients are; or with accumulation of the update's micro-steps, whose sums come weighted
        by rows)."""
        return (1.0, rows) if self.accumulate == 1 else (rows, 1.0)

    def _sum_and_vote(self, bufs: list[np.ndarray], finite: bool, gradients: list[np.ndarray]) -> None:
        """Sum ``bufs`` over the ranks in place, with this rank's votes (and whether its gradients
        are ``finite``) in the arrival; keep every rank's votes, and under a loss-scale optimizer
        make a non-finite vote visible in the ``gradients`` (their places in ``bufs``)."""
        votes = (*(int(v > 0) for v in self.votes), int(not finite))
        try:
            op = sum_over_ranks(bufs, self.comm, "gradient exchange", votes)
        except BaseException as err:
            # A framework may re-raise errors from inside its step as its own (TensorFlow: an
            # UnknownError); keep the original (a CollectiveTimeout naming the missing rank).
            self.error = err
            raise
        self.wait_seconds += op.waited
        interrupt, stop, nonfinite = op.votes
        self._interrupt |= bool(interrupt)
        self._stop |= bool(stop)
        self._nonfinite |= bool(nonfinite)
        if nonfinite and not self.check_finite:
            # Under a loss-scale optimizer the finite/non-finite branch is taken from the reduced
            # gradients. A non-finite value on any rank already spreads through the sum, but the
            # decision is the reduced vote, not each rank's reading of its own copy of the sum:
            # every rank skips the step and lowers its scale together.
            _poison(gradients)

    def take_votes(self) -> tuple[bool, bool, bool]:
        """Whether any rank voted (interrupt, stop, non-finite) in the steps reduced since the last
        call; the same on every rank. Local: the votes came with the gradients."""
        votes = (self._interrupt, self._stop, self.check_finite and self._nonfinite)
        self._interrupt = self._stop = self._nonfinite = False
        return votes

    def take_error(self) -> BaseException | None:
        """The error that interrupted the last exchange, once."""
        error, self.error = self.error, None
        return error

    def times(self) -> np.ndarray:
        """``(seconds in the exchange, of which waiting)`` so far."""
        return np.array([self.seconds, self.wait_seconds])


def _poison(arrays: list[np.ndarray]) -> None:
    """Make the first non-empty floating array hold a NaN, so any finiteness check on them fails."""
    for a in arrays:
        if a.size and np.issubdtype(a.dtype, np.floating):
            a.reshape(-1)[0] = np.nan
            return
