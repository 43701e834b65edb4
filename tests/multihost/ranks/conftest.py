"""For ``mpiexec ... python -m mpi4py -m pytest tests/multihost/ranks`` on the simulated hosts
(started by tests/multihost/test_multihost.py): rank 0 reports progress, every rank its failures."""

from __future__ import annotations

import sys

import pytest
from mpi4py import MPI

COMM = MPI.COMM_WORLD


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    if COMM.Get_rank() > 0:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            session.config.pluginmanager.unregister(reporter)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if COMM.Get_rank() > 0 and report.failed:
        sys.stderr.write(f"\n[rank {COMM.Get_rank()}/{COMM.Get_size()}] FAILED {report.nodeid} ({report.when})\n")
        sys.stderr.write(f"{report.longreprtext}\n")
        sys.stderr.flush()
