"""Deadlines on mpinb's collectives: a rank that never arrives is named, with what it was doing."""

from __future__ import annotations

import io
import re
import time

import numpy as np
import pytest
from mpi4py import MPI
from mpitools import assert_everywhere, assert_same_everywhere, raises_everywhere

import mpinb
from mpinb import deadline
from mpinb.errors import CollectiveTimeout

RANK = MPI.COMM_WORLD.Get_rank()
SIZE = MPI.COMM_WORLD.Get_size()
LATE = SIZE - 1  # the rank that skips a collective
DEADLINE = 1.0


@pytest.fixture(autouse=True)
def _no_default_deadline(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(deadline.ENV_VAR, raising=False)
    monkeypatch.setattr(deadline, "_setting", deadline._UNSET)
    yield


@pytest.fixture
def dup(comm):
    """A private communicator for a collective broken on purpose: it is unusable afterwards."""
    d = comm.Dup()
    yield d
    comm.Barrier()
    d.Free()


def _others_time_out(dup, call, expect_seconds: float) -> tuple[bool, str]:
    """Run ``call`` on every rank but LATE, which skips it; return (ok, why) for this rank."""
    if RANK == LATE:
        # Stay alive (MPICH ends the job when a rank exits early) until the others have given up.
        MPI.COMM_WORLD.Barrier()
        return True, ""
    t0 = time.monotonic()
    with pytest.raises(CollectiveTimeout) as info:
        call()
    elapsed = time.monotonic() - t0
    MPI.COMM_WORLD.Barrier()
    err = info.value
    text = str(err)
    others = [r for r in range(SIZE) if r != LATE]
    checks = {
        "raised within the deadline + 2 s": expect_seconds <= elapsed + 0.05 and elapsed < expect_seconds + 2.0,
        "names the operation": text.startswith(f"allreduce #2 timed out after {expect_seconds:g} s on rank {RANK}: "),
        "names the missing rank and its last collective": re.search(
            rf"waiting for rank {LATE} \(its last mpinb collective: bcast #1, entered [\d.]+ s ago, left [\d.]+ s ago\)",
            text,
        )
        is not None,
        "lists the ranks that arrived": f"; {'rank' if len(others) == 1 else 'ranks'} {', '.join(map(str, others))} arrived." in text,
        "says the communicator is unusable": "unusable" in text,
        "attributes": (err.operation, err.number, err.rank, list(err.missing), err.arrived)
        == ("allreduce", 2, RANK, [LATE], tuple(others)),
        "is a TimeoutError": isinstance(err, TimeoutError),
    }
    bad = [what for what, ok in checks.items() if not ok]
    return not bad, f"{bad} in {elapsed:.2f} s: {text}"


@pytest.mark.mpi_sizes(2, 3, 4)
@pytest.mark.parametrize("given", ["per call", "setter", "environment"])
def test_a_skipped_allreduce_times_out_naming_the_missing_rank(given: str, comm, dup, monkeypatch) -> None:
    mpinb.bcast("warm-up", comm=dup, timeout=30)  # bcast #1: every rank passes it
    if given == "setter":
        mpinb.deadline.set_collective_timeout(DEADLINE)
        kwargs = {}
    elif given == "environment":
        monkeypatch.setenv("MPINB_COLLECTIVE_TIMEOUT", str(DEADLINE))
        kwargs = {}
    else:
        kwargs = {"timeout": DEADLINE}
    ok, why = _others_time_out(dup, lambda: mpinb.allreduce([np.ones(128)], comm=dup, **kwargs), DEADLINE)
    assert_everywhere(ok, why)

    # The late rank's next mpinb collective on that communicator refuses at once, naming who gave up;
    # the others refuse too, since the abandoned allreduce can no longer be matched.
    t0 = time.monotonic()
    with pytest.raises(CollectiveTimeout) as info:
        mpinb.allreduce([np.ones(3)], comm=dup, timeout=30)
    quick = time.monotonic() - t0 < 1.0
    if RANK == LATE:
        expect = rf"allreduce cannot run on rank {LATE}: rank \d+ gave up on this communicator when allreduce #2 timed out"
    else:
        expect = rf"allreduce cannot run on rank {RANK}: this communicator is unusable since allreduce #2 timed out on rank {RANK}"
    assert_everywhere(quick and re.match(expect, str(info.value)) is not None, str(info.value))

    # Other communicators are unaffected.
    (total,) = mpinb.allreduce([np.ones(2)], comm=comm, timeout=30)
    assert_everywhere(np.array_equal(total, np.full(2, SIZE)))


@pytest.mark.mpi_sizes(2, 3, 4)
def test_the_first_collective_with_a_deadline_skipped_still_times_out(dup) -> None:
    # No status board yet on this communicator (it is created here), so the missing ranks cannot be
    # named, but nobody hangs.
    if RANK == LATE:
        MPI.COMM_WORLD.Barrier()
        assert_everywhere(True)
        return
    t0 = time.monotonic()
    with pytest.raises(CollectiveTimeout, match=r"allreduce #1 timed out after 0.5 s on rank \d+: not every rank arrived"):
        mpinb.allreduce([np.ones(4)], comm=dup, timeout=0.5)
    elapsed = time.monotonic() - t0
    MPI.COMM_WORLD.Barrier()
    assert_everywhere(elapsed < 2.5, f"took {elapsed:.2f} s")


@pytest.mark.mpi_sizes(2, 3, 4)
def test_a_late_rank_within_the_deadline_is_waited_for(comm) -> None:
    if RANK == LATE:
        time.sleep(0.3)
    (total,) = mpinb.allreduce([np.float64(RANK)], comm=comm, timeout=10)
    assert_everywhere(total == SIZE * (SIZE - 1) / 2)


@pytest.mark.mpi_sizes(2, 3, 4)
def test_timeout_none_blocks_despite_a_default(comm) -> None:
    mpinb.deadline.set_collective_timeout(0.2)
    if RANK == LATE:
        time.sleep(0.6)
    (total,) = mpinb.allreduce([np.ones(3)], comm=comm, timeout=None)
    assert_everywhere(np.array_equal(total, np.full(3, SIZE)))


def test_every_collective_works_under_a_deadline(any_comm) -> None:
    mpinb.deadline.set_collective_timeout(30)
    r, p = any_comm.Get_rank(), any_comm.Get_size()
    w = mpinb.world(any_comm)
    assert (w.rank, w.size) == (r, p)
    out = mpinb.allreduce([np.full((2, 3), r + 1.0), np.int32(r), np.array([True, r == 0])], comm=any_comm)
    assert out[0][0, 0] == p * (p + 1) / 2 and out[1] == p * (p - 1) // 2 and list(out[2]) == [p, 1]
    (mean,) = mpinb.allreduce([np.float64(r)], op="mean", comm=any_comm)
    assert mean == (p - 1) / 2
    big = mpinb.allreduce([np.ones(3 << 20, dtype=np.float32)], comm=any_comm)[0]  # segmented
    assert big.sum() == p * (3 << 20)
    got = mpinb.bcast(np.arange(5) if r == 0 else None, comm=any_comm)
    assert np.array_equal(got, np.arange(5))
    assert mpinb.bcast({"a": 1} if r == 0 else None, comm=any_comm) == {"a": 1}
    rows = np.full((r + 1, 2), r, dtype=np.float64)
    everyone = mpinb.gather_rows(rows, root=None, comm=any_comm)
    assert everyone.shape == (p * (p + 1) // 2, 2)
    on_root = mpinb.gather_rows(rows, comm=any_comm)
    assert (on_root is not None) == (r == 0)
    words = mpinb.gather_rows(np.array([f"r{r}"], dtype=object), root=None, comm=any_comm)
    assert list(words) == [f"r{q}" for q in range(p)]
    assert mpinb.on_root(lambda: 42, comm=any_comm) == 42
    with pytest.raises(KeyError, match="nope"):
        mpinb.on_root(lambda: {}["nope"], comm=any_comm)
    stream = io.StringIO()
    mpinb.rprint("hello", comm=any_comm, file=stream)
    if r == 0:
        assert stream.getvalue().count("hello") == p
    with pytest.raises(ValueError, match="empty"):
        mpinb.check_all(r != p - 1, "empty", comm=any_comm)
    mpinb.check_same(7, "seven", comm=any_comm)
    if p > 1:
        with pytest.raises(mpinb.CollectiveMismatchError, match="k must be the same"):
            mpinb.check_same(r, "k", comm=any_comm)
    with pytest.raises(KeyError):
        with mpinb.raise_together(comm=any_comm):
            if r == 0:
                raise KeyError("x")
    assert mpinb.limit_threads(comm=any_comm) >= 1
    # Every result above agrees across ranks, and the communicator still works.
    with raises_everywhere(ValueError, match="empty", comm=any_comm):
        mpinb.check_all(False, "empty", comm=any_comm)


def test_deadline_and_blocking_give_the_same_results(comm) -> None:
    x = [np.arange(7, dtype=np.float64) * (RANK + 1), np.int64(RANK)]
    blocking = mpinb.allreduce(x, comm=comm, timeout=None)
    bounded = mpinb.allreduce(x, comm=comm, timeout=30)
    for a, b in zip(blocking, bounded):
        assert np.array_equal(a, b)
    assert_same_everywhere(bounded[0], comm)


@pytest.mark.parametrize("bad", [0, -1.0, "5", True, float("nan")])
def test_bad_timeouts_are_refused_before_communicating(bad, comm) -> None:
    with raises_everywhere(ValueError, match="timeout must be a positive number of seconds or None"):
        mpinb.allreduce([np.ones(2)], comm=comm, timeout=bad)
