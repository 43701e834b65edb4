"""What ``MPICluster`` runs on its engines: who each engine is, and the set-up every fresh engine gets.

Engine side: each function here is sent by the client (``view.apply``) and runs on the ranks,
where ``mpi4py.MPI`` may be imported. The client imports this module only to name the functions,
so nothing here imports ``mpi4py.MPI`` at module level.
"""

from __future__ import annotations

import os
import stat
from typing import Any

__all__ = ["identity", "rank", "set_up", "with_rank"]

_SET_UP_TIMEOUT = 120.0  # seconds the engines of a fresh world wait for each other at set-up


def identity() -> dict[str, Any]:
    """This engine's MPI rank, world size, host and PID. Local."""
    import socket

    from mpi4py import MPI

    return {
        "rank": MPI.COMM_WORLD.Get_rank(),
        "size": MPI.COMM_WORLD.Get_size(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }


def set_up(started_by_mpinb: bool) -> None:
    """mpinb's collective set-up on every engine together; on engines ``MPICluster`` started, the
    rank's thread budget and a quiet TensorFlow too.

    Collective: from the first cell on, a collective that times out can name the missing ranks and
    say where each of them is. The thread budget follows the one rule, a host's cores shared by that
    host's ranks (:func:`mpinb.limit_threads`), decided here because only the ranks know which host
    they are on; a budget the user gave (``threads_per_rank``, or thread variables in the engines'
    environment) is kept. TensorFlow's C++ start-up lines would print once per rank in ``%%px``.
    Engines started elsewhere (``MPICluster.connect``) are left as their owner configured them.
    """
    import mpinb
    from mpinb.comm import threads_chosen

    mpinb.world(timeout=_SET_UP_TIMEOUT)
    if not started_by_mpinb:
        return
    _close_inherited_listeners()
    if not threads_chosen():
        mpinb.limit_threads(timeout=_SET_UP_TIMEOUT)  # local now: world() exchanged the hosts
    from mpinb._quiet_tf import quiet_future_import

    quiet_future_import()


def _close_inherited_listeners() -> None:
    """Close this engine's copies of listening sockets bound to every address: Hydra's control port
    (mpiexec and its proxies keep listening on theirs; the engine never accepts on it), inherited
    because Hydra does not mark it close-on-exec. An engine's own sockets (ZeroMQ's, MPI's) are
    bound to an address. Local."""
    import socket

    try:
        fds = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:
        return
    for fd in fds:
        try:
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            sock = socket.socket(fileno=fd)
        except OSError:
            continue
        try:
            listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
            address = sock.getsockname()[0] if sock.family in (socket.AF_INET, socket.AF_INET6) else None
        except OSError:
            listening, address = 0, None
        finally:
            sock.detach()
        if listening and address in ("0.0.0.0", "::"):
            os.close(fd)


def rank() -> int:
    """This engine's rank in ``MPI.COMM_WORLD`` (a probe that answers as long as the engine does). Local."""
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank()


def with_rank(value: Any) -> tuple[int, Any]:
    """``(rank, value)``: what the client sorts by to put values pulled from the engines in rank order. Local."""
    return rank(), value
