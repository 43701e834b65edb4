"""How mpinb's messages name ranks: one way, engine side and client side.

Local, no imports beyond the standard library: the client (which never starts MPI) and the
collective layer share it. Runs of consecutive ranks are written as ranges, so a message about
1,000 ranks stays one line: ``ranks 0-2, 5, 7-8``.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["clip_to_difference", "describe_mismatch", "on_ranks", "rank_ranges", "ranks"]


def rank_ranges(values: Iterable[int], sep: str = ", ") -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2, 5, 7-8"`` (``sep`` between the runs)."""
    runs: list[list[int]] = []
    for r in sorted(values):
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return sep.join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def ranks(values: Iterable[int], sep: str = ", ") -> str:
    """``"rank 3"`` or ``"ranks 0-2, 5"``."""
    values = list(values)
    return f"{'rank' if len(values) == 1 else 'ranks'} {rank_ranges(values, sep)}"


def on_ranks(values: Iterable[int], size: int) -> str:
    """Where something happened: ``"on the only rank"``, ``"on all 4 ranks"``, ``"on ranks 0, 2 of 3"``."""
    values = list(values)
    if size == 1:
        return "on the only rank"
    if len(values) == size:
        return f"on all {size} ranks"
    return f"on {ranks(values)} of {size}"


def describe_mismatch(what: str, texts: list[str]) -> str:
    """The message of a value that must agree across ranks but does not (``texts``: each rank's)."""
    groups: dict[str, list[int]] = {}
    for rank, text in enumerate(texts):
        groups.setdefault(text, []).append(rank)
    shown = clip_to_difference(list(groups))
    listing = "; ".join(f"{ranks(r)}: {shown[t]}" for t, r in groups.items())
    return f"{what} must be the same on every rank, but differs across {len(texts)} ranks ({listing})."


def clip_to_difference(texts: list[str], width: int = 80) -> dict[str, str]:
    """Long descriptions (50 array shapes) cut to a window around where they first differ."""
    if all(len(t) <= width for t in texts):
        return {t: t for t in texts}
    prefix = 0
    for chars in zip(*texts):
        if len(set(chars)) > 1:
            break
        prefix += 1
    start = max(0, prefix - width // 2)
    return {t: ("..." if start else "") + t[start : start + width] + ("..." if start + width < len(t) else "") for t in texts}
