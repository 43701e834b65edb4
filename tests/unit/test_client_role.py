"""A collective typed in the notebook's own kernel, while an MPICluster runs, raises before MPI is
imported; estimators fitted there on gathered rows still work (mpinb._roles' rule, both sides).

"A running cluster" is a stand-in here (an object with a connected ``client``, noted as
``MPICluster._identify`` notes itself); tests/cluster/test_client_calls.py does it with a real one.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator

import numpy as np
import pytest

import mpinb
from mpinb import _roles

HINT = (r"is a collective of the MPI ranks, and this process is not one of them: it is the client of a running "
        r"MPICluster, whose ranks are its 2 engines\. Run it in a %%px cell")


class StandIn:
    """What the rule reads of an MPICluster: ``n`` and whether its ``client`` is connected."""

    n = 2

    def __init__(self) -> None:
        self.client: object | None = object()


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[StandIn]:
    for name in ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    standin = StandIn()
    _roles.note_cluster(standin)
    yield standin
    _roles._clusters.discard(standin)


# A fresh interpreter: whether mpi4py.MPI was imported is the point, and a real IPython shell runs the cells.
SHELL = textwrap.dedent("""
    import sys
    from IPython.core.interactiveshell import InteractiveShell
    from mpinb import _roles

    class StandIn:
        n = 2
        client = object()

    cluster = StandIn()
    _roles.note_cluster(cluster)
    shell = InteractiveShell.instance()
    for cell in ("import mpinb, numpy as np\\nmpinb.allreduce([np.ones(3)])", "mpinb.world()",
                 "mpinb.gather_rows(np.ones((2, 3)))"):
        error = shell.run_cell(cell, silent=True).error_in_exec
        print("ERROR", type(error).__name__, error)
    print("MPI", "mpi4py.MPI" in sys.modules)
    fit = shell.run_cell("km = mpinb.KMeans(2, random_state=0).fit(np.arange(20.0).reshape(10, 2))", silent=True)
    print("FIT", fit.error_in_exec, shell.user_ns["km"].cluster_centers_.shape)
""")


def test_a_collective_in_the_client_shell_raises_before_mpi_is_imported() -> None:
    out = subprocess.run([sys.executable, "-c", SHELL], capture_output=True, text=True, timeout=120, check=True).stdout
    lines = out.splitlines()
    errors = [line for line in lines if line.startswith("ERROR ")]
    assert len(errors) == 3, out
    for call, line in zip(("mpinb.allreduce()", "mpinb.world()", "mpinb.gather_rows()"), errors, strict=True):
        assert line.startswith(f"ERROR RuntimeError {call} is a collective of the MPI ranks"), line
        assert "Run it in a %%px cell" in line and "comm=MPI.COMM_SELF" in line
    assert "MPI False" in lines, out  # refused before mpi4py.MPI was imported
    assert "FIT None (2, 2)" in lines, out  # an estimator on rows in the client: fitted on this process alone


def test_every_collective_on_the_default_communicator_is_refused(cluster: StandIn) -> None:
    with pytest.raises(RuntimeError, match=r"mpinb\.allreduce\(\) " + HINT):
        mpinb.allreduce([np.ones(3)])
    for call in (lambda: mpinb.bcast(1), lambda: mpinb.check_all(True, "fine"), lambda: mpinb.rprint("hi"),
                 lambda: mpinb.on_root(len, []), lambda: mpinb.limit_threads()):
        with pytest.raises(RuntimeError, match=HINT):
            call()


def test_estimators_and_explicit_communicators_run_on_the_client_alone(cluster: StandIn) -> None:
    from mpi4py import MPI

    X = np.random.default_rng(0).normal(size=(60, 3))
    assert mpinb.KMeans(3, random_state=0).fit(X).cluster_centers_.shape == (3, 3)
    assert mpinb.MiniBatchKMeans(3, random_state=0, batch_size=20).fit(X).cluster_centers_.shape == (3, 3)
    assert mpinb.StandardScaler().fit(X).transform(X).shape == (60, 3)
    assert mpinb.PCA(2).fit(X).transform(X).shape == (60, 2)
    np.testing.assert_array_equal(mpinb.allreduce([np.ones(3)], comm=MPI.COMM_SELF)[0], np.ones(3))


def test_the_rule_passes_where_this_process_is_a_rank_or_the_cluster_stopped(
    cluster: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PMI_RANK", "0")  # started by mpiexec: a rank, whatever it holds
    assert mpinb.world().size == 1
    monkeypatch.delenv("PMI_RANK")
    from mpinb._collective import cells

    monkeypatch.setattr(cells, "engine_id", lambda: 3)  # an ipyparallel engine
    assert mpinb.world().size == 1
    monkeypatch.undo()
    cluster.client = None  # stopped: the kernel may use its world of one again
    assert mpinb.world().size == 1


def test_without_a_cluster_nothing_changes() -> None:
    assert _roles.running_cluster() is None
    np.testing.assert_array_equal(mpinb.allreduce([np.ones(3)])[0], np.ones(3))
