"""Errors from many ranks, shown once per distinct error and named by MPI rank.

Client. mpinb's collectives raise the same exception on every rank, so a failing 16-rank ``%%px``
cell would print 16 identical tracebacks. :func:`render` shows ipyparallel's ``CompositeError``
(what ``%%px`` and ``view.execute`` raise) as each distinct error once, with the ranks that raised
it, and :func:`by_rank` gives each rank's own error, one attribute away
(:func:`mpinb.client._ipp.group_composite_errors` installs both on the class).
"""

from __future__ import annotations

from typing import Any

from mpinb._words import rank_ranges

__all__ = ["by_rank", "rank_of_engine", "remember_ranks", "render"]

_rank_of_engine: dict[int, int] = {}


def remember_ranks(ids_by_rank: list[int]) -> None:
    """Record which MPI rank each engine id is (``MPICluster`` calls it whenever it identifies)."""
    _rank_of_engine.update({eid: rank for rank, eid in enumerate(ids_by_rank)})


def rank_of_engine(engine_id: int) -> int:
    """The MPI rank of an engine id (the id itself when ``MPICluster`` has not identified it)."""
    return _rank_of_engine.get(engine_id, engine_id)


def _who(engine_info: dict | None) -> tuple[str, int]:
    eid = (engine_info or {}).get("engine_id")
    if eid in _rank_of_engine:
        return "rank", _rank_of_engine[eid]
    return "engine", -1 if eid is None else int(eid)


def by_rank(self: Any) -> dict[int, Any]:
    """Each rank's own error of a ``CompositeError`` (``self``), as a ``RemoteError``."""
    from ipyparallel import error

    out = {}
    for en, ev, etb, ei in self.elist:
        kind, number = _who(ei)
        if kind == "rank":
            out[number] = error.RemoteError(en, ev, etb, ei)
    return out


def render(self: Any, excid: int | None = None) -> list[str]:
    """The lines a ``CompositeError`` (``self``) shows: each distinct error once, with its ranks."""
    if excid is not None:
        en, ev, etb, ei = self.elist[excid]
        return [f"[{' '.join(map(str, _who(ei)))}]:", *(etb or "No traceback available").splitlines()]
    groups: dict[tuple[str, str], list[tuple[tuple[str, int], str]]] = {}
    for en, ev, etb, ei in self.elist:
        groups.setdefault((en, str(ev)), []).append((_who(ei), etb or "No traceback available"))
    lines = []
    deaths = getattr(self, "mpinb_deaths", None)
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
