"""Hydra's control port, as every engine inherits it: kept to loopback on one machine, then closed.

Local, on an engine. MPICH's ``mpiexec`` (Hydra) listens for its proxies on the wildcard address
whatever ``-iface``, ``-localhost`` or ``-hosts`` say: ``HYDU_sock_listen`` (``lib/utils/sock.c``)
binds through ``MPL_listen_anyport``, which binds ``INADDR_ANY`` unless ``MPL_set_listen_attr`` asked
for loopback, and Hydra never asks. It does not mark the socket close-on-exec either, so its proxy and
every rank hold the same socket. When every rank runs on this machine the port is never used (a local
proxy talks to ``mpiexec`` over a socketpair, ``HYDI_CONTROL_FD``), yet it answers anyone who can
reach the machine. A rank cannot rebind or shut it (``shutdown`` makes ``mpiexec``'s ``accept`` fail
and the job abort), but a socket filter attached through the rank's copy applies to the socket
itself, for ``mpiexec`` too: packets not addressed to 127.0.0.0/8 are dropped, so from elsewhere the
port looks firewalled. ``ss`` still lists it on ``0.0.0.0``.
"""

from __future__ import annotations

import ctypes
import os
import socket
import stat

__all__ = ["LOOPBACK_ONLY_FILTER", "confine_inherited_listeners"]

_SO_ATTACH_FILTER = getattr(socket, "SO_ATTACH_FILTER", 26)  # Linux's value; Python names it on few builds
_SKF_NET_OFF = -0x100000  # classic BPF: loads relative to the IP header (a TCP socket's data starts at TCP's)

# Classic BPF (code, jt, jf, k): accept a packet whose IPv4 destination is in 127.0.0.0/8, drop the
# rest. Dropping a SYN makes the connecting side time out, as a firewall's DROP would.
LOOPBACK_ONLY_FILTER = (
    (0x20, 0, 0, (_SKF_NET_OFF + 16) & 0xFFFFFFFF),  # ld  [net + 16]: the destination address
    (0x54, 0, 0, 0xFF000000),  # and #0xff000000
    (0x15, 0, 1, 0x7F000000),  # jeq #127.0.0.0, accept, drop
    (0x06, 0, 0, 0xFFFFFFFF),  # accept: ret #-1, the whole packet
    (0x06, 0, 0, 0),  # drop: ret #0
)


class _Instruction(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                ("k", ctypes.c_uint32)]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Instruction))]


def confine_inherited_listeners(*, loopback_only: bool) -> None:
    """Close this process's copies of sockets listening on every address (Hydra's control port:
    ``mpiexec`` and its proxy keep theirs, the engine never accepts on it); first, when
    ``loopback_only`` (every rank on this machine), make an IPv4 one answer loopback alone.

    Local. Never on a cluster spread over hosts: there remote proxies connect to that port, and may
    still be on their way when the first engine starts. An engine's own sockets (ZeroMQ's, MPI's) are
    bound to an address and left alone.
    """
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
        try:
            if listening and address == "0.0.0.0" and loopback_only:
                _attach(sock, LOOPBACK_ONLY_FILTER)
        except OSError:  # a kernel without socket filters: the port stays as Hydra opened it
            pass
        finally:
            sock.detach()
        if listening and address in ("0.0.0.0", "::"):
            os.close(fd)


def _attach(sock: socket.socket, program: tuple[tuple[int, int, int, int], ...]) -> None:
    """Attach a classic BPF ``program`` to ``sock``: the kernel copies it, so the buffers may go."""
    instructions = (_Instruction * len(program))(*(_Instruction(*step) for step in program))
    sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, bytes(_Program(len(program), instructions)))
