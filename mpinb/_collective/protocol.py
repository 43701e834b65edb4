"""The collective protocol as data: phases, events, the transition table, the arrival and its decisions.

Local; no MPI. A rank's *operation* is in one phase at a time (switching to a fresh communicator,
arriving, moving data) and leaves it with one outcome. :data:`TABLE` lists every transition an
operation may take, on which event, and whether the rank then *revokes* the generation (tells every
other rank it gave up). The channel and operation code (:mod:`.channels`, :mod:`.ops`) takes each of
its steps through :func:`step`, so a transition missing from the table is a bug that raises at
once, and the protocol model (``tests/model``) drives that same code over simulated ranks, many
delivery orders and injected faults, observing each step through its runtime's observer.

The decisions every rank takes from what it sees live here too, as pure functions of their inputs:
how the arrival is encoded and what its reduced value means (:func:`arrival_header`,
:func:`decide_arrival`), whether a revocation reaches an operation (:func:`revocation_reaches`),
what a rank that finds its generation revoked owes the others (:func:`late_arrival`), whether a
rank it waits for has left (:func:`departure`), and whether the ranks of a cell made the same
collectives (:class:`CellLedger`). :func:`diagram_markdown` draws the table. The guarantees, as
predicates over the outcomes of all ranks, are the test oracle's (``tests/model/oracle.py``).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from enum import Enum
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "ABANDONED", "ABANDONED_VOTE", "ARRIVING", "CELL", "CELL_END", "DIGEST", "DONE", "FAILED", "IDLE", "INDEX",
    "MOVING", "OUTCOMES", "PHASES", "SWITCHING", "TABLE", "TIMED_OUT", "VOTE", "VOTES", "WORDS", "Arrival",
    "CellLedger", "Outcome", "Phase", "ProtocolError", "Rule", "abandoned_header", "arrival_header",
    "decide_arrival", "departure", "diagram_markdown", "late_arrival", "outside_scope",
    "revocation_reaches", "step",
]

class _Worded(Enum):
    """A member made of ``code`` (the word the status board stores) and ``text`` (its name in the docs)."""

    def __init__(self, code: int, text: str) -> None:
        self.code, self.text = code, text


class Phase(_Worded):
    """Where an operation stands. ``rules``: the table's rules from this phase, by event (filled
    below the table: a step looks its event up there, with no hash of the member)."""

    IDLE = 0, "idle"
    ARRIVING = 1, "arriving"
    MOVING = 2, "moving data"
    SWITCHING = 3, "switching"

    def __init__(self, code: int, text: str) -> None:
        super().__init__(code, text)
        self.rules: dict[str, Rule] = {}


class Outcome(_Worded):
    """How an operation left (``code`` is never 0, which on the board means "not left")."""

    DONE = 1, "done"
    FAILED = 2, "failed"
    TIMED_OUT = 3, "timed out"
    ABANDONED = 4, "abandoned"


IDLE, ARRIVING, MOVING, SWITCHING = Phase  # module names: read on every step, and quicker than Phase.X
DONE, FAILED, TIMED_OUT, ABANDONED = Outcome
PHASES = {p: p.text for p in Phase}
OUTCOMES = {o: o.text for o in Outcome}

VOTES = 3  # integers every rank votes with in an arrival; each arrives as its maximum over the ranks
ABANDONED_VOTE = 2**62  # the first vote of an arrival made only to complete an abandoned one


class ProtocolError(RuntimeError):
    """A step the table does not allow: a bug in mpinb's collective layer."""


class Rule(NamedTuple):
    """One transition: in ``phase``, on ``event``, go to ``to`` (a phase) or leave with ``outcome``."""

    phase: Phase
    event: str
    to: Phase | None
    outcome: Outcome | None
    revokes: bool  # the rank tells every other rank it gave up on the generation
    why: str


#: Every transition an operation may take. Events: ``enter`` (the operation begins on a usable
#: generation), ``switch`` (it first waits for every rank to post the next generation), ``arrived``
#: (the arrival completed and agreed), ``finish`` (every message moved), ``fail`` (an error every rank
#: raises at the same point: a layout mismatch, a root that could not pickle), ``retire`` (the arrival
#: showed ranks of two cells, or an abandoned arrival: every rank ends the generation at the same
#: point, without a notice), ``stale`` (the operation is one another rank abandoned, come late),
#: ``revoked`` (a notice from another rank ended the generation), ``left`` (a rank waited for has left
#: the cell, exited or died), ``deadline``, ``interrupt`` (Ctrl-C), ``raise`` (any other exception
#: between two messages).
RULES: tuple[Rule, ...] = (
    Rule(IDLE, "enter", ARRIVING, None, False, "post the arrival"),
    Rule(IDLE, "switch", SWITCHING, None, False, "the generation was revoked: wait for the next one"),
    Rule(IDLE, "stale", None, ABANDONED, False, "this call is the abandoned one, come late: raise"),
    Rule(SWITCHING, "switch", SWITCHING, None, False, "the next generation was revoked too"),
    Rule(SWITCHING, "enter", ARRIVING, None, False, "the next generation is ready: post the arrival"),
    Rule(SWITCHING, "stale", None, ABANDONED, False, "this call is the abandoned one, come late: raise"),
    Rule(SWITCHING, "deadline", None, TIMED_OUT, False, "the deadline passed before every rank moved"),
    Rule(SWITCHING, "left", None, ABANDONED, False, "a rank left the cell before moving"),
    Rule(SWITCHING, "interrupt", None, ABANDONED, False, "Ctrl-C while moving"),
    Rule(SWITCHING, "raise", None, FAILED, False, "an exception while moving"),
    Rule(ARRIVING, "arrived", MOVING, None, False, "every rank arrived with the same call"),
    Rule(ARRIVING, "retire", None, ABANDONED, False, "ranks of two cells met, or an abandoned arrival"),
    Rule(ARRIVING, "revoked", None, ABANDONED, False, "another rank gave up on this generation"),
    Rule(ARRIVING, "left", None, ABANDONED, True, "a rank waited for left the cell"),
    Rule(ARRIVING, "deadline", None, TIMED_OUT, True, "the deadline passed while ranks arrived"),
    Rule(ARRIVING, "interrupt", None, ABANDONED, True, "Ctrl-C while ranks arrived"),
    Rule(ARRIVING, "raise", None, FAILED, True, "an exception while ranks arrived"),
    Rule(MOVING, "finish", None, DONE, False, "every message moved"),
    Rule(MOVING, "fail", None, FAILED, False, "an error every rank raises at this point"),
    Rule(MOVING, "revoked", None, ABANDONED, False, "another rank gave up while data moved"),
    Rule(MOVING, "left", None, ABANDONED, True, "a rank waited for died while data moved"),
    Rule(MOVING, "deadline", None, TIMED_OUT, True, "the deadline passed while data moved"),
    Rule(MOVING, "interrupt", None, ABANDONED, True, "Ctrl-C while data moved"),
    Rule(MOVING, "raise", None, FAILED, True, "an exception between two messages"),
)
TABLE: dict[tuple[Phase, str], Rule] = {(r.phase, r.event): r for r in RULES}
for _rule in RULES:
    _rule.phase.rules[_rule.event] = _rule
del _rule

def step(phase: Phase, event: str, op: Any = None,
         observer: Callable[[Any, Phase, str, Rule | None], None] | None = None) -> Rule:
    """The rule for ``event`` in ``phase``; :class:`ProtocolError` when the table has none. With
    ``observer`` (a runtime's: the protocol model watches every step), ``observer(op, phase, event,
    rule)`` first, ``rule`` ``None`` where the table has none."""
    rule = phase.rules.get(event)
    if observer is not None:
        observer(op, phase, event, rule)
    if rule is None:
        raise ProtocolError(f"mpinb's collective protocol has no step {event!r} from phase "
                            f"{phase.text!r}; this is a bug in mpinb.")
    return rule


# -- the arrival --------------------------------------------------------------------------------
# Nine int64 reduced with MIN. Each identity field is two words, its value and its negation, so
# that the reduced pair is the lowest value any rank sent and minus the highest: every rank sent the
# same value where they agree. The votes are negated, so each arrives as its maximum. The fields,
# by their first word (the writer, :func:`arrival_header`, and the reader, :func:`decide_arrival`,
# keep this order; a unit test checks both against these names):
DIGEST, CELL, INDEX = 0, 2, 4  # the operation's name and layout, its cell, its place in the sequence
VOTE = 6  # the first of the VOTES votes
WORDS = VOTE + VOTES


class Arrival(NamedTuple):
    """What a completed arrival says: ``verdict`` is one of ``"go"``, ``"abandoned"`` (completed by a
    rank that knew the generation was given up), ``"earlier cell"`` / ``"later cell"`` (ranks of two
    cells met; this rank's is the earlier / the later), ``"sequence"`` (places in the sequence differ:
    a bug) or ``"mismatch"`` (different collectives or layouts); ``votes`` are the maxima."""

    verdict: str
    votes: tuple[int, ...]
    low: int = 0  # for "sequence": the lowest and highest place met
    high: int = 0


def arrival_header(digest: int, cell: int, index: int, votes: Sequence[int]) -> np.ndarray:
    """The arrival a rank posts for the operation ``digest`` at place ``index`` of cell ``cell``."""
    v0, v1, v2 = votes
    # One list in the fields' order (DIGEST, CELL, INDEX, VOTE): a store a word cost more than the message.
    return np.array([digest, -digest, cell, -cell, index, -index, -v0, -v1, -v2], dtype=np.int64)


def abandoned_header() -> np.ndarray:
    """The arrival a rank that knows a generation is abandoned sends to complete the others'
    pending arrivals: neutral in every field of the MIN but the first vote, which says so."""
    header = np.full(WORDS, np.iinfo(np.int64).max, dtype=np.int64)
    header[VOTE] = -ABANDONED_VOTE
    return header


def decide_arrival(h: Sequence[int], cell: int) -> Arrival:
    """What every rank concludes alike from the reduced arrival ``h`` (a list of ints)."""
    (digest_low, digest_minus_high, cell_low, cell_minus_high, index_low, index_minus_high,
     minus_vote0, minus_vote1, minus_vote2) = h  # the fields' order: DIGEST, CELL, INDEX, VOTE
    votes = (-minus_vote0, -minus_vote1, -minus_vote2)
    if votes[0] >= ABANDONED_VOTE:
        return Arrival("abandoned", votes)
    if cell_low != -cell_minus_high:
        # Ranks of two cells met: every rank saw the same header and retires the generation; the
        # later cell's ranks run the operation again, the earlier cell's raise.
        return Arrival("earlier cell" if cell < -cell_minus_high else "later cell", votes)
    if index_low != -index_minus_high:
        return Arrival("sequence", votes, index_low, -index_minus_high)
    if digest_low != -digest_minus_high:
        return Arrival("mismatch", votes)
    return Arrival("go", votes)


# -- revocations --------------------------------------------------------------------------------
def revocation_reaches(note: dict[str, Any] | None, rank: int, index: int) -> bool:
    """Whether another rank's revocation ``note`` ends this rank's operation at place ``index``:
    it gave up at or before that place (an operation after it is on the same dead generation)."""
    return note is not None and note["rank"] != rank and index >= note["index"]


def of_a_later_cell(note: dict[str, Any], cell: int) -> bool:
    """Whether an operation of ``cell`` belongs to a later cell than the collective ``note``
    abandoned: then it is not that collective, and runs again on the next generation."""
    return note.get("cell", 0) < cell


def late_arrival(note: dict[str, Any], begun: int, rank: int, cell: int, digest: int,
                 scope: Any = None) -> tuple[bool, bool]:
    """A rank finds its generation revoked by ``note`` after beginning ``begun`` operations on it,
    and is about to run operation ``digest`` of ``cell`` inside the mpinb call ``scope``:
    ``(complete, stale)``.

    ``complete``: it never reached the abandoned collective, so the others' arrivals are still
    pending; it completes them with :func:`abandoned_header`, so MPI holds no request for ever.
    ``stale``: its call *is* the abandoned collective, come late (same cell, same digest), and it
    raises rather than pairing with another call -- unless the cell has ended here (a new cell's
    call) or it is another collective (this rank skipped the abandoned one). A rank that raised
    between two operations (:func:`outside_scope`) abandoned whatever came next in its mpinb call:
    any collective of that call is stale, and none outside it.
    """
    complete = begun == note["index"] - 1
    same = note["scope"] == scope if "scope" in note else note.get("digest") == digest
    stale = complete and note["rank"] != rank and note.get("cell", 0) == cell and same
    return complete, stale


def outside_scope(note: dict[str, Any], scope: Any) -> bool:
    """Whether ``note`` came from a rank that raised between two operations of an mpinb call
    (``note["scope"]``: its name and count, e.g. ``("mpinb.keras.fit", 3)``) other than the one this
    rank's operation belongs to (``scope``, ``None`` outside any): then the operation is not one that
    rank abandoned -- it left that call after its last collective, which this rank has too -- and
    runs again on the next generation, where the raising rank's next collective meets it."""
    return "scope" in note and note["scope"] != scope


# -- ranks that left ----------------------------------------------------------------------------
IDLE_AWAY = 3.0  # seconds a rank may sit idle in an earlier cell before it counts as not running this one
# ... when the client's stamp says the cell was sent to it: it is on its way (a loaded host delivers
# a cell to one engine seconds after another, CI saw 4 s), so only a cell dropped on the way, as
# ``client.abort()`` drops one, keeps it idle this long.
SENT_AWAY = 60.0


def idle_patience(sent_to: tuple[int, ...] | None, engine: int | None) -> float:
    """How long a rank on ``engine`` may sit idle in an earlier cell, for a cell the client stamped
    as sent to engines ``sent_to`` (``None``: not stamped, the engines count the cells)."""
    return SENT_AWAY if sent_to is not None and engine in sent_to else IDLE_AWAY


def departure(record: Any, cell: int, here: tuple[int, int], waited: float, now_ns: int,
              patience: float = IDLE_AWAY) -> str | None:
    """Why a rank whose cell record is ``record`` (:class:`~mpinb._collective.board.CellRecord`) will
    not enter the operation at ``here`` (generation, place) of ``cell``, or ``None``; ``patience``:
    how long it may sit idle in an earlier cell (:data:`IDLE_AWAY`, :data:`SENT_AWAY`).

    A rank's place only grows, so a rank that ended this cell, or a later one, at a place before
    ``here`` never entered this operation; one that ended it at or after ``here`` did (it may have
    finished this operation and moved on before this rank saw it complete), and is not waited for in vain.
    """
    if record is None or not cell:
        return None
    if record.ended_cell >= cell:
        if (record.ended_gen, record.ended_index) >= here:
            return None
        return f"ended its cell ({record.text})" if record.ended_cell == cell else \
            "left this cell and is running a later one"
    if record.cell > cell:
        return "is running a later cell without having run this one"
    if (not record.running and record.cell < cell and waited > patience
            and now_ns - record.ended_ns > patience * 1e9):
        idle = "" if not record.ended_ns else f" for {(now_ns - record.ended_ns) / 1e9:.0f} s"
        return f"is not running this cell (idle{idle})"
    return None


# -- a cell's collectives -----------------------------------------------------------------------
CELL_END = "mpinb cell end"  # the operation that compares the ranks' collectives when a cell ends
_SHOWN = 8  # collectives of a cell whose call sites a rank keeps, to name a divergence


class CellLedger:
    """The collectives one rank began on one communicator in the current cell: how many, the digest
    of their names in order, and the first few with the user's line that called each.

    MPI pairs collectives by order alone and each rank counts its own calls, so a rank that skipped
    a collective pairs its next same-shaped call with the others' skipped one and nothing at that
    moment can tell. When the cell ends, the ranks compare their ledgers (:data:`CELL_END`): a rank
    that made fewer or more collectives than the others meets them at a different operation, and
    every rank raises, naming what each made. Call sites stay out of the digest: a root branch
    (``bcast`` from one line on root and another elsewhere) is legal.
    """

    __slots__ = ("cell", "count", "digest", "shown", "raised")

    def __init__(self) -> None:
        self.cell, self.count, self.digest = 0, 0, 0
        self.shown: list[tuple[str, str]] = []
        self.raised = False  # a collective of this cell raised here: the divergence was already told

    def record(self, cell: int, name: str, site: Callable[[], str]) -> None:
        if cell != self.cell:
            self.cell, self.count, self.digest, self.shown, self.raised = cell, 0, 0, [], False
        self.count += 1
        self.digest = zlib.crc32(name.encode(), self.digest)  # the same in every process, unlike hash()
        if len(self.shown) < _SHOWN:
            self.shown.append((name, site()))

    def needs_check(self, cell: int) -> bool:
        """Whether this rank compares its collectives at the end of ``cell``: it made some, and none
        raised (a rank that caught a collective's error has been told; one that made none holds no
        value from one, and the others learn that it left when its cell ends)."""
        return cell == self.cell and self.count > 0 and not self.raised

    def layout(self) -> str:
        """What the cell-end operation's arrival compares: the count and the names' digest."""
        return f"{self.count} collective{'' if self.count == 1 else 's'} (digest {self.digest})"

    def describe(self) -> str:
        """``"2 collectives: allreduce (line 3), allreduce (line 5)"``: for the divergence message."""
        calls = ", ".join(f"{name} ({site})" for name, site in self.shown)
        more = f", and {self.count - len(self.shown)} more" if self.count > len(self.shown) else ""
        return f"{self.count} collective{'' if self.count == 1 else 's'}: {calls}{more}"


def diagram_markdown() -> str:
    """The table as a Mermaid state diagram in a Markdown fence, and as a table (for the docs)."""
    def node(state: Phase | Outcome) -> str:
        return state.text.replace(" ", "_")

    lines = ["```{mermaid}", "stateDiagram-v2", "    [*] --> idle"]
    for r in RULES:
        target = r.to if r.to is not None else r.outcome
        assert target is not None  # a rule goes to a phase or leaves with an outcome
        lines.append(f"    {node(r.phase)} --> {node(target)}: {r.event}{' (revokes)' if r.revokes else ''}")
    for o in Outcome:
        lines.append(f"    {node(o)} --> [*]")
    lines += ["```", "", "| phase | event | goes to | revokes | why |", "|---|---|---|---|---|"]
    for r in RULES:
        goes = r.to.text if r.to is not None else f"leaves: {r.outcome.text if r.outcome else ''}"
        lines.append(f"| {r.phase.text} | `{r.event}` | {goes} | {'yes' if r.revokes else ''} | {r.why} |")
    return "\n".join(lines) + "\n"
