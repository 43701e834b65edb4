"""Shared test configuration: each pytest process reports its counts for ``tests/run.py``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # for ``import mpitools``


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    out = os.environ.get("MPINB_TEST_REPORT_DIR")
    if not out:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    stats = reporter.stats if reporter else {}
    counts = {key: len(stats.get(key, [])) for key in ("passed", "failed", "error", "skipped")}
    name = os.environ.get("MPINB_TEST_TIER", "pytest")
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        world = mpi.COMM_WORLD
        name += f"-n{world.Get_size()}-rank{world.Get_rank()}"
    path = Path(out) / f"{name}.json"
    path.write_text(json.dumps({"name": name, "exitstatus": int(exitstatus), **counts}))
