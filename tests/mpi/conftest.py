"""Configuration for tests run as ``mpiexec -n N python -m mpi4py -m pytest tests/mpi``.

Only rank 0 prints progress; failures print on every rank.
"""

from __future__ import annotations

import gc
import itertools

import pytest
from mpi4py import MPI
from support.mpitools import pytest_runtest_logreport, pytest_sessionstart  # noqa: F401 - shared rank-aware reporting

COMM = MPI.COMM_WORLD

# Python's automatic collections, off in this tier: a full collection that starts inside one rank's
# training step (some 600,000 objects once a few dozen Keras models exist) took that rank 20-60 s
# in 4-rank runs on 2 cores (0.7 s for the same collection on another rank), and every other rank
# waited; tests/mpi/test_keras.py at 4 ranks took 222 s with them and 143 s without. Every rank
# collects instead, at the same point, after every few tests: none waits for another's collection.
gc.disable()
_COLLECT_EVERY = 8
_tests_run = itertools.count(1)


@pytest.fixture(autouse=True)
def _collect_together():
    yield
    if next(_tests_run) % _COLLECT_EVERY == 0:
        gc.collect()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "mpi_sizes(*sizes): run only when the world has one of these sizes")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    size = COMM.Get_size()
    for item in items:
        marker = item.get_closest_marker("mpi_sizes")
        if marker is not None and size not in marker.args:
            item.add_marker(pytest.mark.skip(reason=f"runs at {marker.args} ranks, not {size}"))


@pytest.fixture
def comm() -> MPI.Comm:
    """The world communicator, for tests that pass ``comm=`` explicitly."""
    return COMM


@pytest.fixture(params=["self", "world"])
def any_comm(request: pytest.FixtureRequest) -> MPI.Comm:
    """The same test body on COMM_SELF and on COMM_WORLD: the one-rank path must be correct too."""
    return MPI.COMM_SELF if request.param == "self" else COMM
