"""shard_bounds: balanced, contiguous, checked."""

from __future__ import annotations

import pytest

import mpinb


@pytest.mark.parametrize("n", [0, 1, 3, 10, 11, 1000])
@pytest.mark.parametrize("size", [1, 2, 3, 4, 7])
def test_shard_bounds_partition_balanced_contiguous(n: int, size: int) -> None:
    bounds = [mpinb.shard_bounds(n, rank=r, size=size) for r in range(size)]
    assert bounds[0][0] == 0 and bounds[-1][1] == n
    for (_, stop), (start, _) in zip(bounds, bounds[1:], strict=False):
        assert stop == start
    lengths = [hi - lo for lo, hi in bounds]
    assert max(lengths) - min(lengths) <= 1
    assert lengths == sorted(lengths, reverse=True)  # the extra rows go to the first ranks


def test_shard_bounds_example_from_docstring() -> None:
    assert [mpinb.shard_bounds(10, rank=r, size=4) for r in range(4)] == [(0, 3), (3, 6), (6, 8), (8, 10)]


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"n": -1, "rank": 0, "size": 1}, ValueError, "n must be >= 0"),
        ({"n": 5, "rank": 2, "size": 2}, ValueError, "rank must satisfy"),
        ({"n": 5, "rank": 0, "size": 0}, ValueError, "size must be >= 1"),
        ({"n": 5.0, "rank": 0, "size": 1}, TypeError, "n must be an integer"),
    ],
)
def test_shard_bounds_rejects_bad_arguments(kwargs: dict, exc: type, match: str) -> None:
    n = kwargs.pop("n")
    with pytest.raises(exc, match=match):
        mpinb.shard_bounds(n, **kwargs)
