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
    err = composite([(0, "ValueError", "bad"), (1, "ValueError", "bad"), (2, "KeyError", "'x'"),
                     (3, "ValueError", "bad")])
    lines = err._render_traceback_()
    headers = [line for line in lines if " on rank" in line]
    assert headers == ["ValueError on ranks 0-1, 3 (3 of 4 errors, the same):", "KeyError on rank 2:"]


def test_engines_that_died_are_named_by_rank_with_the_clusters_report_of_the_first():
    """ipyparallel's client makes a dead engine's error itself, with no engine info ("Engine 7 died
    while running task ..."): the engine is read from the text, shown as its rank, and the error of
    ``view.execute`` says which rank died first, as the cluster's ``deaths()`` does."""

    class Cluster:
        asked = 0

        def deaths(self):
            Cluster.asked += 1
            return "rank 1 (engine 7, pid 42) died (SIGKILL); MPI ended the other ranks with it"

    _ipp.group_composite_errors()
    cluster = Cluster()
    _tracebacks.remember_ranks([9, 7], cluster.deaths)  # engine 9 is rank 0, engine 7 rank 1
    elist = [("EngineError", f"Engine {eid} died while running task 'm{eid}'",
              f"EngineError: Engine {eid} died while running task 'm{eid}'", {}) for eid in (9, 7)]
    err = ipp.error.CompositeError("one or more exceptions", elist)
    lines = err._render_traceback_()
    assert lines[0] == "mpinb: rank 1 (engine 7, pid 42) died (SIGKILL); MPI ended the other ranks with it"
    assert "EngineError on ranks 0-1 (2 of 2 errors, the same):" in lines
    assert sorted(err.by_rank) == [0, 1]
    err._render_traceback_()
    assert Cluster.asked == 1  # asked once per error
    del cluster  # a cluster that is gone is not asked, nor kept alive
    again = ipp.error.CompositeError("one or more exceptions", elist)
    assert not any(line.startswith("mpinb:") for line in again._render_traceback_())
