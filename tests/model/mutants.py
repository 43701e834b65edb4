"""Seeded protocol bugs: the model must catch every one, or it is not looking.

Each mutant patches one decision of the real layer (a function of :mod:`~mpinb._collective.protocol`,
:mod:`~mpinb._collective.notices` or :mod:`~mpinb._collective.texts`, or a method) for the length of
a ``with`` block, through its module or class attribute: the layer calls its decisions through their
modules (``_p.revocation_reaches``, never a name imported into the caller), so one patch reaches
every caller. What the layer takes from its process (MPI, clocks, signals) is not patched: the
simulator gives each rank its own :class:`~mpinb._collective.runtime.Runtime`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from mpinb import _collective
from mpinb._collective import channels as _channels
from mpinb._collective import notices as _notices
from mpinb._collective import ops as _ops
from mpinb._collective import protocol as _p
from mpinb._collective import texts as _texts
from mpinb._collective import wait as _wait
from mpinb.errors import CollectiveAbandoned


@contextlib.contextmanager
def _patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    saved = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, saved)


def _no_sequence(digest: int, cell: int, index: int, votes: Any) -> np.ndarray:
    header = _ORIGINAL["arrival_header"](digest, cell, index, votes)
    header[_p.INDEX] = header[_p.INDEX + 1] = 0
    return header


def _no_cell(digest: int, cell: int, index: int, votes: Any) -> np.ndarray:
    header = _ORIGINAL["arrival_header"](digest, cell, index, votes)
    header[_p.CELL] = header[_p.CELL + 1] = 0
    return header


def _no_abandoned_vote() -> np.ndarray:
    return np.full(_p.WORDS, np.iinfo(np.int64).max, dtype=np.int64)


def _forward_nothing(ctrl: Any, tag: int, wire: Any, rank: int, hosts: list[str]) -> tuple[list[Any], Any]:
    return [], wire[2]


def _cell_end_untold(self: Any, event: str, cell: Any, error: Any) -> None:
    # The board still shows the cell's end to the ranks of this host; the note to other hosts is lost.
    saved = self.hosts
    self.hosts = [self.host] * self.size
    try:
        _ORIGINAL["on_cell"](self, event, cell, error)
    finally:
        self.hosts = saved


def _never_stale(note: dict, begun: int, rank: int, cell: int, digest: int, *more: Any) -> tuple[bool, bool]:
    return _ORIGINAL["late_arrival"](note, begun, rank, cell, digest, *more)[0], False


def _departure_by_cell_only(record: Any, cell: int, here: tuple[int, int], waited: float, now_ns: int,
                            patience: float = _p.IDLE_AWAY) -> str | None:
    # The rule before the model found its race: any rank running a later cell has left this one.
    if record is not None and cell and record.cell > cell:
        return "left this cell and is running a later one"
    return _ORIGINAL["departure"](record, cell, here, waited, now_ns, patience)


def _switch_without_deadline(chan: Any, requests: list[Any], deadline: float | None, *, spin: float | None = None,
                             op: Any = None) -> None:
    # The channel's one wait given an operation is the move to a fresh communicator (``_current``).
    _wait.poll(chan, requests, None if op is not None else deadline, spin=spin, op=op)


def _reaches_one_late(note: dict[str, Any] | None, rank: int, index: int) -> bool:
    return note is not None and note["rank"] != rank and index > note["index"]


def _reaching_one_late() -> contextlib.AbstractContextManager:
    # The waits and the operation's own look read it through the protocol module.
    return _patched(_p, "revocation_reaches", _reaches_one_late)


def _old_end_cell_check(self: Any, cell: Any) -> None:
    # Before the model saw it: the revoked generation read one too early (it is still the active one
    # where the rank was told while waiting), so every rank raised a false mismatch.
    ledger = self.ledger
    if self.size == 1 or not self.ready or self.closed or not cell.id or not ledger.needs_check(cell.id):
        return
    layout = _channels._CellRecord(ledger.layout(), ledger.describe())
    try:
        with self.begin(_p.CELL_END, layout, what="the collectives of this cell"):
            pass
    except CollectiveAbandoned as err:
        record = None if err.by is None else self.cell_record(err.by)
        gen = self.gens[self.active - 1] if self.active else None
        if (record is not None and gen is not None and gen.revoked is not None
                and record.ended_cell == cell.id and record.ended_gen == gen.number
                and record.ended_index == gen.revoked["index"] - 1):
            return
        raise _texts.cell_divergence_error(self.rank, err.by, record, ledger) from None


def _whereabouts_blind_to_stops(chan: Any, gen: Any, index: int, cell: int, ask: bool = True) -> Any:
    board = chan.board
    if board is None:
        return _ORIGINAL["whereabouts"](chan, gen, index, cell, ask)
    board.stopped = lambda rank: False  # as before: only the data phase looked
    try:
        return _ORIGINAL["whereabouts"](chan, gen, index, cell, ask)
    finally:
        del board.stopped


def _channel_on_the_process_clock(self: Any, *args: Any, **kwargs: Any) -> None:
    # The seam bypassed: what a wait or an operation that read ``time.monotonic`` itself would do.
    _ORIGINAL["channel"](self, *args, **kwargs)
    self.monotonic = time.monotonic


_ORIGINAL: dict[str, Callable[..., Any]] = {
    "arrival_header": _p.arrival_header, "late_arrival": _p.late_arrival, "departure": _p.departure,
    "on_cell": _channels.Channel.on_cell, "whereabouts": _texts.whereabouts, "channel": _channels.Channel.__init__,
}

#: name -> a function returning the context manager that seeds the bug.
MUTANTS: dict[str, Callable[[], contextlib.AbstractContextManager]] = {
    "the arrival without its cell": lambda: _patched(_p, "arrival_header", _no_cell),
    "the abandoned arrival without its abandoned vote": lambda: _patched(_p, "abandoned_header", _no_abandoned_vote),
    "a revocation not passed on down the tree": lambda: _patched(_notices, "forward", _forward_nothing),
    "a cell end not told to another host": lambda: _patched(_channels.Channel, "on_cell", _cell_end_untold),
    "the skipped-collective check turned off":
        lambda: _patched(_collective, "cell_end_check", lambda value=None, **_: value),
    "a late call of an abandoned collective not raising": lambda: _patched(_p, "late_arrival", _never_stale),
    "a rank in a later cell taken for one that left": lambda: _patched(_p, "departure", _departure_by_cell_only),
    "no rank ever taken for one that left": lambda: _patched(_p, "departure", lambda *a: None),
    "a rank that ran long not looking whether the others gave up": lambda: _patched(
        _ops.Op, "_given_up_meanwhile", lambda self: None),
    "the move to a fresh communicator ignoring the deadline": lambda: _patched(
        _channels, "poll", _switch_without_deadline),
    "a revocation reaching one place too few (> for >=)": _reaching_one_late,
    "a false mismatch when a rank raised after the cell's last collective": lambda: _patched(
        _channels.Channel, "end_cell_check", _old_end_cell_check),
    "a stopped rank unnamed in a timeout while ranks arrive": lambda: _patched(
        _texts, "whereabouts", _whereabouts_blind_to_stops),
    "the waits timed by the process's clock, not the runtime's": lambda: _patched(
        _channels.Channel, "__init__", _channel_on_the_process_clock),
    "a Ctrl-C held back by a stop flag never ending the wait": lambda: _patched(
        _wait, "INTERRUPT_GRACE", float("inf")),
    "a rank that raised between two operations in a script telling no one": lambda: _patched(
        _channels.Channel, "raised_between", lambda self, error, where: None),
}
