"""A shortened soak (benchmarks/soak.py runs 200 fits): no leaks across repeated fits on one cluster."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from soak import soak  # noqa: E402


def test_repeated_fits_do_not_leak() -> None:
    result = soak(fits=30, n=2, warmup=10)
    assert result["fd_growth"] == 0, result
    assert result["zombies"] == 0, result
    assert result["max_rss_growth_fraction"] <= 0.10, result
