"""Configuration for tests run as ``mpiexec -n N python -m mpi4py -m pytest tests/mpi``.

Only rank 0 prints progress; failures print on every rank.
"""

from __future__ import annotations

import os
import re

import pytest
from mpi4py import MPI

from support.mpitools import pytest_runtest_logreport, pytest_sessionstart  # noqa: F401 - shared rank-aware reporting

# oneDNN on, explicitly (TensorFlow's default on x86, read once as it is imported): with it, kernels
# fed a batch of no rows abort the process (test_keras_empty_batches.py).
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

COMM = MPI.COMM_WORLD


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "mpi_sizes(*sizes): run only when the world has one of these sizes")


# At 3 ranks (an odd world: uneven trees and shards) only the collective layer's own files run; the
# estimators and Keras prove rank-independence at 1, 2 and 4, and the protocol's orderings at every
# size are the model tier's (tests/model).
ODD_WORLD_FILES = {"test_agreement.py", "test_cells.py", "test_comm.py", "test_deadline.py", "test_feature_names.py",
                   "test_keras_empty_batches.py", "test_keras_raises.py", "test_kmeans_callbacks.py", "test_layer.py",
                   "test_shards.py"}


# At 4 ranks the files whose results could depend on the number of ranks (the estimators, Keras's
# training, the data and the collectives' values) run; the protocol's files ran at 1-3 ranks, and its
# orderings at every size are the model tier's. The rows-weighted Keras cases (uneven and empty
# shards against one process on the union) run at 1 and 2 ranks: their subject is the shard's size.
FOUR_RANK_FILES = {"test_comm.py", "test_data.py", "test_doctests.py", "test_keras.py", "test_kmeans.py",
                   "test_minibatch.py", "test_pca.py", "test_scaler.py", "test_shards.py"}


# Keras tests whose subject does not change with the number of ranks (a deadline, checkpoint files,
# which layer the messages go through, steps per call): at 1-3 ranks only.
_SAME_AT_ANY_SIZE = re.compile(r"stuck|checkpoint_resume|communicate_only|steps_per_execution")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    size = COMM.Get_size()
    files = {3: ODD_WORLD_FILES, 4: FOUR_RANK_FILES}.get(size)
    if files is not None:
        kept = [item for item in items
                if item.path.name in files and not (size == 4 and _SAME_AT_ANY_SIZE.search(item.name))]
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept
    for item in items:
        marker = item.get_closest_marker("mpi_sizes")
        if marker is not None and size not in marker.args:
            item.add_marker(pytest.mark.skip(reason=f"runs at {marker.args} ranks, not {size}"))


@pytest.fixture
def comm() -> MPI.Comm:
    """The world communicator, for tests that pass ``comm=`` explicitly."""
    return COMM


@pytest.fixture(params=["numpy", "graph"])
def packing(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways the Keras gradient exchange packs a step's gradients, here on a CPU: in NumPy (a
    CPU's default) and in the graph, crossing to NumPy as one array (a GPU's default)."""
    from mpinb.keras.optimizer import TensorExchange

    if request.param == "graph" and COMM.Get_size() == 1:
        pytest.skip("one rank exchanges nothing: both packings are the same step")
    monkeypatch.setattr(TensorExchange, "pack_in_graph", request.param == "graph")
    return request.param


@pytest.fixture(params=["self", "world"])
def any_comm(request: pytest.FixtureRequest) -> MPI.Comm:
    """The same test body on COMM_SELF and on COMM_WORLD: the one-rank path must be correct too."""
    return MPI.COMM_SELF if request.param == "self" else COMM
