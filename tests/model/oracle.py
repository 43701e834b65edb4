"""The protocol model's oracle: mpinb's collective guarantees as predicates over how every rank's
calls ended. Test code: the layer decides nothing from it (moved from
``mpinb/_collective/protocol.py``, where it was the one part no rank runs)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

__all__ = ["CallOutcome", "GiveUp", "invariant_violations"]


class CallOutcome(NamedTuple):
    """How one rank's call of the protocol model ended: ``cell``, the call's ``label``, whether it
    returned (``returned``) and whether its value is the one the same call of every rank gives."""

    rank: int
    cell: int
    label: str
    returned: bool
    right: bool
    began: float = 0.0  # when the call was made and when it ended, in seconds
    ended: float = 0.0


class GiveUp(NamedTuple):
    """A rank that gave up its call ``label`` of ``cell`` (a deadline, an interrupt, an exception
    inside it) at time ``at``."""

    rank: int
    cell: int
    label: str
    at: float


def invariant_violations(calls: Sequence[CallOutcome], cell_errors: dict[tuple[int, int], bool],
                         released: dict[int, float | None], bound: float,
                         gave_up: Sequence[GiveUp] = (), away: float = float("inf")) -> list[str]:
    """The guarantees, as predicates over every rank's outcomes; the violated ones, described.

    - *no wrong value without an error*: a call that returned a value other than the one the same
      call of every rank gives is only allowed where that rank's cell ends with an error
      (``cell_errors[rank, cell]``);
    - *agreement*: a call that another rank gave up while it was in progress (and no rank had yet
      completed) does not return a value the others did not get, when it ran on ``away`` seconds or
      more after the give-up (a rank that was stopped, or long in a C call, wakes to raise with the
      others; a quick one may have finished before it could know);
    - *released in time*: a rank whose wait was decided (another rank raised, left or exited) is
      released within ``bound`` seconds of the deciding event (``released[rank]``: the delay, ``None``
      if it never was).
    """
    found = []
    # A give-up after some rank had already returned from the call cannot be agreed on (that rank
    # has its value): it binds only the calls of a collective nobody had completed.
    binding = [g for g in gave_up
               if not any(c.returned and (c.cell, c.label) == (g.cell, g.label) and c.ended <= g.at for c in calls)]
    for c in calls:
        if c.returned and not c.right and not cell_errors.get((c.rank, c.cell), False):
            found.append(f"rank {c.rank} returned a wrong value from {c.label} in cell {c.cell} without an error")
        if not c.returned:
            continue
        for g in binding:
            if (g.rank != c.rank and (g.cell, g.label) == (c.cell, c.label) and c.began < g.at
                    and c.ended - g.at >= away):
                found.append(f"rank {c.rank} returned from {c.label} in cell {c.cell} {c.ended - g.at:.2f} s after "
                             f"rank {g.rank} gave it up, instead of raising with it")
                break
    for rank, delay in sorted(released.items()):
        if delay is None:
            found.append(f"rank {rank} was never released from a wait that another rank had decided")
        elif delay > bound:
            found.append(f"rank {rank} was released {delay:.2f} s after the deciding event (bound {bound:g} s)")
    return found
