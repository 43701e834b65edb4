"""Errors from many ranks, shown once per distinct error and named by MPI rank.

Client. mpinb's collectives raise the same exception on every rank, so a failing 16-rank ``%%px``
cell would print 16 identical tracebacks. :func:`render` shows ipyparallel's ``CompositeError``
(what ``%%px`` and ``view.execute`` raise) as each distinct error once, with the ranks that raised
it, and :func:`by_rank` gives each rank's own error, one attribute away
(:func:`mpinb.client._ipp.group_composite_errors` installs both on the class).
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable
from typing import Any

from mpinb._words import rank_ranges

__all__ = ["by_rank", "rank_of_engine", "remember_ranks", "render"]

_rank_of_engine: dict[int, int] = {}
_deaths_of: dict[int, Callable[[], str | None]] = {}  # engine id -> its cluster's deaths(), weakly


def remember_ranks(ids_by_rank: list[int], deaths: Callable[[], str | None] | None = None) -> None:
    """Record which MPI rank each engine id is, and how to learn which of them died first
    (``MPICluster`` calls it whenever it identifies, with its bound ``deaths``)."""
    _rank_of_engine.update({eid: rank for rank, eid in enumerate(ids_by_rank)})
    if deaths is not None:
        _deaths_of.update(dict.fromkeys(ids_by_rank, _weakly(deaths)))


def _weakly(method: Callable[[], str | None]) -> Callable[[], str | None]:
    """``method`` (bound), called only while its object lives: a closed cluster is not kept alive."""
    ref = weakref.WeakMethod(method)

    def call() -> str | None:
        bound = ref()
        return None if bound is None else bound()

    return call


# ipyparallel's client makes the error of an engine that died itself, with no engine info: the
# engine is only in its text.
_DIED = re.compile(r"Engine (\d+) died")


def _engine_of(ename: str, evalue: Any, engine_info: dict | None) -> int | None:
    eid = (engine_info or {}).get("engine_id")
    if eid is None and ename == "EngineError" and (m := _DIED.search(str(evalue))):
        eid = int(m[1])
    return None if eid is None else int(eid)


def _deaths(self: Any) -> str | None:
    """Which rank died first, for a ``CompositeError`` with dead engines (``%%px`` sets it; for
    ``view.execute`` and ``AsyncResult.get`` it is asked of the engines' cluster here)."""
    if not hasattr(self, "mpinb_deaths"):
        report = None
        for en, ev, _, ei in self.elist:
            ask = _deaths_of.get(_engine_of(en, ev, ei)) if en == "EngineError" else None  # type: ignore[arg-type]
            if ask is not None:
                report = ask()
                break
        self.mpinb_deaths = report
    return self.mpinb_deaths


def rank_of_engine(engine_id: int) -> int:
    """The MPI rank of an engine id (the id itself when ``MPICluster`` has not identified it)."""
    return _rank_of_engine.get(engine_id, engine_id)


def _same(ename: str, evalue: Any) -> str:
    """What makes two errors the same for grouping: the text, but one death is like another (each
    names its own engine and task)."""
    return "died" if ename == "EngineError" and _DIED.search(str(evalue)) else str(evalue)


def _who(ename: str, evalue: Any, engine_info: dict | None) -> tuple[str, int]:
    eid = _engine_of(ename, evalue, engine_info)
    if eid in _rank_of_engine:
        return "rank", _rank_of_engine[eid]
    return "engine", -1 if eid is None else eid


def by_rank(self: Any) -> dict[int, Any]:
    """Each rank's own error of a ``CompositeError`` (``self``), as a ``RemoteError``."""
    from ipyparallel import error

    out = {}
    for en, ev, etb, ei in self.elist:
        kind, number = _who(en, ev, ei)
        if kind == "rank":
            out[number] = error.RemoteError(en, ev, etb, ei)
    return out


def render(self: Any, excid: int | None = None) -> list[str]:
    """The lines a ``CompositeError`` (``self``) shows: each distinct error once, with its ranks."""
    if excid is not None:
        en, ev, etb, ei = self.elist[excid]
        return [f"[{' '.join(map(str, _who(en, ev, ei)))}]:", *(etb or "No traceback available").splitlines()]
    groups: dict[tuple[str, str], list[tuple[tuple[str, int], str]]] = {}
    for en, ev, etb, ei in self.elist:
        groups.setdefault((en, _same(en, ev)), []).append((_who(en, ev, ei), etb or "No traceback available"))
    lines = []
    deaths = _deaths(self)
    if deaths:
        lines += [f"mpinb: {deaths}", ""]
    for (en, _), members in groups.items():
        kinds = {kind for (kind, _), _ in members}
        numbers = [number for (_, number), _ in members]
        label = "ranks" if kinds == {"rank"} else "engines"
        lines.append(f"{en} on {label if len(numbers) > 1 else label[:-1]} {rank_ranges(numbers)}"
                     + (f" ({len(numbers)} of {len(self.elist)} errors, the same):" if len(numbers) > 1 else ":"))
        lines.extend(min(members)[1].splitlines())
        lines.append("")
    if len(groups) < len(self.elist):
        lines.append("Each rank's own error: sys.last_value.by_rank[r] (print_traceback() shows it).")
    return lines
