"""Run a program under ``srun --mpi=pmi2`` with PMI-1 requests that fit Slurm's 1 KiB read.

Run by path (``python -I _pmi1_relay.py PROGRAM ARGS...``, so it imports nothing of mpinb): it
forks a relay between Slurm's PMI socket and a new socket pair, points ``PMI_FD`` at the new one and
execs the program, which stays the task srun started (same PID, signals and exit status).

Why: Slurm's pmi2 plugin (22.05, Debian 12's) reads a PMI-1 request with one ``read`` of at most
1,024 bytes and answers ``get_maxes`` with ``vallen_max=1024``. MPICH cuts a long value into
segments of ``(vallen_max - 2) / 2`` bytes and hex-encodes them, so one ``put`` line can reach
~1,085 bytes: Slurm parses the first 1,024 ("mpi/pmi2: value not properly terminated in client
request"), the rest as a request of its own, and the peers get a truncated value. mpich 5.0.2's
UCX netmod publishes 4,096 bytes per node root, its worker address followed by whatever lies
beyond it in the heap, so whether a line overflows depends on the heap's contents: a 2-node srun
failed 2 of 2 runs on one machine and passed on another. The relay lowers ``vallen_max`` in that
one answer so that every line MPICH writes fits; nothing else is changed.
"""

from __future__ import annotations

import os
import re
import select
import socket
import sys

# A put line is "cmd=put kvsname=K key=Y value=V\n": 29 bytes of syntax, Slurm's key space name
# ("JOB.STEP", well under 32) and MPICH's key (at most keylen_max, 64). MPICH's values are at most
# vallen_max - 2 characters: 896 leaves 1,019 bytes at worst.
SAFE_VALLEN = 896
_VALLEN = re.compile(rb"(cmd=maxes\b[^\n]*\bvallen_max=)(\d+)")


def lower_vallen(reply: bytes, limit: int = SAFE_VALLEN) -> bytes:
    """Slurm's answer with ``vallen_max`` lowered to ``limit`` in a ``cmd=maxes`` reply; any other unchanged."""
    return _VALLEN.sub(lambda m: m.group(1) + str(min(int(m.group(2)), limit)).encode(), reply)


def relay(slurm: int, program: int) -> None:
    """Copy bytes both ways until either side closes, lowering ``vallen_max`` on the way to the program."""
    while True:
        ready, _, _ = select.select([slurm, program], [], [])
        for source in ready:
            data = os.read(source, 65536)
            if not data:
                return
            if source == slurm:
                _write_all(program, lower_vallen(data))
            else:
                _write_all(slurm, data)  # one write per request, as the program wrote it


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit("usage: python -I _pmi1_relay.py PROGRAM [ARGS...]")
    fd = os.environ.get("PMI_FD", "")
    if fd.isdigit():
        slurm = int(fd)
        mine, theirs = socket.socketpair()
        if os.fork() == 0:
            # The relay: a child of the program once it execs, so Slurm ends it with the step. It
            # holds none of the task's output pipes (srun waits for those to close).
            theirs.close()
            null = os.open(os.devnull, os.O_RDWR)
            for std in (0, 1, 2):
                os.dup2(null, std)
            try:
                relay(slurm, mine.fileno())
            except OSError:
                pass
            os._exit(0)
        mine.close()
        os.close(slurm)
        os.set_inheritable(theirs.fileno(), True)
        os.environ["PMI_FD"] = str(theirs.fileno())
    os.execvp(argv[0], argv)


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


if __name__ == "__main__":
    main(sys.argv[1:])
