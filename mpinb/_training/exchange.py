"""The gradient exchange: one fused sum over the ranks per step, carrying every rank's stop votes."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from mpinb._training.packing import Packer, sum_over_ranks

__all__ = ["GradientExchange"]


class GradientExchange:
    """The NumPy side of data-parallel training: averages a step's gradients over the ranks.

    Collective in use: every rank calls :meth:`reduce` once per update, with arrays of the same
    shapes and dtypes. A framework's glue hands it the step's gradients as NumPy arrays (from a
    TensorFlow ``numpy_function``, say) and gets their means back, as views of a persistent MPI
    buffer: packing happens once, scaled by ``1/size`` on the way in, and nothing is copied out.

    Besides the gradients, the buffer carries three numbers, this rank's interrupt, stop and
    non-finite-gradient votes, so that a collective stop costs no extra message: after each step
    every rank knows whether any rank asked to stop, or met a NaN or an infinity, and stops at the
    same step (:class:`~mpinb._training.stopping.JointStop` decides).

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
        key = tuple((g.shape, g.dtype.str) for g in grads)
        packer = self._packers.get(key)
        if packer is None:
            packer = self._packers[key] = Packer(grads)
        bufs = packer.fill(grads, 1.0 / self.comm.Get_size(), self.votes)
        try:
            self.wait_seconds += sum_over_ranks(bufs, packer.layout, self.comm, "gradient exchange")
        except BaseException as err:
            # A framework may re-raise errors from inside its step as its own (TensorFlow: an
            # UnknownError); keep the original (a CollectiveTimeout naming the missing rank).
            self.error = err
            raise
        interrupt, stop, nonfinite = bufs[0][-3:]
        self._interrupt |= bool(interrupt > 0)
        self._stop |= bool(stop > 0)
        self._nonfinite |= bool(nonfinite > 0)
        self.seconds += time.perf_counter() - t0
        return packer.unpack(bufs)

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
