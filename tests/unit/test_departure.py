"""When a rank that sits idle in an earlier cell counts as not running the cell the others wait in."""

from __future__ import annotations

from mpinb._collective import protocol as _p
from mpinb._collective.board import CellRecord

NOW = 1_000 * 10**9


def idle_since(seconds: float) -> CellRecord:
    """A rank that ended cell 1 ``seconds`` ago and has not begun cell 2."""
    return CellRecord(1, False, 1, 1, 4, NOW - int(seconds * 1e9), "")


def test_an_idle_rank_the_cell_was_not_stamped_for_is_named_after_a_few_seconds() -> None:
    patience = _p.idle_patience(None, 0)
    assert patience == _p.IDLE_AWAY
    assert _p.departure(idle_since(1), 2, (1, 5), 1.0, NOW, patience) is None
    why = _p.departure(idle_since(7), 2, (1, 5), _p.IDLE_AWAY + 0.5, NOW, patience)
    assert why == "is not running this cell (idle for 7 s)"


def test_a_rank_the_cell_was_sent_to_is_waited_for_while_it_arrives() -> None:
    # CI: on a loaded host the cell reached rank 0 seconds after rank 2, which named rank 0 as
    # idle and abandoned a collective every rank was about to enter.
    patience = _p.idle_patience((0, 1, 2), 0)
    assert patience == _p.SENT_AWAY > 10 * _p.IDLE_AWAY
    assert _p.departure(idle_since(7), 2, (1, 5), 5.0, NOW, patience) is None
    # A cell dropped on its way (client.abort()) is still named, later.
    late = _p.SENT_AWAY + 1
    assert _p.departure(idle_since(late), 2, (1, 5), late, NOW, patience) is not None


def test_a_rank_outside_the_stamped_targets_gets_the_short_patience() -> None:
    assert _p.idle_patience((1, 2), 0) == _p.IDLE_AWAY
