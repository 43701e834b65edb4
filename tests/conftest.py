"""Shared test configuration: each pytest process reports its counts for ``tests/run.py``."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path

import pytest

_COUNTS: Counter[str] = Counter()


@pytest.fixture(scope="module")
def tf():
    """TensorFlow, imported as mpinb imports it (without its C++ start-up lines), or a skip."""
    from mpinb._quiet_tf import import_tensorflow

    try:
        import_tensorflow()
    except ImportError:
        pass
    return pytest.importorskip("tensorflow")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # Counted here rather than read off the terminal reporter, which secondary MPI ranks switch off.
    if report.when == "call" or (report.when == "setup" and not report.passed):
        if report.passed:
            _COUNTS["passed"] += 1
        elif report.skipped:
            _COUNTS["skipped"] += 1
        else:
            _COUNTS["failed" if report.when == "call" else "error"] += 1
    elif report.when == "teardown" and report.failed:
        _COUNTS["error"] += 1


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    out = os.environ.get("MPINB_TEST_REPORT_DIR")
    if not out:
        return
    name = os.environ.get("MPINB_TEST_TIER", "pytest")
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        world = mpi.COMM_WORLD
        name += f"-n{world.Get_size()}-rank{world.Get_rank()}"
    counts = {key: _COUNTS[key] for key in ("passed", "failed", "error", "skipped")}
    path = Path(out) / f"{name}.json"
    path.write_text(json.dumps({"name": name, "exitstatus": int(exitstatus), **counts}))
