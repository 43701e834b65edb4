"""Deadlines on mpinb's collectives: a rank that never arrives is named, with what it was doing."""

from __future__ import annotations

import io
import os
import re
import signal
import threading
import time
import warnings

import numpy as np
import pytest
from mpi4py import MPI

import mpinb
from mpinb import deadline
from mpinb.errors import CollectiveTimeout
from support.mpitools import assert_everywhere, assert_same_everywhere, raises_everywhere

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
    """A private communicator for collectives that fail on purpose."""
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
    with pytest.raises((CollectiveTimeout, mpinb.CollectiveAbandoned)) as info:
        call()
    elapsed = time.monotonic() - t0
    MPI.COMM_WORLD.Barrier()
    err = info.value
    text = str(err)
    if isinstance(err, mpinb.CollectiveAbandoned):
        # Another waiting rank's deadline passed first and it told this one.
        checks = {
            "raised within the deadline + 2 s": elapsed < expect_seconds + 2.0,
            "names who gave up on what": re.match(rf"allreduce #2 stopped on rank {RANK}: "
                                                  rf"rank \d+ gave up on allreduce #2 "
                                                  rf"\(timed out after {expect_seconds:g} s\)", text) is not None,
        }
    else:
        checks = {
            "raised within the deadline + 2 s": expect_seconds <= elapsed + 0.05 and elapsed < expect_seconds + 2.0,
            "names the operation":
                text.startswith(f"allreduce #2 timed out after {expect_seconds:g} s on rank {RANK}: "),
            "names the missing rank and its last collective": re.search(
                rf"waiting for rank {LATE} \(its last mpinb collective: bcast #1, "
                rf"entered [\d.]+ s ago, left [\d.]+ s ago;",
                text,
            )
            is not None,
            "says the next collective works": "the next collective works once every rank calls it" in text,
            "attributes": (err.operation, err.number, err.rank, list(err.missing)) == ("allreduce", 2, RANK, [LATE]),
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

    # Recovery without a restart: the next collective on the same communicator works on every rank;
    # the late rank completes the abandoned arrival, is warned, and joins the fresh generation.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (total,) = mpinb.allreduce([np.full(3, RANK + 1.0)], comm=dup, timeout=30)
    warned = any("gave up on allreduce #2" in str(w.message) for w in caught)
    assert_everywhere(np.array_equal(total, np.full(3, SIZE * (SIZE + 1) / 2)), f"got {total}")
    assert_everywhere(warned == (RANK == LATE), f"warned={warned}")
    # And the next one, with a payload of another layout.
    got = mpinb.bcast({"round": 2} if RANK == 0 else None, comm=dup, timeout=30)
    assert_everywhere(got == {"round": 2})


@pytest.mark.mpi_sizes(2, 3, 4)
def test_the_first_collective_skipped_under_a_deadline_times_out_and_recovers(dup) -> None:
    # Nothing ran on this communicator before, so mpinb is still setting up when the deadline passes:
    # the missing ranks cannot be named yet, but nobody hangs, and the set-up resumes next time.
    if RANK != LATE:
        t0 = time.monotonic()
        with pytest.raises(CollectiveTimeout, match=r"allreduce timed out after 0.5 s on rank \d+ while mpinb set up"):
            mpinb.allreduce([np.ones(4)], comm=dup, timeout=0.5)
        elapsed = time.monotonic() - t0
    else:
        elapsed = 0.0
    MPI.COMM_WORLD.Barrier()
    assert_everywhere(elapsed < 2.5, f"took {elapsed:.2f} s")
    (total,) = mpinb.allreduce([np.ones(4)], comm=dup, timeout=30)
    assert_everywhere(np.array_equal(total, np.full(4, SIZE)))


@pytest.mark.mpi_sizes(2, 3, 4)
def test_after_world_even_the_first_collective_names_the_missing_rank(dup) -> None:
    mpinb.world(dup)  # what MPICluster does when the engines start
    ok, why = True, ""
    if RANK != LATE:
        with pytest.raises((CollectiveTimeout, mpinb.CollectiveAbandoned)) as info:
            mpinb.allreduce([np.ones(4)], comm=dup, timeout=DEADLINE)
        text = str(info.value)
        ok = isinstance(info.value, mpinb.CollectiveAbandoned) or (
            f"waiting for rank {LATE} (no mpinb collective on this communicator yet" in text)
        why = text
    MPI.COMM_WORLD.Barrier()
    assert_everywhere(ok, why)
    # The late rank's next call is the same collective the others abandoned: it raises at once
    # instead of pairing with their next one, which then pairs with the late rank's next.
    late_raised = ""
    if RANK == LATE:
        t0 = time.monotonic()
        with pytest.raises(mpinb.CollectiveAbandoned) as info:
            mpinb.allreduce([np.ones(4)], comm=dup, timeout=30)
        late_raised = f"{time.monotonic() - t0:.3f} s: {info.value}"
    (total,) = mpinb.allreduce([np.full(4, RANK + 1.0)], comm=dup, timeout=30)
    assert_everywhere(np.array_equal(total, np.full(4, SIZE * (SIZE + 1) / 2)), f"got {total}")
    stale = re.match(r"[\d.]+ s: allreduce #1 on rank \d+ came too late: rank \d+ abandoned allreduce #1 "
                     r"[\d.]+ s ago \(timed out after", late_raised)
    assert_everywhere(RANK != LATE or stale is not None, late_raised)


@pytest.mark.mpi_sizes(2, 3, 4)
def test_a_deadline_on_one_rank_only_changes_nothing_on_the_wire(dup) -> None:
    # The deadline is local: with it on rank 0 only, every collective still matches.
    timeout = 30 if RANK == 0 else None
    assert_everywhere(mpinb.bcast({"x": 1} if RANK == 0 else None, comm=dup, timeout=timeout) == {"x": 1})
    rows = mpinb.gather_rows(np.full((RANK + 1, 2), RANK), root=None, comm=dup, timeout=timeout)
    assert_everywhere(rows.shape == (SIZE * (SIZE + 1) // 2, 2))
    assert_everywhere(mpinb.on_root(lambda: "root", comm=dup, timeout=timeout) == "root")


@pytest.mark.mpi_sizes(2, 3, 4)
def test_ctrl_c_stops_a_rank_waiting_in_a_collective_and_the_next_one_works(dup) -> None:
    mpinb.world(dup)
    # Rank 0 waits in an allreduce the others have not entered; SIGINT reaches every rank (as
    # cluster.interrupt() does). No deadline: only the interrupt can end the wait.
    threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        if RANK == 0:
            mpinb.allreduce([np.ones(2)], comm=dup, timeout=None)
        else:
            time.sleep(10)
    elapsed = time.monotonic() - t0
    MPI.COMM_WORLD.Barrier()
    assert_everywhere(elapsed < 3.0, f"took {elapsed:.2f} s")
    # Another collective (the others never called the abandoned one; the same one would be taken
    # for it, come late, and raise on them once).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        (total,) = mpinb.allreduce([np.ones(3)], comm=dup, timeout=30)
    assert_everywhere(np.array_equal(total, np.full(3, SIZE)))


@pytest.mark.mpi_sizes(2, 3, 4)
def test_a_rank_that_stalls_inside_a_loop_of_collectives_is_named_and_all_recover(dup) -> None:
    mpinb.world(dup)
    errors = []
    t0 = time.monotonic()
    try:
        for i in range(6):
            if RANK == LATE and i == 2:
                time.sleep(DEADLINE + 1.0)
            mpinb.allreduce([np.ones(8)], comm=dup, timeout=DEADLINE)
    except (CollectiveTimeout, mpinb.CollectiveAbandoned) as err:
        errors.append(err)
    elapsed = time.monotonic() - t0
    MPI.COMM_WORLD.Barrier()
    named = bool(errors) and (RANK == LATE or isinstance(errors[0], mpinb.CollectiveAbandoned)
                              or f"waiting for rank {LATE}" in str(errors[0]))
    assert_everywhere(named, str(errors))
    # Every rank raised within deadline + 3 s of the moment it started waiting.
    limit = (DEADLINE + 1.0 if RANK == LATE else 0.0) + DEADLINE + 3.0
    assert_everywhere(elapsed < limit, f"took {elapsed:.2f} s")
    # Within two collectives, everything works again, at the same attempt on every rank.
    worked_at = None
    for attempt in range(2):
        try:
            (total,) = mpinb.allreduce([np.ones(3)], comm=dup, timeout=30)
            worked_at = attempt
            break
        except (mpinb.CollectiveMismatchError, mpinb.CollectiveAbandoned):
            total = None
    assert_everywhere(total is not None and np.array_equal(total, np.full(3, SIZE)), f"{total}")
    assert_same_everywhere(worked_at)


def test_exceptions_cross_ranks_by_name_not_by_pickle(dup) -> None:
    def local_error():
        class LocalError(Exception):
            pass

        return LocalError("boom")

    with raises_everywhere(RuntimeError, match=r"test_deadline\..*LocalError: boom \[on (rank 0|the only rank)",
                           comm=dup) as info:
        with mpinb.raise_together(comm=dup):
            if RANK == 0:
                raise local_error()
    assert_everywhere(RANK != 0 or info.value.__cause__ is not None)
    with raises_everywhere(RuntimeError, match="LocalError: boom", comm=dup):
        mpinb.on_root(lambda: (_ for _ in ()).throw(local_error()), comm=dup)
    with raises_everywhere(KeyError, match="importable", comm=dup):
        with mpinb.raise_together(comm=dup):
            if RANK == SIZE - 1:
                raise KeyError("importable")


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
    big = mpinb.allreduce([np.ones(3 << 20, dtype=np.float32)], comm=any_comm)[0]  # reduced on its own
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
    for a, b in zip(blocking, bounded, strict=True):
        assert np.array_equal(a, b)
    assert_same_everywhere(bounded[0], comm)


@pytest.mark.parametrize("bad", [0, -1.0, "5", True, float("nan")])
def test_bad_timeouts_are_refused_before_communicating(bad, comm) -> None:
    with raises_everywhere(ValueError, match="timeout must be a positive number of seconds or None"):
        mpinb.allreduce([np.ones(2)], comm=comm, timeout=bad)


@pytest.mark.mpi_sizes(2, 3, 4)
def test_a_late_call_never_pairs_with_the_next_one(dup) -> None:
    # The case: the late rank sleeps past the deadline, then calls `a`; the others timed out
    # on `a` and went on to `b` with the same layout. `a` must not be fed `b`'s values, nor `b` `a`'s.
    mpinb.world(dup)
    if RANK == LATE:
        time.sleep(DEADLINE + 0.5)
    t0 = time.monotonic()
    try:
        a: object = float(mpinb.allreduce([np.full(1, RANK + 1.0)], comm=dup, timeout=DEADLINE)[0][0])
    except (CollectiveTimeout, mpinb.CollectiveAbandoned) as err:
        a = type(err).__name__
    late_took = time.monotonic() - t0
    b = float(mpinb.allreduce([np.full(1, 10.0 * (RANK + 1))], comm=dup, timeout=30)[0][0])
    assert_everywhere(a in ("CollectiveTimeout", "CollectiveAbandoned"), f"a = {a}")
    assert_everywhere(b == 10.0 * SIZE * (SIZE + 1) / 2, f"b = {b}")
    # The late rank learnt at once that `a` was abandoned: no second deadline.
    assert_everywhere(RANK != LATE or late_took < 0.5, f"the late call took {late_took:.2f} s")
