"""The notebook side: code that runs in the notebook kernel (or a shell) and never imports ``mpi4py.MPI``.

:mod:`.cluster` starts or joins a cluster of MPI engines and addresses them by rank; :mod:`.plotting`
draws what they return; :mod:`.launch` finds and runs ``mpiexec``; :mod:`.bench`, :mod:`.demo` and
:mod:`.cli` drive the engine-side jobs of :mod:`mpinb.jobs` from here.
"""

from __future__ import annotations

from mpinb.client.cluster import MPICluster

__all__ = ["MPICluster"]
