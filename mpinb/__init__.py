"""mpinb: interactive parallel machine learning on MPI, from Jupyter.

Engine-side helpers are *collective* (every rank calls them) or *local*; client helpers run in the
notebook kernel and never initialise MPI there. Importing this package imports NumPy only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mpinb.agreement import check_all, check_same, raise_together
from mpinb.comm import World, allreduce, bcast, gather_rows, limit_threads, on_root, rprint, world
from mpinb.deadline import get_collective_timeout, set_collective_timeout
from mpinb.errors import CollectiveAbandoned, CollectiveMismatchError, CollectiveTimeout
from mpinb.shards import shard, shard_bounds

__version__ = "0.1.0"

# Heavy parts load on first use, so ``import mpinb`` stays fast and never starts MPI in a notebook.
_LAZY = {
    "KMeans": "mpinb.kmeans",
    "MPICluster": "mpinb.client",
    "MiniBatchKMeans": "mpinb.kmeans",
    "PCA": "mpinb.decomposition",
    "StandardScaler": "mpinb.preprocessing",
    "plot_clusters": "mpinb.client.plotting",
    "plot_inertia": "mpinb.client.plotting",
    "plot_loss": "mpinb.client.plotting",
    "plot_speedup": "mpinb.client.plotting",
    "plot_timing": "mpinb.client.plotting",
    "report": "mpinb.client.report",
}

if TYPE_CHECKING:  # what the lazy names are, for type checkers and editors; nothing loads at run time
    from mpinb.client import MPICluster
    from mpinb.client.plotting import plot_clusters, plot_inertia, plot_loss, plot_speedup, plot_timing
    from mpinb.client.report import report
    from mpinb.decomposition import PCA
    from mpinb.kmeans import KMeans, MiniBatchKMeans
    from mpinb.preprocessing import StandardScaler

__all__ = [
    "CollectiveAbandoned",
    "CollectiveMismatchError",
    "CollectiveTimeout",
    "KMeans",
    "MPICluster",
    "MiniBatchKMeans",
    "PCA",
    "StandardScaler",
    "World",
    "__version__",
    "allreduce",
    "bcast",
    "check_all",
    "check_same",
    "gather_rows",
    "get_collective_timeout",
    "limit_threads",
    "on_root",
    "plot_clusters",
    "plot_inertia",
    "plot_loss",
    "plot_speedup",
    "plot_timing",
    "raise_together",
    "report",
    "rprint",
    "set_collective_timeout",
    "shard",
    "shard_bounds",
    "world",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        if name in ("agreement", "client", "data", "decomposition", "deadline", "errors", "interrupt", "jobs",
                    "keras", "kmeans", "live", "preprocessing"):
            import importlib

            return importlib.import_module(f"mpinb.{name}")
        raise AttributeError(f"module 'mpinb' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return list(__all__)
