"""Finding and running ``mpiexec`` from the client, with an environment fit for a small machine."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from mpinb.client._processes import finish
from mpinb.comm import thread_env

__all__ = ["MPICH_YIELD", "find_mpiexec", "is_hydra", "mpi_env", "run_mpi", "usable_cores"]

# MPICH busy-polls inside collectives; with more ranks than cores the polling ranks starve the
# ranks doing work. Yielding halves the median step time on an oversubscribed machine.
MPICH_YIELD = {"MPIR_CVAR_ENABLE_HEAVY_YIELD": "1", "MPIR_CVAR_POLLS_BEFORE_YIELD": "1"}
# Open MPI (PRRTE) refuses to start more ranks than cores unless the mapping allows it (it then
# yields when idle by itself). Both are read only by their own MPI: harmless to the other.
OPEN_MPI_OVERSUBSCRIBE = {"PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe"}


def find_mpiexec() -> str:
    """Path of the ``mpiexec`` that matches this Python's mpi4py.

    Client. A venv's ``mpiexec`` (from the ``mpich`` wheel) sits next to ``sys.executable`` but is
    not on ``PATH`` unless the venv is activated, so look there first.

    Raises
    ------
    FileNotFoundError
        With the install command that provides one.
    """
    here = Path(sys.executable).parent / "mpiexec"
    if here.exists():
        return str(here)
    found = shutil.which("mpiexec")
    if found:
        return found
    raise FileNotFoundError(
        "No mpiexec found next to this Python or on PATH. Install an MPI runtime: "
        "`pip install mpich` (or `pip install 'mpinb[mpi]'`), or `conda install -c conda-forge mpich`."
    )


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask), which its ``mpiexec`` ranks share. Local."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@functools.cache
def is_hydra(mpiexec: str) -> bool:
    """Whether ``mpiexec`` is Hydra (MPICH's, Intel MPI's launcher), from its ``--version``. Client."""
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30,
                             stdin=subprocess.DEVNULL, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    # MPICH's says "HYDRA build details"; Intel MPI's (a Hydra too, with -prepend-rank) names its library.
    return "HYDRA" in out or "Intel(R) MPI Library" in out


def mpi_env(n: int, *, threads_per_rank: int | None = None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for ``n`` ranks started from this machine: MPICH's yield settings and Open MPI's
    leave to oversubscribe when the ranks outnumber its cores, and ``threads_per_rank`` threads for
    every pool when given, without overriding anything the user set explicitly.

    Local. Without ``threads_per_rank`` no thread budget is set: the launcher cannot know how many
    ranks land on each host (a hostfile, or Hydra inside a Slurm allocation, spreads them), so each
    rank decides, from the hosts the ranks exchanged: :func:`mpinb.limit_threads` (which ``MPICluster``'s
    engines, ``mpinb.keras.fit`` and mpinb's jobs call) shares a host's cores among that host's ranks.
    """
    env = dict(os.environ if base is None else base)
    if threads_per_rank is not None:
        for var, value in thread_env(threads_per_rank).items():
            env.setdefault(var, value)
    if n > usable_cores():
        for var, value in {**MPICH_YIELD, **OPEN_MPI_OVERSUBSCRIBE}.items():
            env.setdefault(var, value)
    return env


def run_mpi(
    n: int,
    argv: Sequence[str],
    *,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    capture: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run ``mpiexec -n n python -m mpi4py <argv...>`` with this Python, killing it on timeout.

    Client. ``python -m mpi4py`` turns an uncaught exception on one rank into an abort of the job
    instead of a hang of the others. On timeout the whole process group is killed, so no rank is
    left behind, and ``subprocess.TimeoutExpired`` is raised.
    """
    cmd = [find_mpiexec(), "-n", str(n), sys.executable, "-m", "mpi4py", *argv]
    proc = subprocess.Popen(
        cmd,
        env=mpi_env(n, base=env),
        stdout=subprocess.PIPE if capture else None,
        stderr=subprocess.STDOUT if capture else None,
        text=True,
        start_new_session=True,
    )
    out, code = finish(proc, timeout)
    if code is None:
        raise subprocess.TimeoutExpired(cmd, timeout or 0.0, output=out)
    return subprocess.CompletedProcess(cmd, code, out, None)
