"""For ``mpiexec ... python -m mpi4py -m pytest tests/multihost/ranks`` on the simulated hosts
(started by tests/multihost/test_multihost.py): rank 0 reports progress, every rank its failures."""

from __future__ import annotations

from support.mpitools import pytest_runtest_logreport, pytest_sessionstart  # noqa: F401 - shared rank-aware reporting
