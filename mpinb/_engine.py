"""What ``MPICluster`` runs on its engines: who each engine is, and the set-up every fresh engine gets.

Engine side: each function here is sent by the client (``view.apply``) and runs on the ranks,
where ``mpi4py.MPI`` may be imported. The client imports this module only to name the functions,
so nothing here imports ``mpi4py.MPI`` at module level.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["identity", "rank", "set_up", "with_rank"]

_SET_UP_TIMEOUT = 120.0  # seconds the engines of a fresh world wait for each other at set-up


def identity() -> dict[str, Any]:
    """This engine's MPI rank, world size, host and PID. Local.

    The client's first call on a fresh engine, so it is where an engine whose ``import mpinb``
    found a folder named ``mpinb`` in its directory (:mod:`mpinb._shadow`) fails the start with
    an ``ImportError`` that says what shadows what, instead of the set-up's ``AttributeError``.
    """
    import socket

    from mpi4py import MPI

    from mpinb import _shadow

    found = {
        "rank": MPI.COMM_WORLD.Get_rank(),
        "size": MPI.COMM_WORLD.Get_size(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }
    _shadow.check(f"the engine of rank {found['rank']} ({found['host']}, pid {found['pid']}, "
                  f"directory {os.getcwd()})")
    return found


def set_up(started_by_mpinb: bool, one_machine: bool = False) -> str:
    """mpinb's collective set-up on every engine together; on engines ``MPICluster`` started, the
    rank's thread budget and a quiet TensorFlow too.

    Collective: from the first cell on, a collective that times out can name the missing ranks and
    say where each of them is. The thread budget follows the one rule, a host's cores shared by that
    host's ranks (:func:`mpinb.limit_threads`), decided here because only the ranks know which host
    they are on; a budget the user gave (``threads_per_rank``, or thread variables in the engines'
    environment) is kept. TensorFlow's C++ start-up lines would print once per rank in ``%%px``.
    Engines started elsewhere (``MPICluster.connect``) are left as their owner configured them.
    With ``one_machine`` (every rank on this machine), Hydra's control port answers loopback alone
    (:mod:`mpinb._listeners`); the engines ``MPICluster`` starts there did so from their first line
    (:mod:`mpinb._engine_boot`), so this only catches engines a user's ``engine_cmd`` started.
    Returns the rank's device (:func:`mpinb.gpus.device`: ``"GPU 1"``, ``"CPU"``, or ``"not
    chosen"`` on engines started elsewhere that never chose).
    """
    import mpinb
    from mpinb._listeners import confine_inherited_listeners
    from mpinb.comm import threads_chosen

    if started_by_mpinb:  # first: the sooner Hydra's wildcard port answers loopback alone, the better
        confine_inherited_listeners(loopback_only=one_machine)
    from mpinb import gpus

    mpinb.world(timeout=_SET_UP_TIMEOUT)
    if not started_by_mpinb:
        return gpus.device()
    if not threads_chosen():
        mpinb.limit_threads(timeout=_SET_UP_TIMEOUT)  # local now: world() exchanged the hosts
    gpus.use_one_gpu_per_rank()  # before any cell can initialise TensorFlow; MPINB_GPUS=share/off in the env
    from mpinb._quiet_tf import quiet_future_import

    quiet_future_import()
    return gpus.device()


def rank() -> int:
    """This engine's rank in ``MPI.COMM_WORLD`` (a probe that answers as long as the engine does). Local."""
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank()


def with_rank(value: Any) -> tuple[int, Any]:
    """``(rank, value)``: what the client sorts by to put values pulled from the engines in rank order. Local."""
    return rank(), value
