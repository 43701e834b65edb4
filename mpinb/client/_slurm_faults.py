"""What is true after a Slurm fault: which ranks a lost node took, which ended after, which live.

Client. A node is lost when its slurmd stops answering (the machine crashed, or its daemons were
killed): the ranks on it vanish without a word, since their engines, nannies and slurmstepd went
with it; the ranks elsewhere either stay alive or end a moment later (MPI ends the ranks of a
world that lost some, and srun reports how). slurmctld notices a lost node only at its next ping
(up to a third of ``SlurmdTimeout``, minutes on production clusters), so this asks the node's
slurmd itself, as slurmctld's ping does: a TCP connection to its port, refused or unanswered.
The pieces here are pure or one probe each; :class:`mpinb.client.slurm.SlurmEngines` runs them.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mpinb._words import ranks as _ranks

__all__ = ["NodeLoss", "TaskExit", "describe_node_loss", "parse_srun_exits", "slurmd_answers", "tasks"]

_PROBE_SECONDS = 1.0  # a slurmd on a live node accepts at once; a crashed node's never answers

# srun's report of tasks that ended badly: "srun: error: host1: tasks 0-1: Segmentation fault",
# "srun: error: host2: task 3: Killed", "srun: error: host1: task 0: Exited with exit code 3".
_SRUN_EXIT = re.compile(r"srun: error: (?P<node>[^:\s]+): tasks? (?P<tasks>[\d,\-]+): (?P<how>[^\n]+)")


@dataclass(frozen=True)
class TaskExit:
    """Tasks (MPI ranks: srun's task ids) that srun saw end on ``node``, and how."""

    node: str
    ranks: tuple[int, ...]
    how: str


@dataclass(frozen=True)
class NodeLoss:
    """What was found after a fault: nodes whose slurmd does not answer (with Slurm's word on each),
    srun's task exits, and the ranks whose engines the controller still lists."""

    lost: Mapping[str, str]  # node -> Slurm's state for it ("allocated*", "down*", ...)
    exits: Sequence[TaskExit]
    registered: Sequence[int]


def tasks(text: str) -> list[int]:
    """``"0-2,5"`` -> ``[0, 1, 2, 5]``: a task list as srun writes it."""
    found: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        found.extend(range(int(low), int(high or low) + 1))
    return found


def parse_srun_exits(text: str) -> list[TaskExit]:
    """srun's lines about tasks that ended badly, in the order it wrote them."""
    return [TaskExit(m["node"], tuple(tasks(m["tasks"])), m["how"].strip()) for m in _SRUN_EXIT.finditer(text)]


def slurmd_answers(address: str, port: int, timeout: float = _PROBE_SECONDS) -> bool:
    """Whether the slurmd at ``address:port`` accepts a connection within ``timeout`` seconds. Local."""
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


def describe_node_loss(found: NodeLoss, hosts: Sequence[str], job: str) -> str | None:
    """One report, the first death first, or None when no node is lost.

    ``hosts`` is each rank's node, in rank order. The ranks of a lost node died first (their node
    went, and with it everything that could report them); ranks srun saw end came after; the rest
    are alive when the controller still lists their engines.
    """
    if not found.lost:
        return None
    parts = []
    for node, state in found.lost.items():
        on_node = [rank for rank, host in enumerate(hosts) if host == node]
        said = f"Slurm says {state}" if state else "Slurm has not said yet"
        parts.append(f"{_ranks(on_node)} ({node}) were lost with their node: its slurmd does not answer ({said})")
    lost = {rank for rank, host in enumerate(hosts) if host in found.lost}
    ended: set[int] = set()
    for exit_ in found.exits:
        after = [rank for rank in exit_.ranks if rank not in lost and rank < len(hosts)]
        if after:
            ended.update(after)
            parts.append(f"then {_ranks(after)} ({exit_.node}) ended ({exit_.how}), as MPI ends a world that "
                         "lost ranks")
    alive = [rank for rank in range(len(hosts)) if rank not in lost and rank not in ended
             and rank in set(found.registered)]
    if alive:
        parts.append(f"{_ranks(alive)} {'is' if len(alive) == 1 else 'are'} alive")
    return "; ".join(parts) + (f"; Slurm job {job}: " if job else "; ") + (
        "cluster.restart() starts a fresh set of engines on nodes Slurm still has.")
