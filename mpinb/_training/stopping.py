"""Joint stop decisions: Ctrl-C, a non-finite loss or a local stop request stops every rank at the
same step, with the same reason and the same error."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mpinb import _collective
from mpinb.interrupt import StopFlag

__all__ = ["JointStop"]


class JointStop:
    """One training run's stop decision, taken from votes every rank reduces alike.

    Collective where it votes (:meth:`vote`); local otherwise. Each rank votes (interrupt, stop,
    non-finite); a vote on any rank stops every rank at the step where the votes were reduced,
    either with the gradients (a :class:`~mpinb._training.exchange.GradientExchange` carries them)
    or in :meth:`vote`'s arrival (no message of its own). A local stop request (another callback setting the
    framework's stop flag on one rank) is held back, not acted on, and voted in the next reduction.

    ``stopped`` is ``(reason, epoch, step)`` once decided, with reason ``"interrupt"``,
    ``"nonfinite"`` or ``"callback"`` and ``step`` -1 at an epoch end; identical on every rank.
    """

    def __init__(self, flag: StopFlag, comm: Any) -> None:
        self.flag = flag
        self.comm = comm
        self.stopped: tuple[str, int, int] | None = None
        self._pending = 0.0  # this rank's held-back stop request, 1.0 once made
        self._entered = False

    def begin(self) -> None:
        """A new run: nothing decided, nothing pending, SIGINT turned into the flag from now on."""
        self.stopped = None
        self._pending = 0.0
        if not self._entered:
            self.flag.__enter__()
            self._entered = True

    def release(self) -> None:
        """Give SIGINT back to its previous handler (idempotent)."""
        if self._entered:
            self.flag.__exit__(None, None, None)
            self._entered = False

    def hold(self) -> None:
        """This rank alone asked to stop: vote for it in the next reduction."""
        self._pending = 1.0

    @property
    def votes(self) -> tuple[float, float]:
        """This rank's (interrupt, stop) votes, to ride with the next step's gradients."""
        return (self.flag.value, self._pending)

    def vote(self, loss: Any, stop: bool = False) -> tuple[bool, bool, bool]:
        """Collective: whether any rank votes (interrupt, stop, non-finite ``loss``): the three
        votes ride in one operation's arrival. ``stop`` adds a stop request made just now."""
        bad = loss is not None and not math.isfinite(float(np.asarray(loss)))
        local = (int(self.flag.requested), int(self._pending > 0 or stop), int(bad))
        votes = _collective.vote(local, comm=self.comm, name="the training's stop vote")
        interrupt, stopping, nonfinite = (v > 0 for v in votes)
        return interrupt, stopping, nonfinite

    def decide(self, interrupt: bool, nonfinite: bool, stop: bool, epoch: int, step: int | None) -> bool:
        """Record the first reduced reason to stop; returns whether training must stop now."""
        if self.stopped is None and (interrupt or nonfinite or stop):
            reason = "interrupt" if interrupt else "nonfinite" if nonfinite else "callback"
            self.stopped = (reason, epoch, -1 if step is None else step)
            self._pending = 0.0
        return self.stopped is not None

    def raise_if_stopped(self) -> None:
        """Raise the error that matches ``stopped`` (the same on every rank); nothing otherwise."""
        if self.stopped is None:
            return
        reason, epoch, step = self.stopped
        where = f"epoch {epoch + 1}" + (f", step {step + 1}" if step >= 0 else " end")
        if reason == "interrupt":
            self.flag.raise_interrupt(f"training stopped at {where}")
        if reason == "nonfinite":
            raise FloatingPointError(
                f"The loss or the averaged gradients became NaN or infinite at {where}; training "
                "stopped on every rank. Lower the learning rate, clip gradients, or check the data."
            )
