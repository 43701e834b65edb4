"""A communicator wrapper that records every communication call made on it, and who made it."""

from __future__ import annotations

import sys
from typing import Any

# mpi4py's communication methods: buffer-based (capitalised) and pickle-based (lower case).
_BUFFER = ("Allreduce", "Bcast", "Allgather", "Allgatherv", "Gather", "Gatherv", "Scatter", "Scatterv", "Reduce",
           "Barrier", "Alltoall", "Alltoallv", "Reduce_scatter", "Scan", "Exscan", "Send", "Ssend", "Recv",
           "Sendrecv", "Probe", "Mprobe", "Dup", "Split", "Split_type", "Create")
_PICKLED = ("allreduce", "bcast", "allgather", "gather", "scatter", "reduce", "barrier", "alltoall", "send",
            "ssend", "recv", "sendrecv", "probe", "mprobe", "scan", "exscan")
# Non-blocking forms: Iallreduce, Idup, Isend, ...; isend, irecv, improbe, ...
_NAMES = frozenset(_BUFFER) | frozenset("I" + n[0].lower() + n[1:] for n in _BUFFER) \
    | frozenset(_PICKLED) | frozenset("i" + n for n in _PICKLED)


def is_communication(name: str) -> bool:
    return name in _NAMES


class CountingComm:
    """Forwards everything to ``comm``; ``calls`` lists ``(method, calling module)`` for every
    communication method called, on it and on the communicators duplicated from it."""

    def __init__(self, comm: Any, calls: list[tuple[str, str]] | None = None) -> None:
        self._comm = comm
        self.calls = [] if calls is None else calls

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._comm, name)
        if not is_communication(name) or not callable(attr):
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, sys._getframe(1).f_globals.get("__name__", "?")))
            out = attr(*args, **kwargs)
            if name in ("Dup", "Split", "Split_type", "Create"):
                return CountingComm(out, self.calls)
            if name == "Idup":
                return CountingComm(out[0], self.calls), out[1]
            return out

        return counted

    def outside(self, allowed: str = "mpinb._collective") -> list[tuple[str, str]]:
        """Calls made by mpinb modules outside the package ``allowed``."""
        return [(m, who) for m, who in self.calls
                if who.startswith("mpinb") and who != allowed and not who.startswith(allowed + ".")]


def count_calls(monkeypatch: Any, owner: Any, name: str) -> list[str]:
    """Replace ``owner.name`` (a module's function or class) for the test by a wrapper that appends
    to the returned list on every call, then calls the original: how a test counts, say, gradient
    exchanges or buffer allocations without production code keeping counters for it."""
    calls: list[str] = []
    original = getattr(owner, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(name)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls
