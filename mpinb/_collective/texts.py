"""The collective layer's error texts: what a rank says when it stops waiting, and why.

Every text names the operation by its place in the communicator's sequence (``allreduce #3``),
the ranks involved, and where each missing rank was; every one ends with what happens next.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mpinb._collective import protocol as _p
from mpinb._words import describe_mismatch, ranks
from mpinb.errors import CollectiveAbandoned, CollectiveMismatchError, CollectiveTimeout

if TYPE_CHECKING:
    from mpinb._collective.generation import Gen
    from mpinb._collective.interfaces import ChannelPort as Channel
    from mpinb._collective.interfaces import OpView as Op

NEXT = ("mpinb moves every rank to a fresh communicator, so the next collective works once every rank "
         "calls it.")


def listing(missing: dict[int, str]) -> str:
    return "; ".join(f"rank {r} ({why})" for r, why in missing.items())


def whereabouts(chan: Channel, gen: Gen | None, index: int, cell: int,
                ask: bool = True) -> tuple[dict[int, str], list[int]]:
    """The ranks not known to have arrived at ``(gen, index)``, each with where it was: in which mpinb
    collective, idle with its cell ended (and how), or where in its own code it computes (asked of
    the ranks on this host when ``ask``: up to a second)."""
    missing: dict[int, str] = {}
    arrived: list[int] = []
    computing: list[int] = []
    now = chan.time_ns()
    assert gen is not None, "an arrival is awaited on a generation"
    number = gen.number
    for r in range(chan.size):
        if r == chan.rank:
            continue
        row = None if chan.board is None else chan.board.read(r)
        record = chan.cell_record(r)
        if row is None:
            if record is not None and cell and record.ended_cell == cell:
                missing[r] = f"on host {chan.hosts[r]}, idle: its cell {record.text}"
            else:
                missing[r] = (f"on host {chan.hosts[r]}, whose status is not visible from {chan.host}"
                              if chan.hosts[r] != chan.host else "its status could not be read")
            continue
        if chan.board is not None and chan.board.stopped(r):
            # Arrived or not, it holds the operation up: its MPI progress is stopped with it.
            missing[r] = ("its process is stopped (SIGSTOP, Ctrl-Z or a debugger); its last mpinb collective: "
                          + row.describe(now))
        elif row.gen > number or (row.gen == number and row.index >= index):
            arrived.append(r)
        elif row.inside:
            missing[r] = f"it is in {row.describe(now)}"
        elif record is not None and cell and record.ended_cell == cell and not record.running:
            missing[r] = f"idle: its cell {record.text} {(now - record.ended_ns) / 1e9:.1f} s ago"
        else:
            computing.append(r)
            if row.index == 0 and row.gen == gen.number:
                since = "on this communicator yet" if gen.number == 0 else "since mpinb moved to a fresh communicator"
                missing[r] = f"no mpinb collective {since}"
            else:
                missing[r] = f"its last mpinb collective: {row.describe(now)}"
    found = chan.board.ask_where(computing) if ask and computing and chan.board is not None else {}
    for r in computing:
        missing[r] += (f"; it is computing outside mpinb, at {found[r]}" if r in found
                       else "; it is computing or blocked outside mpinb")
    return missing, arrived


def data_whereabouts(op: Op) -> dict[int, str]:
    """Every rank arrived at ``op`` and its data did not finish moving: the ranks on this host that
    are not moving it with this one (stopped, finished, or elsewhere), and each rank off this host."""
    chan = op.chan
    found: dict[int, str] = {}
    now = chan.time_ns()
    board, gen = chan.board, op.gen
    assert gen is not None, "data moves on a generation"
    for r in range(chan.size):
        if r == chan.rank:
            continue
        row = None if board is None else board.read(r)
        if board is None or row is None:
            found[r] = f"on host {chan.hosts[r]}, whose status is not visible from {chan.host}"
        elif board.stopped(r):
            found[r] = "its process is stopped (SIGSTOP, Ctrl-Z or a debugger) inside it"
        elif (row.gen, row.index) != (gen.number, op.index) or not row.inside:
            found[r] = f"no longer in it: {row.describe(now)}"
        elif not board.alive(r):
            found[r] = "its process has exited"
    return found


def timeout_error(op: Op, phase: _p.Phase) -> CollectiveTimeout:
    chan = op.chan
    head = f"{op.name} #{op.index} timed out after {op.timeout:g} s on rank {chan.rank}"
    missing: dict[int, str] = {}
    arrived: tuple[int, ...] = ()
    if phase == _p.ARRIVING:
        found, came = whereabouts(chan, op.gen, op.index, op.cell)
        missing, arrived = found, tuple(came)
        tail = (f"waiting for {listing(missing)}" if missing
                else "every rank seems to have arrived, yet the arrival did not complete")
        if arrived:
            tail += f"; {ranks(list(arrived))} arrived"
    else:
        missing = data_whereabouts(op)
        tail = ("every rank arrived, but the data did not finish moving: " + listing(missing) if missing else
                "every rank arrived, but the data did not finish moving (a rank may have stopped "
                "between the messages of this collective)")
    return CollectiveTimeout(
        f"{head}: {tail}. mpinb moves every rank to a fresh communicator, so the next collective works "
        "once every rank calls it; a rank stuck outside mpinb (its own MPI call, C code) cannot "
        "rejoin: cluster.restart() replaces the engines.",
        operation=op.name, number=op.index, timeout=op.timeout, rank=chan.rank,
        missing=missing, arrived=arrived,
    )


def interrupted_error(op: Op, phase: _p.Phase) -> KeyboardInterrupt:
    """The Stop button (or Ctrl-C) reached this rank while it waited in ``op``: where, and for whom
    (the ranks are not asked where they compute: they are being interrupted too, and say so)."""
    head = f"interrupted on rank {op.chan.rank} (the Stop button, cluster.interrupt() or Ctrl-C)"
    if phase == _p.ARRIVING:
        missing, _ = whereabouts(op.chan, op.gen, op.index, op.cell, ask=False)
        where = f"while waiting in {op.name} #{op.index}" + (f" for {listing(missing)}" if missing else "")
    elif phase == _p.MOVING:
        where = f"while the data of {op.name} #{op.index} moved (every rank had arrived)"
    else:
        where = f"in {op.name} #{op.index}, while every rank moved to a fresh communicator"
    return KeyboardInterrupt(f"{head} {where}. {NEXT}")


def abandoned_error(op: Op, note: dict[str, Any]) -> CollectiveTimeout | CollectiveAbandoned:
    rank = op.chan.rank
    if "scope" in note:
        return raised_between_error(op.name, op.index, rank, note)
    if note.get("missing") is not None:
        # Another waiting rank's deadline passed first: this rank waited for the same ranks.
        missing = {r: why for r, why in note["missing"].items() if r != rank}
        return CollectiveTimeout(
            f"{op.name} #{op.index} timed out after {note['timeout']:g} s on rank {rank}: waiting "
            f"for {listing(missing) or 'the ranks that had not arrived'} (the deadline passed first on rank "
            f"{note['rank']}, which told the others). {NEXT}",
            operation=op.name, number=op.index, timeout=note["timeout"], rank=rank, missing=missing,
        )
    return CollectiveAbandoned(
        f"{op.name} #{op.index} stopped on rank {rank}: rank {note['rank']} gave up on "
        f"{note['name']} #{note['index']} ({note['why']}). {NEXT}",
        operation=op.name, by=_cause(note), reason=note["why"], rank=rank,
    )


def _cause(note: dict[str, Any]) -> int:
    """The rank whose action ended the collective ``note`` revoked: the rank that left, where the
    revoking rank gave up because one did, else the revoking rank."""
    departed = note.get("departed")
    return note["rank"] if departed is None else departed


def left_error(op: Op, left: int, why: str) -> CollectiveAbandoned:
    return CollectiveAbandoned(
        f"{op.name} #{op.index} stopped on rank {op.chan.rank}: {why}, without entering it. {NEXT}",
        operation=op.name, by=left, reason=why, rank=op.chan.rank,
    )


def stale_error(name: str, index: int, rank: int, note: dict[str, Any], now: float) -> CollectiveAbandoned:
    """``now``: the wall clock's seconds, as the note's ``time``."""
    if "scope" in note:
        return raised_between_error(name, index, rank, note)
    ago = now - note["time"]
    return CollectiveAbandoned(
        f"{name} #{index} on rank {rank} came too late: rank {note['rank']} abandoned {note['name']} "
        f"#{note['index']} {ago:.1f} s ago ({note['why']}), and this call is that collective, so it raises "
        "instead of pairing with another call. Every rank is on a fresh communicator now: the next "
        "collective works once every rank calls it.",
        operation=name, by=_cause(note), reason=note["why"], rank=rank,
    )


def later_cell_error(op: Op) -> CollectiveAbandoned:
    return CollectiveAbandoned(
        f"{op.name} #{op.index} stopped on rank {op.chan.rank}: another rank has already left this cell and "
        "entered this collective from a later one, so the two cannot pair. That rank's collective runs "
        "again with the others in its own cell.",
        operation=op.name, reason="a rank is in a later cell", rank=op.chan.rank,
    )


def not_in_cell_error(name: str, rank: int, outside: list[int], engines: list[int | None],
                      targets: tuple[int, ...]) -> CollectiveAbandoned:
    sent = ", ".join(map(str, sorted(targets)))
    away = ", ".join(f"{r} (engine {engines[r]})" for r in outside)
    label, verb = ("rank", "is") if len(outside) == 1 else ("ranks", "are")
    return CollectiveAbandoned(
        f"{name} on rank {rank} needs every rank of its communicator, but this cell was sent to engines "
        f"{sent} only: {label} {away} {verb} not running it, so nothing was sent. "
        "Run collectives in cells that go to every engine (%%px without --targets, cluster.view).",
        operation=name, reason="ranks not running this cell", rank=rank,
    )


def switch_timeout(chan: Channel, name: str, seconds: float | None, gen: Gen, cell: int) -> CollectiveTimeout:
    previous = chan.gens[chan.active - 1].revoked if chan.active else None
    cause = "" if previous is None else (
        f" after rank {previous['rank']} gave up on {previous['name']} #{previous['index']} ({previous['why']})"
    )
    missing = whereabouts(chan, gen, 0, cell)[0]
    return CollectiveTimeout(
        f"{name} timed out after {seconds:g} s on rank {chan.rank} waiting for every rank to move to a "
        f"fresh communicator{cause}: waiting for {listing(missing) or 'unknown ranks'}. Each rank moves when "
        "it enters its next mpinb collective; the move resumes at this rank's next call.",
        operation=name, timeout=seconds, rank=chan.rank, missing=missing,
    )


def switch_left_error(name: str, rank: int, left: int, what: str) -> CollectiveAbandoned:
    return CollectiveAbandoned(
        f"{name} stopped on rank {rank} while every rank moved to a fresh communicator: rank {left} {what}, "
        "and only joins the move with its next collective. The next cell's collectives work.",
        operation=name, by=left, reason=f"rank {left} {what}", rank=rank,
    )


def setup_timeout(name: str, seconds: float, rank: int) -> CollectiveTimeout:
    return CollectiveTimeout(
        f"{name} timed out after {seconds:g} s on rank {rank} while mpinb set up its "
        f"communicators: not every rank has called an mpinb collective on this communicator yet, "
        "and before that mpinb cannot tell which ranks are missing. Call mpinb.world() on every "
        "rank first (MPICluster does when the engines start); the set-up resumes at the next call.",
        operation=name, timeout=seconds, rank=rank,
    )


def elsewhere_warning(note: dict[str, Any], rank: int) -> str:
    return (f"mpinb: rank {note['rank']} gave up on {note['name']} #{note['index']} ({note['why']}) while "
            f"rank {rank} was elsewhere; every rank moves to a fresh communicator, and this "
            "rank's next collective runs on it.")


def waiting_notice(op: Op, waited: float) -> str:
    if op.phase == _p.MOVING:
        missing = data_whereabouts(op)
        return (f"mpinb: rank {op.chan.rank} has waited {waited:.0f} s in {op.name} #{op.index}: every rank "
                f"arrived, and its data has not finished moving" + (f"; {listing(missing)}" if missing else "") + ".")
    missing, _ = whereabouts(op.chan, op.gen, op.index, op.cell)
    return (f"mpinb: rank {op.chan.rank} has waited {waited:.0f} s in {op.name} #{op.index} for "
            f"{listing(missing) or 'the other ranks'}.")


def mismatch_message(texts: list[tuple[str, str, str]], what: str | None) -> str:
    """What differs across ranks: ``texts`` has each rank's operation, layout and the collectives it
    made in this cell."""
    names = [n for n, _, _ in texts]
    if _p.CELL_END in names:
        return divergence_message(texts)
    if len(set(names)) > 1:
        return describe_mismatch("the mpinb collective called at this point", names) + (
            " Every rank must call the same mpinb collectives in the same order."
        )
    return describe_mismatch(what or f"{names[0]}'s arguments", [t for _, t, _ in texts])


def divergence_message(texts: list[tuple[str, str, str]]) -> str:
    """The ranks of a cell made different collectives: some ended the cell while others called
    another one. Each group of ranks with what it made, in order, with the lines that called them."""
    groups: dict[str, list[int]] = {}
    for rank, (name, _, made) in enumerate(texts):
        made = made or "no collective"
        doing = f"ended the cell after {made}" if name == _p.CELL_END else f"were still calling collectives ({made})"
        groups.setdefault(doing, []).append(rank)
    listing = "; ".join(f"{ranks(r)} {text}" for text, r in groups.items())
    return (f"The ranks made different collectives in this cell: {listing}. A rank that skips a "
            "collective (or makes an extra one) pairs its next call with another call of the others, "
            "so the values of this cell's collectives cannot be trusted on any rank. Every rank must "
            "call the same mpinb collectives in the same order.")


def cell_divergence_error(rank: int, other: int | None, record: Any, ledger: Any) -> CollectiveMismatchError:
    """A rank ended the cell (or left it with an error) after fewer collectives than this one."""
    if record is not None and record.ended_cell == ledger.cell:
        how = f"ended its cell ({record.text}) before this rank's last collective"
    else:
        how = "left this cell before this rank's last collective"
    who = "another rank" if other is None else f"rank {other}"
    return CollectiveMismatchError(
        f"The ranks made different collectives in this cell: {who} {how}, while rank {rank} made "
        f"{ledger.describe()}. A rank that skips a collective pairs its next call with another call of "
        "the others, so this cell's values cannot be trusted. Every rank must call the same mpinb "
        "collectives in the same order."
    )


def second_thread_error(name: str, rank: int, owner: int) -> RuntimeError:
    """A second thread of one rank called a collective while another thread's was in progress."""
    return RuntimeError(
        f"{name} was called on rank {rank} from a second thread while thread {owner} of this rank is "
        "inside another mpinb collective on the same communicator. MPI pairs a rank's collectives "
        "by their order on a communicator, so two threads calling at once would exchange wrong "
        "values or hang: call collectives from one thread at a time (join the other thread first), "
        "or give each thread its own communicator (comm.Dup() on every rank, in the same order)."
    )


def raised_between_why(error: BaseException, where: str, limit: int = 240) -> str:
    """``"raised InvalidArgumentError: Received a label value of 7 ... in mpinb.keras.fit"``: the
    error's type and the line that says what went wrong. TensorFlow's graph errors open with the
    Python frames that built the failing node and close with the node's name: both left out."""
    lines = [line.strip() for line in str(error).splitlines()]
    said = [line for line in lines if line and not line.startswith(("File ", "[[", "Detected at node"))
            and line != "Graph execution error:"]
    text = " ".join(" ".join(said[:1]).split())
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return f"raised {type(error).__name__}" + (f": {text}" if text else "") + f" in {where}"


def raised_between_error(name: str, index: int, rank: int, note: dict[str, Any]) -> CollectiveAbandoned:
    """``note``'s rank raised between two collectives of an mpinb call this rank is in (see
    :meth:`Channel.raised_between`), and will not enter ``name #index``."""
    return CollectiveAbandoned(
        f"{name} #{index} stopped on rank {rank}: rank {note['rank']} {note['why']}, between two collectives, "
        f"so it will not enter this one. {NEXT}",
        operation=name, by=note["rank"], reason=note["why"], rank=rank,
    )
