"""The notice tree: every member hears each note exactly once, within ceil(log2 n) hops, and no
rank sends more than ceil(log2 n) copies (simulated with a recording communicator, no MPI)."""

from __future__ import annotations

import math
from collections import deque

import pytest

from mpinb._collective import notices


class Recorder:
    """Stands in for the control communicator: ``isend`` records (source, destination, message)."""

    def __init__(self) -> None:
        self.rank = -1
        self.sent: list[tuple[int, int, tuple]] = []

    def isend(self, obj, dest, tag):  # noqa: ANN001 - mpi4py's signature
        self.sent.append((self.rank, dest, obj))
        return None


def spread(tag: int, origin: int, hosts: list[str],
           direct: tuple[int, ...] = ()) -> tuple[dict[int, int], dict[int, int], list]:
    """Deliver one note from ``origin`` as the ranks would: each receiver forwards on receipt.
    Returns each receiver's hop count, each rank's number of sends, and what the receivers read."""
    ctrl, hops, sends, bodies = Recorder(), {}, {}, []
    ctrl.rank = origin
    queue = deque((dest, msg, 1) for _, dest, msg in _sent_by(ctrl, lambda: notices.start(
        ctrl, tag, origin, "body", hosts, direct)))
    sends[origin] = len(queue)
    while queue:
        rank, msg, hop = queue.popleft()
        assert rank not in hops, f"rank {rank} received the note twice"
        hops[rank] = hop
        ctrl.rank = rank
        # _sent_by calls it at once: this iteration's msg and rank are meant, and the defaults bind them.
        out = _sent_by(ctrl, lambda msg=msg, rank=rank: bodies.append(notices.forward(ctrl, tag, msg, rank, hosts)[1]))
        sends[rank] = len(out)
        queue.extend((dest, m, hop + 1) for _, dest, m in out)
    return hops, sends, bodies


def _sent_by(ctrl: Recorder, action) -> list:  # noqa: ANN001
    before = len(ctrl.sent)
    action()
    return ctrl.sent[before:]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 8, 9, 16, 31, 32, 33, 100, 1000])
def test_a_revocation_reaches_every_other_rank_once_in_log_hops(n: int) -> None:
    bound = math.ceil(math.log2(n)) if n > 1 else 0
    for origin in sorted({0, 1 % n, n // 2, n - 1}):
        hops, sends, bodies = spread(notices.REVOKED, origin, ["h"] * n)
        assert sorted(hops) == [r for r in range(n) if r != origin]
        assert bodies == ["body"] * (n - 1)
        assert max(hops.values(), default=0) <= bound
        assert max(sends.values()) <= bound
        assert sum(sends.values()) == n - 1  # one message per receiver, as a flat fan-out


def test_a_cell_end_reaches_only_the_ranks_on_other_hosts() -> None:
    hosts = [f"node{r // 4}" for r in range(40)]  # 10 hosts of 4 ranks
    for origin in (0, 5, 39):
        hops, sends, _ = spread(notices.CELL_END, origin, hosts)
        assert sorted(hops) == [r for r in range(40) if hosts[r] != hosts[origin]]
        assert max(hops.values()) <= math.ceil(math.log2(37))
        assert all(sends.get(r, 0) == 0 for r in range(40) if hosts[r] == hosts[origin] and r != origin)
    assert spread(notices.CELL_END, 3, ["one"] * 8)[0] == {}  # one host: the board tells


def test_the_largest_subtree_is_sent_first() -> None:
    assert notices.children(0, list(range(16))) == [1, 2, 4, 8]
    assert notices.children(1, list(range(16))) == [3, 5, 9]
    assert notices.children(15, list(range(16))) == []
    # Rooted at another rank: positions count from the origin.
    group = notices.members(notices.REVOKED, (5, (), None), ["h"] * 8)
    assert group[0] == 5 and notices.children(5, group) == [0, 1, 3]


def test_ranks_sent_to_directly_are_leaves_of_no_tree() -> None:
    # Ranks 3 and 6 are outside the collective: the origin sends to them itself, and nobody
    # else sends to them or waits for them to pass the note on.
    hops, sends, bodies = spread(notices.REVOKED, 0, ["h"] * 8, direct=(3, 6))
    assert sorted(hops) == list(range(1, 8)) and hops[3] == hops[6] == 1
    assert sends[3] == sends[6] == 0 and sends[0] == 2 + 3  # two direct, three tree children of six
    assert len(bodies) == 7


def test_a_rank_asked_where_it_is_while_it_exits_is_not_killed(tmp_path) -> None:
    # faulthandler puts back the handler it replaced when the interpreter finalises: the default
    # action of SIGUSR2 kills. Unregistering here stands for the finalisation; the ask comes after.
    import subprocess
    import sys

    script = (
        "import faulthandler, os, signal, sys\n"
        "from mpinb._collective import board\n"
        f"assert board._own_where_file({str(tmp_path)!r}) is not None\n"
        "faulthandler.unregister(signal.SIGUSR2)\n"
        "os.kill(os.getpid(), signal.SIGUSR2)\n"
        "print('still here')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "still here", (done.returncode, done.stderr[-2000:])
