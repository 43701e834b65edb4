"""Errors from many ranks render once per distinct error, named by MPI rank (no cluster needed)."""

from __future__ import annotations

import pytest

ipp = pytest.importorskip("ipyparallel")

from mpinb.client import _ipp, _tracebacks  # noqa: E402


def composite(errors: list[tuple[int, str, str]]):
    elist = [(name, message, f"Traceback\\n  in cell\\n{name}: {message} (engine {eid})",
              {"engine_id": eid, "method": "execute"}) for eid, name, message in errors]
    return ipp.error.CompositeError("one or more exceptions", elist)


def test_sixteen_identical_errors_show_once_with_their_ranks():
    _ipp.group_composite_errors()
    # Engine ids are not ranks: engine 100 + r is rank 15 - r.
    _tracebacks.remember_ranks([115 - r for r in range(16)])
    err = composite([(100 + r, "CollectiveTimeout", "rank 3 did not arrive") for r in range(16)])
    lines = err._render_traceback_()
    assert lines[0] == "CollectiveTimeout on ranks 0-15 (16 of 16 errors, the same):"
    assert sum("Traceback" in line for line in lines) == 1
    assert len(lines) < 12  # one screen, whatever the number of ranks
    assert sorted(err.by_rank) == list(range(16))
    assert "engine 115" in err.by_rank[0].traceback  # rank 0 is engine 115


def test_different_errors_stay_separate():
    _ipp.group_composite_errors()
    _tracebacks.remember_ranks([0, 1, 2, 3])
    err = composite([(0, "ValueError", "bad"), (1, "ValueError", "bad"), (2, "KeyError", "'x'"), (3, "ValueError", "bad")])
    lines = err._render_traceback_()
    headers = [line for line in lines if " on rank" in line]
    assert headers == ["ValueError on ranks 0-1, 3 (3 of 4 errors, the same):", "KeyError on rank 2:"]
