"""The protocol's data: the arrival's fields where their names say, phases and outcomes apart."""

from __future__ import annotations

import numpy as np

from mpinb._collective import protocol as _p


def test_the_arrival_is_written_and_read_by_its_named_fields() -> None:
    header = _p.arrival_header(11, 3, 7, (1, 0, 5))
    assert header.shape == (_p.WORDS,) and header.dtype == np.int64
    for at, value in ((_p.DIGEST, 11), (_p.CELL, 3), (_p.INDEX, 7)):
        assert (header[at], header[at + 1]) == (value, -value)
    assert header[_p.VOTE:].tolist() == [-1, 0, -5]
    # Two ranks' arrivals reduced with MIN: what differs is named, the votes arrive as their maxima.
    other = _p.arrival_header(11, 3, 9, (0, 2, 0))
    reduced = np.minimum(header, other).tolist()
    assert _p.decide_arrival(reduced, 3) == _p.Arrival("sequence", (1, 2, 5), 7, 9)
    assert _p.decide_arrival(np.minimum(header, _p.arrival_header(11, 4, 7, (0, 0, 0))).tolist(), 3).verdict \
        == "earlier cell"
    assert _p.decide_arrival(np.minimum(header, _p.arrival_header(12, 3, 7, (0, 0, 0))).tolist(), 3).verdict \
        == "mismatch"
    assert _p.decide_arrival(np.minimum(header, _p.abandoned_header()).tolist(), 3).verdict == "abandoned"
    assert _p.decide_arrival(header.tolist(), 3) == _p.Arrival("go", (1, 0, 5))


def test_phases_and_outcomes_never_compare_equal() -> None:
    assert all(p != o for p in _p.Phase for o in _p.Outcome)
    assert len({**_p.PHASES, **_p.OUTCOMES}) == len(_p.Phase) + len(_p.Outcome)
    assert sorted(p.code for p in _p.Phase) == [0, 1, 2, 3] and 0 not in {o.code for o in _p.Outcome}


def test_each_phase_knows_its_rules_as_the_table_does() -> None:
    assert {(p, e): r for p in _p.Phase for e, r in p.rules.items()} == _p.TABLE
    assert _p.step(_p.IDLE, "enter").to is _p.ARRIVING
