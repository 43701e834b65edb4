"""Which side of a notebook this process is on: one of the MPI ranks, or the client of a running
:class:`~mpinb.MPICluster`, where a collective on the default communicator is a mistake.

In the notebook's own kernel, outside ``%%px``, MPI's world is the kernel alone: a collective
typed there would initialise MPI in the kernel and return the kernel's own value as if it were the
ranks' result (``mpinb.allreduce([np.ones(3)])`` gives ``[1, 1, 1]``, ``mpinb.world().size`` 1).
The rule, checked by :func:`refuse_client` before anything imports ``mpi4py.MPI``:

    A collective on the default communicator (``comm=None``) raises ``RuntimeError`` in a process
    that holds a running ``MPICluster`` (started or connected, not yet stopped), unless that
    process is an MPI rank itself: an ipyparallel engine, a process a launcher started (``mpiexec``,
    ``srun``: their variables are in its environment), or one whose MPI world has several ranks.

An explicit communicator (``comm=MPI.COMM_SELF``) names the ranks meant and is never refused. The
estimators (``KMeans``, ``PCA``, ...) and ``mpinb.keras.fit`` resolve ``comm=None`` to
``MPI.COMM_WORLD`` themselves and pass it on, so fitting one on rows gathered to the client stays
legitimate: it runs on the client alone, a world of one rank, as scikit-learn would.

Local; no MPI, and nothing from mpinb imported at module level (the collective layer imports it).
"""

from __future__ import annotations

import os
import sys
import weakref
from typing import Any

__all__ = ["note_cluster", "refuse_client", "running_cluster"]

# What MPI launchers put in their processes' environment: MPICH's Hydra and Slurm's PMI-2 (PMI_*),
# Open MPI (OMPI_*) and PMIx launchers (PMIX_*).
_LAUNCHER_VARIABLES = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE")

# The MPIClusters this process has started or connected; weak, so a dropped cluster is forgotten.
_clusters: weakref.WeakSet[Any] = weakref.WeakSet()


def note_cluster(cluster: Any) -> None:
    """Remember ``cluster`` (an ``MPICluster`` whose engines are being identified). Local."""
    _clusters.add(cluster)


def running_cluster() -> Any | None:
    """A running ``MPICluster`` this process holds (one with a connected client), else ``None``. Local."""
    for cluster in list(_clusters):
        if getattr(cluster, "client", None) is not None:
            return cluster
    return None


def refuse_client() -> None:
    """Raise the ``RuntimeError`` of the rule above when this process is the client of a running
    ``MPICluster`` and not an MPI rank. Local; the collective layer calls it for ``comm=None``.

    Nearly free where it passes: engines and batch jobs hold no cluster, so the first test ends it.
    """
    if not _clusters:
        return
    cluster = running_cluster()
    if cluster is None or _is_rank():
        return
    raise RuntimeError(_message(_public_caller(), cluster))


def _is_rank() -> bool:
    if any(name in os.environ for name in _LAUNCHER_VARIABLES):
        return True
    from mpinb._collective.cells import engine_id

    if engine_id() is not None:
        return True
    mpi = sys.modules.get("mpi4py.MPI")  # already imported: asking costs nothing and starts nothing
    return bool(mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized()
                and mpi.COMM_WORLD.Get_size() > 1)


def _message(call: str, cluster: Any) -> str:
    n = getattr(cluster, "n", None)
    ranks = f"its {n} engines" if isinstance(n, int) else "its engines"
    return (
        f"{call} is a collective of the MPI ranks, and this process is not one of them: it is the client "
        f"of a running MPICluster, whose ranks are {ranks}. Run it in a %%px cell (or with "
        "cluster.view.execute/apply), where every rank calls it together. Here, outside %%px, MPI's world "
        "would be this process alone (size 1), and the call would return its own value as if it came from "
        "the ranks. Fitting an estimator on rows gathered to the client is fine: it runs on this process "
        "alone; to run a collective on this process alone on purpose, pass comm=MPI.COMM_SELF."
    )


def _public_caller() -> str:
    """The mpinb function the user called (the outermost mpinb frame), as the user would write it."""
    frame = sys._getframe(2)
    outermost = None
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module == "mpinb" or module.startswith("mpinb."):
            outermost = frame
        elif outermost is not None:
            break
        frame = frame.f_back  # type: ignore[assignment]
    if outermost is None:
        return "this mpinb collective"
    module = outermost.f_globals["__name__"]
    name = outermost.f_code.co_qualname
    mpinb = sys.modules.get("mpinb")
    if getattr(mpinb, name, None) is outermost.f_globals.get(name, False):  # re-exported at the top
        return f"mpinb.{name}()"
    return f"{module}.{name}()"
