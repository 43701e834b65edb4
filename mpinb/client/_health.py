"""Which engines answer, and which died how: what ``MPICluster.healthy()`` and ``.deaths()`` report.

Client. Neither raises for a dead or stuck engine: each says what it found, by MPI rank.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from mpinb._engine import rank as _rank_here
from mpinb._words import ranks as _ranks
from mpinb.client._ipp import LAUNCHER_SAW_EXIT, NANNY_SAW_EXIT, engine_deaths
from mpinb.client._launcher_output import read_output, relays_of

__all__ = ["Health", "ask_every_engine", "deaths", "output_flows", "registered"]

# What every death report ends with.
_AFTER = "; MPI ended the other ranks with it: cluster.restart() starts a fresh set of engines."
_DEATH_REPORT_WAIT = 1.0  # seconds mpiexec's report (with the signal) may follow the nannies'
# Seconds the nannies' words of a death the controller already knows may take to come through the
# launcher's output (the nanny tells the controller and writes its log at the same moment; on a
# loaded CI host the cell's error was once rendered before the log arrived, naming no rank).
_DEATH_NEWS_WAIT = 3.0
_OUTPUT_PROBE_EVERY = 0.5  # seconds between probes of an engine whose output has not been heard yet


@dataclass(frozen=True)
class Health:
    """Which MPI ranks answered a probe (see :meth:`MPICluster.healthy`); true when all did.

    ``silent`` ranks have engines that did not answer in time (busy, or stuck); ``dead`` ranks have
    no engine any more (it died, and MPI ended the others of its world with it, usually).
    """

    answered: list[int]
    silent: list[int]
    seconds: float = field(default=0.0)
    dead: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.silent and not self.dead

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        if self.ok:
            return f"all {len(self.answered)} ranks answered in {self.seconds:.2f} s"
        parts = []
        if self.dead:
            parts.append(f"{_ranks(self.dead)} {'has' if len(self.dead) == 1 else 'have'} no engine any more "
                         "(it died)")
        if self.silent:
            parts.append(f"{_ranks(self.silent)} did not answer within {self.seconds:.1f} s (busy in a cell, "
                         "or blocked outside mpinb)")
        return "; ".join(parts) + "; MPICluster.restart() starts a fresh set of engines."


def registered(client: Any, ids_by_rank: list[int]) -> list[int]:
    """The ranks whose engines the controller still lists (a dead engine's nanny unregisters it)."""
    try:
        alive = set(client.ids)
    except Exception:  # noqa: BLE001 - a closed client: none
        return []
    return [rank for rank, eid in enumerate(ids_by_rank) if eid in alive]


def ask_every_engine(client: Any, ids_by_rank: list[int], timeout: float) -> Health:
    """Ask every rank's engine for its rank; report who answered within ``timeout`` seconds."""
    t0 = time.perf_counter()
    try:
        alive = set(client.ids)
    except Exception:  # noqa: BLE001 - a closed client: nothing answers
        alive = set()
    dead = [rank for rank, eid in enumerate(ids_by_rank) if eid not in alive]
    pending = {}
    for rank, eid in enumerate(ids_by_rank):
        if eid in alive:
            try:
                pending[rank] = client[eid].apply_async(_rank_here)
            except Exception:  # noqa: BLE001 - unregistered between the two looks
                dead.append(rank)
    deadline = t0 + timeout
    while time.perf_counter() < deadline and not all(ar.ready() for ar in pending.values()):
        time.sleep(0.02)
    silent = [rank for rank, ar in pending.items() if not ar.ready()]
    answered = [rank for rank, ar in pending.items() if ar.ready() and ar.successful()]
    dead += [rank for rank, ar in pending.items() if ar.ready() and not ar.successful()]
    for rank in silent:
        try:  # don't leave the probe queued behind the stuck cell
            client.abort(pending[rank].msg_ids)
        except Exception:  # noqa: BLE001
            pass
    return Health(answered=answered, silent=silent, seconds=time.perf_counter() - t0, dead=sorted(dead))


def output_flows(client: Any, ids_by_rank: list[int], timeout: float) -> None:
    """Return once every rank's engine has been heard on its output channel; raise ``RuntimeError``
    naming the ranks not heard within ``timeout`` seconds.

    An engine's output (its prints, the tracebacks of its errors, and the ``idle`` status that ends
    each request's output) reaches the client through ZMQ publish sockets, which drop what they send
    before their subscriber's subscription has arrived. An engine connects its output socket last,
    so on a loaded host it can answer requests before its output is heard: ipyparallel's
    ``execute(block=True)`` then waited forever for the lost ``idle``. Each rank not heard yet gets
    a new probe (a request that does nothing) every half second until one probe's output arrives,
    as jupyter_client waits for a kernel's IOPub before it calls the kernel ready."""
    deadline = time.monotonic() + timeout
    probes: dict[int, list[Any]] = {rank: [] for rank in range(len(ids_by_rank))}
    last_sent = dict.fromkeys(probes, -float("inf"))
    while True:
        unheard = [rank for rank, sent in probes.items() if not any(ar.wait_for_output(0) for ar in sent)]
        if not unheard:
            return
        for rank in unheard:
            for ar in probes[rank]:
                if ar.ready() and not ar.successful():
                    ar.get()  # the engine died or failed: its error, not a wait for its output
        now = time.monotonic()
        if now >= deadline:
            answered = [rank for rank in unheard if any(ar.ready() for ar in probes[rank])]
            silent = [rank for rank in unheard if rank not in answered]
            if silent:
                raise RuntimeError(f"the engines of {_ranks(silent)} did not answer within {timeout:.0f} s of "
                                   "registering: busy, or stopped by the host.")
            raise RuntimeError(
                f"the engines of {_ranks(answered)} answer requests, but their output (prints, errors, the end "
                f"of each request) has not reached this client in {timeout:.0f} s: ipyparallel's IOPub channel "
                "from the engines through the controller does not deliver (a firewall between the hosts?).")
        for rank in unheard:
            if now - last_sent[rank] >= _OUTPUT_PROBE_EVERY:
                probes[rank].append(client[ids_by_rank[rank]].apply_async(_rank_here))
                last_sent[rank] = now
        time.sleep(0.005)


def deaths(cluster: Any, ids_by_rank: list[int], engine_pids: list[int], first_pid: int | None = None,
           together: set[int] | frozenset[int] = frozenset(), known: bool = False) -> str | None:
    """Which rank died first, and how, from the engine launchers' output of ``cluster`` (an
    ``ipyparallel.Cluster``); ``None`` when they report no death. ``first_pid``: the engine process
    this host saw end first and alone, if any (:class:`mpinb.client._exits.ExitOrder`);
    ``together``: the engine processes it found ended at once instead, whose order nothing else
    tells (their nannies log in whatever order a loaded host runs them): the report names them
    all rather than guess one, unless a rank's own Python reported a fatal signal. ``known``: the
    controller already knows an engine died (it no longer lists it), so the launcher's words of it
    are on their way and are waited for (up to :data:`_DEATH_NEWS_WAIT` seconds). The signal
    a rank's own Python reported (a native abort, a segfault) and its last lines of stderr come
    from the relayed output (:mod:`mpinb.client._engine_output`)."""
    relays = relays_of(cluster)
    began, seen = time.monotonic(), None
    while True:
        text = _launcher_text(cluster, relays)
        now = time.monotonic()
        if NANNY_SAW_EXIT.search(text):
            seen = now if seen is None else seen
            # The first's own nanny line too, when this host knows which ended first: the launcher
            # may report before it, and it carries the engine's id.
            heard_first = first_pid is None or any(int(m["pid"]) == first_pid for m in NANNY_SAW_EXIT.finditer(text))
            if (LAUNCHER_SAW_EXIT.search(text) and heard_first) or now - seen > _DEATH_REPORT_WAIT:
                break
        elif not known or now - began > _DEATH_NEWS_WAIT:
            break  # no death logged (yet): nothing to report
        time.sleep(0.05)
    said = {rank: told for rank in range(len(ids_by_rank)) if (told := _last_words(relays, rank))[1]}
    if first_pid is None:
        # A rank killed by a fatal signal of its own (its faulthandler said so) died first: the
        # others MPI ended with SIGTERM or SIGKILL, which Python does not report.
        fatal = [rank for rank, (signal, _) in said.items() if signal is not None and rank < len(engine_pids)]
        if fatal:
            order = [int(m["pid"]) for m in NANNY_SAW_EXIT.finditer(text)]
            pids = [engine_pids[rank] for rank in fatal]
            first_pid = min(pids, key=lambda pid: order.index(pid) if pid in order else len(order))
    if first_pid is None and len(together) > 1 and NANNY_SAW_EXIT.search(text):
        ranks = sorted(engine_pids.index(pid) for pid in together if pid in engine_pids)
        engines = ", ".join(str(ids_by_rank[rank]) for rank in ranks)
        numbers = ", ".join(str(engine_pids[rank]) for rank in ranks)
        return (f"one of {_ranks(ranks)} (engines {engines}; pids {numbers}) died first: they ended too close "
                f"together for this host to tell which{_AFTER}")
    found: list[str] = []
    quoted: list[str] = []
    first_engine = ids_by_rank[engine_pids.index(first_pid)] if first_pid in engine_pids else None
    for engine, pid, how in engine_deaths(text, first_pid, first_engine):
        rank = ids_by_rank.index(engine) if engine in ids_by_rank else None
        if rank is None and pid in engine_pids:
            rank = engine_pids.index(pid)
        signal, lines = said.get(rank, (None, [])) if rank is not None else (None, [])
        how = signal or how
        found.append(f"rank {rank if rank is not None else '?'} (engine {engine}, pid {pid}) died"
                     + (f" ({how})" if how != "its process ended" else ""))
        if lines:
            quoted += [f"Rank {rank}'s last lines on stderr:", *(f"    {line}" for line in lines)]
    if not found:
        return None
    return "\n".join(["; ".join(found) + _AFTER, *quoted])


def _launcher_text(cluster: Any, relays: list[Any]) -> str:
    """What the engine launchers printed lately: from their relays (which keep it even when the
    disk did not), else from their files, read afresh (``get_output`` keeps its first reading)."""
    if relays:
        return "".join(relay.recent() for relay in relays)
    return "".join(read_output(getattr(launcher, "output_file", None)) for launcher in list(cluster.engines.values()))


def _last_words(relays: list[Any], rank: int) -> tuple[str | None, list[str]]:
    for relay in relays:
        signal, lines = relay.last_words(rank)
        if signal is not None or lines:
            return signal, lines
    return None, []
