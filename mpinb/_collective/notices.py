"""Notices between ranks: the one protocol that spreads a note from one rank to many, along a tree.

Two kinds of note travel this way on a channel's control communicator: a *revocation* (a rank gave
up on a generation; every other rank must learn of it) and a *cell end* (a rank's cell ended; the
ranks on other hosts must learn of it, the ones on its own host read its board row). A note travels
as ``(origin, direct, body)``: the origin sends it itself to the ranks in ``direct``, and down a
binomial tree rooted at itself over the note's other *members*. Every rank derives the same tree
from the wire alone, so a rank that receives a note forwards it to its own children before it reads
it: each member receives each note exactly once, after at most ``ceil(log2 n)`` hops, and no rank
sends more than ``ceil(log2 n)`` copies. A flat fan-out (the origin sending to every member) costs
its origin ``n - 1`` sends -- a millisecond and more at a thousand ranks, paid while it raises.

The price of a tree: a note crosses a rank only when that rank looks at its notices (every
collective does on entry, every wait while it waits). A rank outside mpinb -- computing, late for
the collective, or gone on after raising -- holds back its subtree until its next collective. So a
revoking rank sends directly to the other ranks of its host (a host's few dozen sends at most: those
outside the collective look for the note on entry, where the host's board says one is due, and one
stopped inside it finds the note when it resumes), and the tree spans the ranks on other hosts.
Cell-end notes span the ranks on other hosts, not host leaders: no rank relays for a whole host, and
the protocol has one shape.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CELL_END", "REVOKED", "children", "forward", "members", "sent", "start"]

REVOKED = 77  # tag of revocation notes on the control communicator
CELL_END = 78  # tag of cell-end notes, to the ranks on other hosts

#: Notes this process has sent, by tag: what the scaling benchmark counts per revocation.
sent: dict[int, int] = {REVOKED: 0, CELL_END: 0}



def members(tag: int, wire: tuple[int, tuple[int, ...], Any], hosts: list[str]) -> list[int]:
    """The tree's ranks for a note of kind ``tag``, the origin first (its root)."""
    origin, direct, _ = wire
    if tag == REVOKED:
        return [origin] + [r for r in range(len(hosts)) if r != origin and r not in direct]
    return [origin] + [r for r, h in enumerate(hosts) if h != hosts[origin] and r not in direct]


def children(rank: int, group: list[int]) -> list[int]:
    """``rank``'s children in the binomial tree over ``group`` rooted at ``group[0]``, the largest
    subtree first (it has the most hops left to go).

    In position terms node ``v`` has the children ``v + 2**k`` for every ``2**k > v``, so its parent is
    ``v`` less its highest bit: the depth of ``v`` is its number of set bits.
    """
    if rank not in group:
        return []  # the origin sent to this rank directly: it passes nothing on
    v, n = group.index(rank), len(group)
    step = 1
    while step <= v:
        step <<= 1
    out = []
    while v + step < n:
        out.append(group[v + step])
        step <<= 1
    return out


def start(ctrl: Any, tag: int, rank: int, body: Any, hosts: list[str],
          direct: tuple[int, ...] = ()) -> list[Any]:
    """Send a new note from ``rank``: down its tree, then to ``direct`` itself; the send requests."""
    wire = (rank, tuple(direct), body)
    return _send(ctrl, tag, wire, children(rank, members(tag, wire, hosts)) + list(wire[1]))


def forward(ctrl: Any, tag: int, wire: tuple[int, tuple[int, ...], Any], rank: int,
            hosts: list[str]) -> tuple[list[Any], Any]:
    """A received note: pass it on down its tree (before reading it, so a rank that already knew
    still relays); the send requests and the note's body."""
    return _send(ctrl, tag, wire, children(rank, members(tag, wire, hosts))), wire[2]


def _send(ctrl: Any, tag: int, wire: tuple[int, tuple[int, ...], Any], ranks: list[int]) -> list[Any]:
    sent[tag] += len(ranks)
    return [ctrl.isend(wire, dest=r, tag=tag) for r in ranks]
