"""A shortened soak (benchmarks/soak.py runs 200 fits): no leaks across repeated fits on one cluster."""

from __future__ import annotations

import importlib.util
from pathlib import Path

# The benchmark's own function, loaded from its file (benchmarks/ is a folder of scripts, not a package).
_spec = importlib.util.spec_from_file_location("soak", Path(__file__).resolve().parents[2] / "benchmarks" / "soak.py")
_soak = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_soak)
soak = _soak.soak


def test_repeated_fits_do_not_leak() -> None:
    result = soak(fits=10, n=2, warmup=4)
    assert result["fd_growth"] == 0, result
    assert result["zombies"] == 0, result
    assert result["max_rss_growth_fraction"] <= 0.10, result
