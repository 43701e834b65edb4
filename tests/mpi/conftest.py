"""Configuration for tests run as ``mpiexec -n N python -m mpi4py -m pytest tests/mpi``.

Only rank 0 prints progress; failures print on every rank.
"""

from __future__ import annotations

import pytest
from mpi4py import MPI
from support.mpitools import pytest_runtest_logreport, pytest_sessionstart  # noqa: F401 - shared rank-aware reporting

COMM = MPI.COMM_WORLD


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
