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

Open MPI's launcher (``prterun``) listens for its daemons on ``0.0.0.0`` and ``::`` the same way,
whatever ``oob_tcp_if_include`` says (that chooses the addresses it advertises, not those it binds,
and naming ``lo`` alone fails: it skips loopback when another interface exists), but keeps the socket
to itself. Its parent, the client that started it, takes a copy with ``pidfd_getfd`` (allowed to the
same account; under Yama's ``ptrace_scope=1``, to an ancestor) and attaches the same filter, for both
families: :func:`confine_listeners_of`.
"""

from __future__ import annotations

import ctypes
import os
import socket
import stat

__all__ = ["LOOPBACK_ONLY_FILTER", "LOOPBACK_ONLY_FILTER_46", "confine_inherited_listeners", "confine_listeners_of"]

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


# The same for a socket of either family: IPv4 packets (also those reaching an IPv6 socket that
# accepts both) as above; IPv6 ones only when addressed to ::1.
LOOPBACK_ONLY_FILTER_46 = (
    (0x30, 0, 0, _SKF_NET_OFF & 0xFFFFFFFF),  # ldb [net + 0]: version and class
    (0x54, 0, 0, 0xF0),  # and #0xf0
    (0x15, 0, 3, 0x40),  # jeq #0x40 (IPv4), next, ipv6
    (0x20, 0, 0, (_SKF_NET_OFF + 16) & 0xFFFFFFFF),  # ld [net + 16]: the IPv4 destination
    (0x54, 0, 0, 0xFF000000),  # and #0xff000000
    (0x15, 9, 10, 0x7F000000),  # jeq #127.0.0.0, accept, drop
    (0x15, 0, 9, 0x60),  # ipv6: jeq #0x60, next, drop
    (0x20, 0, 0, (_SKF_NET_OFF + 24) & 0xFFFFFFFF),  # the IPv6 destination, word by word: 0, 0, 0, 1
    (0x15, 0, 7, 0),
    (0x20, 0, 0, (_SKF_NET_OFF + 28) & 0xFFFFFFFF),
    (0x15, 0, 5, 0),
    (0x20, 0, 0, (_SKF_NET_OFF + 32) & 0xFFFFFFFF),
    (0x15, 0, 3, 0),
    (0x20, 0, 0, (_SKF_NET_OFF + 36) & 0xFFFFFFFF),
    (0x15, 0, 1, 1),
    (0x06, 0, 0, 0xFFFFFFFF),  # accept
    (0x06, 0, 0, 0),  # drop
)
_PIDFD_GETFD = 438  # the same number on every architecture Linux added it to


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


def confine_listeners_of(pid: int) -> int:
    """Make every socket of process ``pid`` that listens on a wildcard address answer loopback
    alone; returns how many it confined.

    Client: for Open MPI's ``prterun`` on a one-machine cluster, a child of this process (see the
    module's docstring). Best effort: without ``pidfd_getfd`` (Linux before 5.6, another OS) or
    the right to use it, nothing changes and 0 is returned.
    """
    try:
        pidfd = os.pidfd_open(pid)
        fds = [int(fd) for fd in os.listdir(f"/proc/{pid}/fd")]
    except (AttributeError, OSError):
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    confined = 0
    try:
        for fd in fds:
            copy = libc.syscall(_PIDFD_GETFD, pidfd, fd, 0)
            if copy < 0:
                continue
            try:
                if not stat.S_ISSOCK(os.fstat(copy).st_mode):
                    continue
                sock = socket.socket(fileno=copy)
                try:
                    if (sock.family in (socket.AF_INET, socket.AF_INET6)
                            and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
                            and sock.getsockname()[0] in ("0.0.0.0", "::")):
                        _attach(sock, LOOPBACK_ONLY_FILTER_46)
                        confined += 1
                except OSError:
                    pass
                finally:
                    sock.detach()
            finally:
                os.close(copy)
    finally:
        os.close(pidfd)
    return confined


def _attach(sock: socket.socket, program: tuple[tuple[int, int, int, int], ...]) -> None:
    """Attach a classic BPF ``program`` to ``sock``: the kernel copies it, so the buffers may go."""
    instructions = (_Instruction * len(program))(*(_Instruction(*step) for step in program))
    sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, bytes(_Program(len(program), instructions)))
