"""The waiting policy: how a rank waits for MPI requests without hanging, starving or missing news.

Every wait of the collective layer is one call of :func:`poll`. It tests the requests; checks the
deadline, notices from other ranks, whether a rank it waits for has left the cell, and Ctrl-C (also
when the wait runs on a thread SIGINT never reaches); spins briefly, then yields the core.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mpinb._collective import protocol as _p
from mpinb.interrupt import INTERRUPT_GRACE

if TYPE_CHECKING:
    from mpinb._collective.interfaces import ChannelPort as Channel
    from mpinb._collective.interfaces import OpView as Op

__all__ = ["DeadlinePassed", "PeerGaveUp", "PeerLeft", "poll"]

_QUICK = 4  # tests before the wait sets up its clocks: a few microseconds, every rank already there


class DeadlinePassed(Exception):
    pass


class PeerGaveUp(Exception):
    def __init__(self, note: dict[str, Any]) -> None:
        super().__init__(note)
        self.note = note


class PeerLeft(Exception):
    """A rank this one waits for has left the cell without entering the operation."""

    def __init__(self, rank: int, what: str) -> None:
        super().__init__(rank, what)
        self.rank, self.what = rank, what


def poll(chan: Channel, requests: list[Any], deadline: float | None, *, spin: float | None = None,
         op: Op | None = None) -> None:
    """Return once every request completed. Raises DeadlinePassed, PeerGaveUp (``op``'s generation
    revoked by another rank at or before ``op``), PeerLeft (a rank it waits for ended the cell ``op``
    belongs to before entering it, or died), or KeyboardInterrupt.

    The times are the channel's :class:`~mpinb._collective.runtime.Pace`, and so are the clock, the
    sleep and the yield (its runtime's). MPI progresses a non-blocking collective only while it is
    tested, so the data phase (``spin=None``: every rank is there) keeps testing, and yields the
    core only after ``data_spin`` seconds. While ranks have yet to arrive it busy-polls for ``spin``
    seconds, then tests and yields the core (``sched_yield``: free on an idle core, given away on a
    busy one) for ``yield_for`` seconds, and only then sleeps between tests with a doubling pause
    (``first_pause`` up to ``max_pause``): a rank asleep when the last one arrives would hold up the
    operation's next message by the rest of its nap. Where ranks outnumber cores it sleeps from the
    start while ranks arrive, and yields while data move. Notices and the deadline are checked every
    ``check`` seconds (``check_data`` while data move) and after every sleep.

    Ctrl-C inside a collective loop only sets a :class:`~mpinb.interrupt.StopFlag`, so that every
    rank stops at the same iteration; but a rank stuck here waiting would never reach the vote, so
    a flag still pending after ``INTERRUPT_GRACE`` seconds of this wait ends it as a plain Ctrl-C
    does (counted from the later of the signal and the wait's start, so a rank that computed
    through the signal still votes). That includes a wait on a thread of TensorFlow's, which SIGINT never reaches.
    """
    # One request (the usual case) is tested on its own: Testall converts the list to MPI's array on
    # every call, and MPI progresses the operation only while it is tested, so a slower test is a
    # slower message (fifty 335 KiB reductions at 2 ranks: about 1 ms of 7).
    if len(requests) == 1:
        done = requests[0].Test
    else:
        testall = chan.mpi.Request.Testall
        done = lambda: testall(requests)  # noqa: E731 - one name for both tests
    for _ in range(_QUICK):
        if done():  # most waits of a short operation end here, before any bookkeeping
            return
    pace = chan.pace
    monotonic = chan.monotonic
    now = began = monotonic()
    spin_until = now + (pace.data_spin if spin is None else spin)
    # Where ranks outnumber cores, a rank yielding in a loop still takes turns on a core that a
    # computing rank needs: waiting for arrivals, it sleeps from the start.
    yield_until = now if chan.crowded else spin_until + pace.yield_for
    # Probing for notices progresses MPI too, but costs tens of microseconds while megabytes move.
    interval = pace.check if spin is not None else pace.check_data
    check_at = now + interval  # the operation looked for notices when it began
    watch_at = now  # ... but not yet whether a missing rank has left the cell
    pause, max_pause, watch = pace.first_pause, pace.max_pause, pace.watch
    gen = None if op is None else op.gen
    interrupts = chan.interrupts
    while True:
        if done():
            return
        now = monotonic()
        if now >= check_at:
            check_at = now + interval
            chan.notices()
            note = None if gen is None else gen.revoked
            if note is not None and op is not None and _p.revocation_reaches(note, chan.rank, op.index):
                raise PeerGaveUp(note)
            if deadline is not None and now >= deadline:
                if done():  # the last rank may have arrived while this one slept
                    return
                raise DeadlinePassed
            if now >= watch_at:
                watch_at = now + watch
                # In the data phase too: a rank that dies (or is stopped) after it arrived leaves
                # the others waiting for its data (a hang the protocol model found), and a wait that
                # runs long says so in every phase.
                if op is not None:
                    left = chan.departed(op)
                    if left is not None:
                        if done():
                            return
                        raise PeerLeft(*left)
                    if op.notice_due(now):
                        op.tell_waiting()
                since = interrupts.pending_since()
                if since is not None and now - max(since, began) >= INTERRUPT_GRACE:
                    interrupts.consume()
                    raise KeyboardInterrupt("interrupted (Ctrl-C) while waiting in an mpinb collective")
        if now >= spin_until or chan.crowded:
            if spin is None or now < yield_until:
                chan.sched_yield()
            else:
                chan.sleep(pause if deadline is None else min(pause, max(deadline - now, 0.0)))
                pause = min(2 * pause, max_pause)
                check_at = now  # look again after every sleep
