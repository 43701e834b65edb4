"""Seeded protocol bugs: the model must catch every one, or it is not looking.

Each mutant patches one decision of the real layer (through its module attribute, as the layer calls
it) for the length of a ``with`` block.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from mpinb import _collective
from mpinb._collective import channels as _channels
from mpinb._collective import notices as _notices
from mpinb._collective import ops as _ops
from mpinb._collective import protocol as _p


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


def _never_stale(note: dict, begun: int, rank: int, cell: int, digest: int) -> tuple[bool, bool]:
    return _ORIGINAL["late_arrival"](note, begun, rank, cell, digest)[0], False


def _departure_by_cell_only(record: Any, cell: int, here: tuple[int, int], waited: float, now_ns: int,
                            patience: float = _p.IDLE_AWAY) -> str | None:
    # The rule before the model found its race: any rank running a later cell has left this one.
    if record is not None and cell and record.cell > cell:
        return "left this cell and is running a later one"
    return _ORIGINAL["departure"](record, cell, here, waited, now_ns, patience)


_ORIGINAL: dict[str, Callable[..., Any]] = {
    "arrival_header": _p.arrival_header, "late_arrival": _p.late_arrival, "departure": _p.departure,
    "on_cell": _channels.Channel.on_cell,
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
}
