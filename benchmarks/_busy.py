"""A busy background process for the benchmarks: one extra process that spins on a core on demand.

The benchmarks' "busy" case asks how mpinb behaves when something else on a small machine wants a
core too (a second notebook kernel, a compile, a browser). One process is started per job and
toggled between spinning and blocked, so idle and busy measurements alternate within one job,
seconds apart, instead of minutes apart in separate jobs on a machine whose speed drifts.

The child reads its control pipe: ``b"1"`` spins, ``b"0"`` blocks in ``read`` (no CPU). It exits
when the pipe closes, so it cannot outlive the rank that started it even if that rank is killed;
``close`` (called by the context manager's exit) also kills it by PID.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

__all__ = ["BusyProcess", "KINDS"]

# The loop checks its control pipe every few milliseconds: cheap beside the work, quick to stop.
_CHILD = r"""
import os, select, sys
kind = sys.argv[1]
if kind == "numpy":
    import numpy as np
    a = np.random.default_rng(0).random(1 << 20)  # 8 MiB: streams through memory like real work
    out = np.empty_like(a)
    def work():
        np.sqrt(a, out=out)
        np.multiply(out, 1.0000001, out=out)
else:
    def work():
        x = 0
        for i in range(20000):
            x += i
spinning = False
while True:
    if spinning:
        ready = select.select([0], [], [], 0)[0]
    if not spinning or ready:
        data = os.read(0, 1)
        if not data:  # the parent closed the pipe or died
            break
        spinning = data == b"1"
        continue
    work()
"""

KINDS = ("python", "numpy")


class BusyProcess:
    """One background process, blocked until :meth:`spin`; use as a context manager.

    Parameters
    ----------
    kind : {"python", "numpy"}
        A pure-Python integer loop (one core of CPU, nothing else) or NumPy element-wise passes over
        an 8 MiB array (CPU plus memory bandwidth).
    """

    def __init__(self, kind: str = "python") -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}; got {kind!r}.")
        self.kind = kind
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
        self.proc = subprocess.Popen([sys.executable, "-c", _CHILD, kind], stdin=subprocess.PIPE, env=env,
                                     close_fds=True)
        self.pid = self.proc.pid
        try:
            # Free to run on every core, like an unrelated process: not confined to the affinity of
            # the rank that started it (MPICH leaves ranks unbound today, but a launcher may bind).
            os.sched_setaffinity(self.pid, range(os.cpu_count() or 1))
        except (AttributeError, OSError):
            pass
        self.spinning = False
        self._busy_wall = 0.0
        self._busy_cpu = 0.0
        self._since: tuple[float, float] | None = None

    def spin(self) -> None:
        """Start spinning (returns at once; the child is running within microseconds)."""
        if not self.spinning:
            self._send(b"1")
            self.spinning = True
            self._since = (time.perf_counter(), self.cpu_seconds())

    def idle(self) -> None:
        """Stop spinning; the child blocks and uses no CPU."""
        if self.spinning:
            self._send(b"0")
            self.spinning = False
            assert self._since is not None
            self._busy_wall += time.perf_counter() - self._since[0]
            self._busy_cpu += self.cpu_seconds() - self._since[1]
            self._since = None

    def cpu_seconds(self) -> float:
        """CPU time the child has used so far (user + system), from ``/proc``; 0.0 where unreadable."""
        try:
            with open(f"/proc/{self.pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return 0.0

    def cpu_share(self) -> float | None:
        """Fraction of one core the child got while spinning, over all spinning periods so far."""
        return self._busy_cpu / self._busy_wall if self._busy_wall > 0 else None

    def close(self) -> None:
        """Kill the child by PID and reap it."""
        try:
            self.idle()
        except OSError:  # the child is already gone
            pass
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def _send(self, byte: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(byte)
        self.proc.stdin.flush()

    def __enter__(self) -> BusyProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
