"""Recovery at 16 ranks (issue 23), on a real MPI engine cluster sharing a few cores (MPICH yielding).

Revocations travel along a tree (:mod:`mpinb._collective.notices`), so at 16 ranks most ranks hear of
one through another rank that passes it on. Three scenarios, no deadline anywhere: a rank skips a
collective the others enter (its cell ends), Ctrl-C while every rank but one waits in a collective,
a rank that raises before a collective, and -- what only the tree can end -- a deadline on one
rank while the others wait with none. Each time every rank stops within a few seconds, the
ones waiting name the rank that left, and the next cell's collective gives the right value on every
rank with the engines' variables intact. One cluster for the module.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

import mpinb
from support.cells import ATTEMPT, errors_by_rank

N = 16
ODD = 11  # the rank that skips, sleeps or raises: deep in most ranks' trees, not a leaf of rank 0's
BOUND = 8.0  # seconds: every waiting rank stops within this (16 ranks share 2 cores), not a benchmark
HANG = 60.0  # a cell still running this long counts as hung

SETUP = """
import time
import numpy as np
import mpinb
from ipyparallel.datapub import publish_data

mpinb.set_collective_timeout(None)
rank = mpinb.world().rank
mpinb.allreduce([np.ones(1)])  # the channel's set-up, before the trials
""" + ATTEMPT

ENTER = "attempt(lambda: mpinb.allreduce([np.full(3, rank + 1.0)]))"
SKIP = f"record = None\nif rank != {ODD}:\n    {ENTER}\n"
ERROR = f"record = None\nif rank == {ODD}:\n    1 / 0\n{ENTER}\n"
# A rank that hears of another's interrupt before its own SIGINT lands raises CollectiveAbandoned;
# it waits here for its own signal, which would otherwise hit the engine after the cell, while it
# replies (the client would then wait for that reply for ever). Signals reach 16 processes on 2 busy
# cores tens of milliseconds apart.
INTERRUPT = f"""
record = None
publish_data({{"started": True}})
try:
    if rank == {ODD}:
        attempt(lambda: time.sleep(60))
    else:
        {ENTER}
    if record["raised"] != "KeyboardInterrupt":
        time.sleep(5)
except KeyboardInterrupt:
    pass  # this rank's own SIGINT, come after its outcome was recorded (16 ranks share 2 cores)
"""
# Rank 0 alone has a deadline; rank ODD is late; the others wait with none, and are still in the
# cell, so only rank 0's revocation -- passed on from rank to rank -- can end their wait.
DEADLINE = f"""
record = None
def _deadline_on_rank_0():
    if rank == {ODD}:
        time.sleep(3.0)
    mpinb.allreduce([np.full(3, rank + 1.0)], timeout=0.5 if rank == 0 else None)
sent = dict(mpinb._collective.notices.sent)
attempt(_deadline_on_rank_0)
sent = {{tag: n - sent[tag] for tag, n in mpinb._collective.notices.sent.items()}}
"""
CHECK = "total = float(mpinb.allreduce([np.full(2, rank + 1.0)])[0][0])"


class Engines:
    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster

    def wait(self, ar: Any) -> dict[int, str]:
        """Wait for a cell on every rank; each failing rank's error, by rank."""
        return errors_by_rank(self.cluster, ar, HANG)

    def run(self, code: str) -> tuple[dict[int, str], list[dict[str, Any] | None]]:
        errors = self.wait(self.cluster.view.execute(code, block=False))
        return errors, self.cluster.pull("record")

    def recovered(self, marker: str) -> None:
        """The next collective gives the right value on every rank; the engines kept their variables."""
        errors = self.wait(self.cluster.view.execute(CHECK, block=False))
        assert not errors, f"the check cell failed: {errors}"
        assert self.cluster.pull("total") == [N * (N + 1) / 2] * N
        assert self.cluster.pull("marker") == [marker] * N


@pytest.fixture(scope="module")
def engines() -> Iterator[Engines]:
    with mpinb.MPICluster(n=N) as cluster:
        errors = Engines(cluster).wait(cluster.view.execute(SETUP, block=False))
        assert not errors, errors
        yield Engines(cluster)


def _mark(engines: Engines, name: str) -> str:
    engines.cluster.view.execute(f"marker = {name!r}", block=True)
    return name


def _named_promptly(records: list[Any], what: str) -> None:
    """Every rank but ODD raised CollectiveAbandoned naming ODD and ``what``, within BOUND."""
    for rank, rec in enumerate(records):
        if rank == ODD:
            continue
        said = f"rank {rank}: {rec}"
        assert rec is not None and rec["raised"] == "CollectiveAbandoned", said
        assert f"rank {ODD} " in rec["message"] and what in rec["message"], said
        assert rec["ended"] - rec["began"] < BOUND, f"rank {rank} waited {rec['ended'] - rec['began']:.2f} s"


def test_a_rank_that_skips_a_collective_is_named_by_every_other_rank(engines: Engines) -> None:
    marker = _mark(engines, "skip")
    errors, records = engines.run(SKIP)
    assert not errors, errors
    assert records[ODD] is None
    _named_promptly(records, "ended its cell (ended normally)")
    engines.recovered(marker)


def test_ctrl_c_stops_every_rank_of_a_collective(engines: Engines) -> None:
    marker = _mark(engines, "interrupt")
    ar = engines.cluster.view.execute(INTERRUPT, block=False)
    end = time.monotonic() + HANG
    while not all(data.get("started") for data in ar.data):
        assert time.monotonic() < end, "the cell did not start on every rank"
        time.sleep(0.01)
    time.sleep(1.0)  # 15 ranks inside the allreduce, rank ODD asleep
    sent = time.time()
    engines.cluster.interrupt()
    errors = engines.wait(ar)
    assert not errors, errors
    records = engines.cluster.pull("record")
    for rank, rec in enumerate(records):
        said = f"rank {rank}: {rec}"
        assert rec is not None and rec["raised"] in ("KeyboardInterrupt", "CollectiveAbandoned"), said
        assert rec["ended"] - sent < BOUND, f"rank {rank} stopped {rec['ended'] - sent:.2f} s after Ctrl-C"
    engines.recovered(marker)


def test_a_rank_that_raises_before_a_collective_is_named_by_every_other_rank(engines: Engines) -> None:
    marker = _mark(engines, "error")
    errors, records = engines.run(ERROR)
    assert set(errors) == {ODD} and errors[ODD].startswith("ZeroDivisionError"), errors
    _named_promptly(records, "ZeroDivisionError")
    engines.recovered(marker)


def test_a_deadline_on_one_rank_reaches_every_waiting_rank_of_its_host_directly(engines: Engines) -> None:
    from mpinb._collective import notices

    marker = _mark(engines, "deadline")
    errors, records = engines.run(DEADLINE)
    assert not errors, errors
    assert records[0]["raised"] == "CollectiveTimeout", records[0]
    assert records[ODD]["raised"] == "CollectiveAbandoned", records[ODD]  # late: it raises on entry
    gave_up = records[0]["ended"]
    for rank, rec in enumerate(records):
        if rank not in (0, ODD):
            said = f"rank {rank}: {rec}"
            # Rank 0's timeout, told to the others: they raise it as theirs, naming rank 0.
            assert rec["raised"] == "CollectiveTimeout" and "passed first on rank 0," in rec["message"], said
            assert rec["ended"] - gave_up < BOUND, f"rank {rank} raised {rec['ended'] - gave_up:.2f} s after rank 0"
    sent = [s[notices.REVOKED] for s in engines.cluster.pull("sent")]
    assert sum(sent) == N - 1, sent  # one revocation, one note to each other rank
    # Every rank here shares rank 0's host: rank 0 tells each directly, so none waits on a relay that
    # may be stopped or idle (the tree spans the other hosts; the protocol model checks it).
    assert sent[0] == N - 1, sent
    engines.recovered(marker)


def test_an_idle_engine_passes_notes_on_between_cells(engines: Engines) -> None:
    """A rank relays a note when it looks at its notices: an engine idle between cells looks from
    its event loop (a rank on another host that a note's tree runs through may be idle)."""
    engines.cluster.view.execute(
        "_chan = mpinb._collective.channel()\nlooks = []\n"
        "_chan.notices = (lambda _f=_chan.notices: (looks.append(time.monotonic()), _f())[1])\n"
        "in_cell = time.monotonic(); time.sleep(0.5); in_cell = (in_cell, time.monotonic())", block=True)
    time.sleep(1.0)
    engines.cluster.view.execute("del _chan.notices\nidle = list(looks)", block=True)
    idle, in_cell = engines.cluster.pull("idle"), engines.cluster.pull("in_cell")
    for rank, (looks, (began, ended)) in enumerate(zip(idle, in_cell, strict=True)):
        assert not [t for t in looks if began <= t <= ended], f"rank {rank} looked during a cell"
        assert len([t for t in looks if t > ended]) >= 5, f"rank {rank} looked {len(looks)} times, idle 1 s"
