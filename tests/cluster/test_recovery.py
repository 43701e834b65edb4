"""Recovery without a restart (issue 12), on a real MPI engine cluster.

A rank that abandons an mpinb collective -- its deadline passed, or Ctrl-C -- raises; the other ranks
learn of it, and within two cells collectives work again on the same engines, their variables
intact. Four scenarios, one trial each (``MPINB_RECOVERY_TRIALS`` for more), at 2 and at 4 ranks,
one cluster per size: these runs prove the engines, launchers and MPI adapter; the orderings of the
protocol are explored by the model tier (``tests/model``).

Each cell runs its code through ``attempt`` on the engines, which records what was raised and when
(``time.time()``: one clock for the client and every engine on this host), so the assertions see
every rank's outcome, not only the first error ipyparallel reports. The timing bounds are
behavioural (a rank raises within the deadline plus 3 s), not benchmarks.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from ipyparallel.error import CompositeError
from ipyparallel.error import TimeoutError as CellTimeout

import mpinb

TRIALS = int(os.environ.get("MPINB_RECOVERY_TRIALS", "1"))  # orderings are the model tier's (tests/model)
DEADLINE = 0.5  # seconds, the collective deadline of the scenarios that set one
MARGIN = 3.0  # a rank must raise within DEADLINE + MARGIN of the moment it should
STALL = 0.9  # rank 1's sleep inside KMeans.fit: the others time out after DEADLINE, 0.4 s before it ends
HANG = 5.0  # a cell still running this long past its bound counts as hung
SETTLE = 0.3  # seconds between every rank starting the Ctrl-C cell and the interrupt

SETUP = """
import time
import numpy as np
import mpinb
import mpinb.kmeans._lloyd
from ipyparallel.datapub import publish_data
from mpinb.data import make_blobs

rank = mpinb.world().rank  # the MPI rank: engine ids need not match it
X, _ = make_blobs(20_000, n_features=4, centers=8, random_state=0)
mpinb.KMeans(8, n_init=1, random_state=0).fit(X)  # import and JIT-compile before the timed trials

def attempt(fn):
    '''Run fn and record, as `record`, what it raised and when.'''
    global record
    began = time.time()
    try:
        fn()
        err = None
    except BaseException as caught:  # KeyboardInterrupt included: it is one of the outcomes
        err = caught
    record = {
        "raised": None if err is None else f"{type(err).__module__}.{type(err).__qualname__}",
        "message": "" if err is None else str(err),
        "is_timeout": isinstance(err, mpinb.CollectiveTimeout),
        "is_interrupt": isinstance(err, KeyboardInterrupt),
        "began": began,
        "ended": time.time(),
    }
"""

# Scenario 1: only rank 0 calls the collective, under a deadline; the others compute past it (a
# rank that ends its cell instead is named at once, deadline or not: tests/cluster/test_cells.py).
SKIP = f"""
mpinb.set_collective_timeout({DEADLINE})
def _rank_0_alone():
    if rank == 0:
        mpinb.allreduce([1])
    else:
        time.sleep({DEADLINE + 0.3})
attempt(_rank_0_alone)
"""

# Scenario 2: rank 0 waits in a collective without a deadline, the others sleep; then Ctrl-C.
CTRL_C = """
mpinb.set_collective_timeout(None)
def _wait_or_sleep():
    if rank == 0:
        mpinb.allreduce([1])
    else:
        time.sleep(30)
publish_data({"started": True})  # tells the client this rank is about to wait or sleep
attempt(_wait_or_sleep)
"""

# Scenario 3: rank 1 raises, inside raise_together, a type that cannot be imported by its name.
RAISE = f"""
mpinb.set_collective_timeout(None)
def _raise_on_rank_1():
    class ShardError(Exception):  # local to this function: no module attribute names it
        pass
    # The bound only keeps a rank that fails to report from hanging the others forever.
    with mpinb.raise_together(timeout={DEADLINE + MARGIN}):
        if rank == 1:
            raise ShardError(f"shard of trial {{marker}} is bad")
attempt(_raise_on_rank_1)
"""

# Scenario 4: rank 1 stalls in one assignment step of Lloyd's loop, past the deadline.
KMEANS = f"""
mpinb.set_collective_timeout({DEADLINE})
_assign = mpinb.kmeans._lloyd.assign
stall = None
def _stalling_assign(*args, **kwargs):
    global stall
    if stall is None:  # one call: the first iteration's
        began = time.time()
        time.sleep({STALL})
        stall = (began, time.time())
    return _assign(*args, **kwargs)
if rank == 1:
    mpinb.kmeans._lloyd.assign = _stalling_assign
try:
    attempt(lambda: mpinb.KMeans(8, n_init=1, random_state=0).fit(X))
finally:
    mpinb.kmeans._lloyd.assign = _assign
record["stall"] = stall
"""

# After every scenario: without a deadline, a collective on every rank, and the trial's marker.
CHECK = """
mpinb.set_collective_timeout(None)
total = None
def _collective():
    global total
    total = int(mpinb.allreduce([1])[0])
attempt(_collective)
record["total"] = total
record["marker"] = globals().get("marker")
"""


class Engines:
    """A cluster of one size shared by the module's trials, and whether a trial left it unusable."""

    def __init__(self, cluster: Any, n: int) -> None:
        self.cluster, self.n = cluster, n
        self.broken: tuple[str, int, str] | None = None  # scenario, trial, what the recovery check saw
        self.scenario, self.index, self.marker = "", -1, ""

    def setup(self) -> None:
        self.cluster.view.execute(SETUP)

    @contextmanager
    def trial(self, scenario: str, index: int) -> Iterator[Any]:
        """Run one trial: set its marker, yield the cluster, then require that collectives recover.

        The recovery check runs even when the trial's own assertions fail. A trial after which
        collectives did not recover fails the rest of its scenario at once (a hung rank would make
        each of them wait out its timeouts); the next scenario gets restarted engines.
        """
        if self.broken is not None:
            by, at, why = self.broken
            if by == scenario:
                pytest.fail(f"not run: after {scenario} trial {at}, collectives did not recover ({why})")
            self.cluster.restart()
            self.setup()
            self.broken = None
        self.scenario, self.index, self.marker = scenario, index, f"{scenario}/{index}"
        self.cluster.view.execute(f"marker = {self.marker!r}")
        try:
            yield self.cluster
        except BaseException as err:
            why = self._recovery()
            if why is not None:
                err.add_note(f"and afterwards collectives did not recover: {why}")
            raise
        why = self._recovery()
        assert why is None, f"collectives did not recover within two cells: {why}"

    def _recovery(self) -> str | None:
        """None when, within two cells, a collective works on every rank with the marker intact:
        the first check cell succeeds everywhere, or it fails on every rank and the second succeeds
        everywhere. Otherwise what went wrong (and the cluster is marked unusable)."""
        why = None
        for cell in ("first", "second"):
            try:
                records = run_cell(self.cluster, CHECK, HANG, f"the {cell} check cell")
            except AssertionError as err:
                why = str(err)
                break
            failed = [rank for rank, rec in enumerate(records) if rec["raised"]]
            if not failed:
                why = None  # the first cell may have failed everywhere: allowed
                totals = [rec["total"] for rec in records]
                markers = [rec["marker"] for rec in records]
                if totals != [self.n] * self.n:
                    why = f"the {cell} check cell's allreduce([1]) gave {totals} by rank, not {self.n}"
                elif markers != [self.marker] * self.n:
                    why = f"engine variables lost: marker is {markers} by rank, not {self.marker!r}"
                break
            why = f"the {cell} check cell failed on {_ranks(failed)}: " + "; ".join(
                f"rank {rank}: {records[rank]['raised']}: {records[rank]['message']}" for rank in failed
            )
            if len(failed) < self.n:  # a partial failure: some ranks moved on, some did not
                break
        else:
            why = f"the check cell failed on every rank twice ({why})"
        if why is not None:
            self.broken = (self.scenario, self.index, why)
        return why


# One odd world (a middle rank, an uneven tree): the orderings at every size are the model tier's.
@pytest.fixture(scope="module", params=[3], ids=lambda n: f"{n}ranks")
def engines(request: pytest.FixtureRequest) -> Iterator[Engines]:
    with mpinb.MPICluster(n=request.param) as cluster:
        found = Engines(cluster, request.param)
        found.setup()
        yield found


@pytest.mark.parametrize("trial", range(TRIALS))
def test_a_rank_that_skips_a_collective_is_named_by_the_deadline(engines: Engines, trial: int) -> None:
    with engines.trial("skip", trial) as cluster:
        records = run_cell(cluster, SKIP, DEADLINE + MARGIN + HANG, "the cell where only rank 0 enters")
        root, others = records[0], records[1:]
        assert root["is_timeout"], f"rank 0: {root['raised']} (not CollectiveTimeout): {root['message']}"
        waited = root["ended"] - root["began"]
        # Not before the deadline either: an immediate refusal would be stale state, not a timeout.
        assert 0.5 * DEADLINE <= waited < DEADLINE + MARGIN, f"rank 0 raised after {waited:.2f} s"
        missing = set(range(1, engines.n))
        named = ranks_named(root["message"])
        assert missing <= named, f"does not name {_ranks(sorted(missing))}: {root['message']}"
        assert [rec["raised"] for rec in others] == [None] * len(others), [rec["message"] for rec in others]


@pytest.mark.parametrize("trial", range(TRIALS))
def test_ctrl_c_stops_a_rank_waiting_in_a_collective(engines: Engines, trial: int) -> None:
    with engines.trial("ctrl-c", trial) as cluster:
        ar = cluster.view.execute(CTRL_C, block=False)
        wait_until_started(ar)
        time.sleep(SETTLE)  # rank 0 is inside allreduce, the others asleep
        sent = time.time()
        cluster.interrupt()
        finish(cluster, ar, MARGIN + HANG, "the interrupted cell")
        records = cluster.pull("record")
        outcomes = [(rec["raised"], rec["message"]) for rec in records]
        assert all(rec["is_interrupt"] for rec in records), f"not KeyboardInterrupt everywhere: {outcomes}"
        late = [round(rec["ended"] - sent, 2) for rec in records]
        assert max(late) < MARGIN, f"seconds from the interrupt to KeyboardInterrupt, by rank: {late}"


@pytest.mark.parametrize("trial", range(TRIALS))
def test_raise_together_carries_an_unimportable_exception_type(engines: Engines, trial: int) -> None:
    with engines.trial("raise", trial) as cluster:
        records = run_cell(cluster, RAISE, DEADLINE + MARGIN + HANG, "the raise_together cell")
        outcomes = {(rec["raised"], rec["message"]) for rec in records}
        assert len(outcomes) == 1, f"ranks raised different things: {sorted(outcomes, key=str)}"
        raised, message = outcomes.pop()
        assert raised == "builtins.RuntimeError", f"{raised}: {message}"
        for part in ("ShardError", f"shard of trial {engines.marker} is bad"):
            assert part in message, f"{part!r} missing from {message!r}"
        assert 1 in ranks_named(message), f"does not name rank 1: {message!r}"


@pytest.mark.parametrize("trial", range(TRIALS))
def test_a_rank_stalled_inside_kmeans_fit_is_named_by_the_deadline(engines: Engines, trial: int) -> None:
    with engines.trial("kmeans", trial) as cluster:
        records = run_cell(cluster, KMEANS, STALL + DEADLINE + MARGIN + HANG, "the KMeans.fit cell")
        stall = records[1]["stall"]
        assert stall is not None, "KMeans.fit never called mpinb.kmeans._lloyd.assign on rank 1: no stall"
        stall_began, stall_ended = stall
        for rank, rec in enumerate(records):
            said = f"rank {rank}: {rec['raised']}: {rec['message']!r}"
            if rank == 1:
                # Late into a collective the others gave up on: any mpinb collective error will do.
                assert rec["is_timeout"] or str(rec["raised"]).startswith("mpinb."), said
                late = rec["ended"] - stall_ended
                assert late < DEADLINE + MARGIN, f"rank 1 raised {late:.2f} s after its stall ended"
            else:
                assert rec["is_timeout"], said
                assert 1 in ranks_named(rec["message"]), f"does not name rank 1: {said}"
                waited = rec["ended"] - stall_began
                assert waited < DEADLINE + MARGIN, f"rank {rank} raised {waited:.2f} s after rank 1 stalled"


# -- helpers ------------------------------------------------------------------------------------

_RANK_GROUP = re.compile(r"\branks?\s+(\d+(?:(?:\s*(?:,|and|-|–|to))+\s*\d+)*)")


def ranks_named(message: str) -> set[int]:
    """The ranks a message names: "rank 1", "ranks 1, 2 and 3", "ranks 1-3"."""
    named: set[int] = set()
    for group in _RANK_GROUP.findall(message):
        for lo, hi in re.findall(r"(\d+)(?:\s*(?:-|–|to)\s*(\d+))?", group):
            named.update(range(int(lo), int(hi or lo) + 1))
    return named


def run_cell(cluster: Any, code: str, timeout: float, what: str) -> list[dict[str, Any]]:
    """Execute ``code`` on every rank and return each rank's ``record``, in rank order."""
    ar = cluster.view.execute(code, block=False)
    finish(cluster, ar, timeout, what)
    return cluster.pull("record")


def finish(cluster: Any, ar: Any, timeout: float, what: str) -> None:
    """Wait for a cell; a hang or an error outside ``attempt`` becomes an AssertionError."""
    try:
        ar.get(timeout=timeout)
    except CellTimeout:
        # The view's targets are in rank order, and so are the cell's messages.
        pending = [rank for rank, mid in enumerate(ar.msg_ids) if mid in cluster.client.outstanding]
        raise AssertionError(f"{what} was still running on {_ranks(pending)} after {timeout:g} s") from None
    except CompositeError as err:
        raise AssertionError(f"{what} raised outside attempt(): {err}") from None


def wait_until_started(ar: Any, timeout: float = 10.0) -> None:
    """Until every rank has published ``started`` from the cell (ipyparallel's datapub)."""
    end = time.monotonic() + timeout
    while not all(data.get("started") for data in ar.data):
        assert time.monotonic() < end, f"the cell did not start on every rank within {timeout:g} s"
        time.sleep(0.005)


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
