"""The agreement decisions' messages, locally."""

from __future__ import annotations

from mpinb.agreement import compose as _compose


def test_compose_names_failing_ranks_identically() -> None:
    assert _compose({1: "empty shard"}, 4) == "empty shard [on rank 1 of 4]"
    assert _compose({0: "bad", 2: "bad"}, 3) == "bad [on ranks 0, 2 of 3]"
    assert _compose({0: "a", 1: "b"}, 2) == "rank 0: a; rank 1: b [on all 2 ranks]"
