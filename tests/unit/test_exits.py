"""The order in which watched processes end, as pidfds tell it (mpinb/client/_exits.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from mpinb.client._exits import ExitOrder

pytestmark = pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="pidfds are Linux's")


def _sleepers(n: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(n)]


def _until(check, seconds: float = 10.0):  # noqa: ANN001, ANN202
    give_up = time.monotonic() + seconds
    while time.monotonic() < give_up:
        found = check()
        if found is not None:
            return found
        time.sleep(0.01)
    return None


def test_the_process_that_ended_alone_first_is_named_whatever_ends_after() -> None:
    procs = _sleepers(3)
    exits = ExitOrder()
    try:
        pids = [p.pid for p in procs]
        exits.watch(pids)
        assert exits.first(pids) is None
        procs[1].send_signal(signal.SIGKILL)
        assert _until(lambda: exits.first(pids)) == pids[1]
        for p in procs:
            p.kill()
            p.wait()
        time.sleep(0.1)
        assert exits.first(pids) == pids[1]
    finally:
        exits.close()
        for p in procs:
            p.kill()
            p.wait()


def test_processes_found_ended_together_name_no_one() -> None:
    procs = _sleepers(2)
    exits = ExitOrder()
    try:
        for p in procs:  # both end (unreaped) before anything watches them
            p.send_signal(signal.SIGKILL)
        time.sleep(0.3)
        pids = [p.pid for p in procs]
        exits.watch(pids)
        assert _until(lambda: [ended for _, ended in exits._rounds] or None) == [set(pids)]  # seen, in one wake-up
        assert exits.first(pids) is None
    finally:
        exits.close()
        for p in procs:
            p.wait()


def test_close_ends_the_thread_and_a_gone_process_is_skipped() -> None:
    exits = ExitOrder()
    exits.watch([2**22 + 12345])  # no such PID: nothing to watch, no thread
    assert exits._thread is None
    procs = _sleepers(1)
    exits.watch([procs[0].pid])
    thread = exits._thread
    assert thread is not None and thread.is_alive()
    exits.close()
    assert not thread.is_alive()
    procs[0].kill()
    procs[0].wait()


def test_processes_found_ended_together_are_named_together() -> None:
    procs = _sleepers(3)
    exits = ExitOrder()
    try:
        for p in procs[:2]:
            p.send_signal(signal.SIGKILL)
        time.sleep(0.3)
        pids = [p.pid for p in procs]
        exits.watch(pids)
        assert _until(lambda: [ended for _, ended in exits._rounds] or None) == [set(pids[:2])]
        assert exits.together(pids) == set(pids[:2])
        assert exits.together(pids[1:]) == set()  # of those asked about, one alone ended first
        assert exits.first(pids[1:]) == pids[1]
    finally:
        exits.close()
        for p in procs:
            p.kill()
            p.wait()


def test_an_end_that_another_follows_closely_is_not_told_apart() -> None:
    # CI, MPICH on a loaded host: the launcher killed rank 0 when rank 1 closed its files, and rank
    # 0 was called ended a moment before rank 1. Ends within TOGETHER seconds count as together.
    from mpinb.client._exits import TOGETHER

    procs = _sleepers(3)
    exits = ExitOrder()
    try:
        pids = [p.pid for p in procs]
        exits.watch(pids)
        procs[0].send_signal(signal.SIGKILL)
        time.sleep(TOGETHER / 5)
        procs[1].send_signal(signal.SIGKILL)
        assert exits.first(pids) is None
        assert exits.together(pids) == set(pids[:2])
        time.sleep(TOGETHER * 2)
        procs[2].send_signal(signal.SIGKILL)  # well after: not among them
        time.sleep(0.2)
        assert exits.together(pids) == set(pids[:2]) and exits.first(pids[1:]) == pids[1]
    finally:
        exits.close()
        for p in procs:
            p.kill()
            p.wait()


def test_a_look_now_stands_in_for_a_thread_that_has_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    # A loaded host may not run the watching thread before deaths() asks: what has ended at the
    # moment of asking is then the first wake-up, alone or together.
    import mpinb.client._exits as exits_module

    class Asleep:
        def __init__(self, **_: object) -> None:
            pass

        def start(self) -> None:
            pass

        def join(self, timeout: float | None = None) -> None:
            pass

    monkeypatch.setattr(exits_module.threading, "Thread", Asleep)
    procs = _sleepers(3)
    exits = ExitOrder()
    try:
        pids = [p.pid for p in procs]
        exits.watch(pids)
        assert exits.first(pids) is None and exits._rounds == []
        procs[2].send_signal(signal.SIGKILL)
        assert _until(lambda: exits.first(pids)) == pids[2]
        for p in procs[:2]:
            p.send_signal(signal.SIGKILL)
        time.sleep(0.3)
        assert exits.first(pids) == pids[2] and exits.together(pids) == set()
        assert exits.together(pids[:2]) == set(pids[:2])  # asked alone about these two: found together
    finally:
        exits.close()
        for p in procs:
            p.kill()
            p.wait()
