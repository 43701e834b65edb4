"""How mpinb's messages name ranks: one way, engine side and client side.

Local, no imports beyond the standard library: the client (which never starts MPI) and the
collective layer share it. Runs of consecutive ranks are written as ranges, so a message about
1,000 ranks stays one line: ``ranks 0-2, 5, 7-8``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

__all__ = ["EntryList", "Listed", "clip_to_difference", "describe_mismatch", "on_ranks", "rank_ranges", "ranks"]


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


class EntryList(NamedTuple):
    """A list's entries as text, and the name of each on the rank that sent it (``labels``: a weight's
    path, say; not compared, since names may differ where values agree)."""

    entries: tuple[str, ...]
    labels: tuple[str, ...] | None = None


class Listed(str):
    """A list's ``repr``, compared across ranks as text, keeping its entries (``detail``) so that a
    mismatch names the first entry that differs, in full."""

    detail: EntryList

    def __new__(cls, values: Sequence[Any], labels: Sequence[str] | None = None) -> Listed:
        self = super().__new__(cls, repr(values))
        self.detail = EntryList(tuple(repr(v) for v in values), None if labels is None else tuple(map(str, labels)))
        return self


def describe_mismatch(what: str, texts: Sequence[str | EntryList]) -> str:
    """The message of a value that must agree across ranks but does not (``texts``: each rank's)."""
    if texts and all(isinstance(t, EntryList) for t in texts):
        return _describe_entries(what, texts)  # type: ignore[arg-type]
    joined = [" ".join(t.entries) if isinstance(t, EntryList) else str(t) for t in texts]
    groups: dict[str, list[int]] = {}
    for rank, text in enumerate(joined):
        groups.setdefault(text, []).append(rank)
    shown = clip_to_difference(list(groups))
    listing = "; ".join(f"{ranks(r)}: {shown[t]}" for t, r in groups.items())
    return f"{what} must be the same on every rank, but differs across {len(texts)} ranks ({listing})."


def _describe_entries(what: str, lists: Sequence[EntryList]) -> str:
    """The first entry at which the ranks' lists differ, each group's in full with its name."""
    groups: dict[tuple[str, ...], list[int]] = {}
    for rank, listed in enumerate(lists):
        groups.setdefault(listed.entries, []).append(rank)
    first = next((i for i in range(max(map(len, groups)))
                  if len({e[i] if i < len(e) else None for e in groups}) > 1), 0)

    def entry(entries: tuple[str, ...], rank: int) -> str:
        if first >= len(entries):
            return f"no entry {first} ({len(entries)} entries)"
        labels = lists[rank].labels
        name = f"{labels[first]} " if labels is not None and first < len(labels) else ""
        return f"{name}{entries[first]}"

    listing = "; ".join(f"{ranks(r)}: {entry(e, r[0])}" for e, r in groups.items())
    counts = {len(e) for e in groups}
    per_group = "; ".join(f"{ranks(r)}: {len(e)} entries" for e, r in groups.items())
    sizes = "" if len(counts) == 1 else f" ({per_group})"
    return (f"{what} must be the same on every rank, but differs across {len(lists)} ranks, first at entry "
            f"{first} (counting from 0){sizes}: {listing}.")


def clip_to_difference(texts: list[str], width: int = 80) -> dict[str, str]:
    """Long descriptions (50 array shapes) cut to a window around where they first differ."""
    if all(len(t) <= width for t in texts):
        return {t: t for t in texts}
    prefix = 0
    for chars in zip(*texts, strict=False):
        if len(set(chars)) > 1:
            break
        prefix += 1
    start = max(0, prefix - width // 2)
    return {t: ("..." if start else "") + t[start : start + width] + ("..." if start + width < len(t) else "")
            for t in texts}
