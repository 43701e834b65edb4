"""The programs the protocol model runs: every rank's cells, with one fault injected.

Each scenario is a notebook session on ``n`` engines: a cell of two collectives (labels say which
call is which, so a value paired with another call is seen as wrong), a fault on one rank (or on
every rank: the Stop button), and the simulator's own last cell, which checks that the next
collective works on every rank (sent before the first ends, in the ``queued`` scenarios). Host
layouts: every rank on one host (ranks see each other's board rows), every rank on its own host
(cell ends and revocations travel as notes), or two hosts.
"""

from __future__ import annotations

import copy
import random

from protocol_sim import Call, Compute, Die, Raise, RaiseBetween, Scenario

BASE = [["a", "b"]]  # the collectives of the cell, the same on every rank; the check cell comes next


def layouts(n: int) -> dict[str, list[str]]:
    half = (n + 1) // 2
    return {"one host": ["h0"] * n, "own hosts": [f"h{r}" for r in range(n)],
            "two hosts": ["h0"] * half + ["h1"] * (n - half)}


def _base(n: int) -> list[list[list]]:
    return [[[Call(label) for label in cell] for _ in range(n)] for cell in BASE]


def faults(n: int) -> list[tuple[str, object]]:
    """(name, builder) pairs: ``builder(cells, rng)`` injects the fault into ``cells`` (a copy of the
    base program) and returns extra scenario settings."""
    last = n - 1

    def skip(cells, rng):
        cells[0][last].pop(0)  # the case: every rank but one calls a, then every rank b
        return {}

    def skip_second(cells, rng):
        cells[0][last].pop(1)
        return {}

    def extra(cells, rng):
        cells[0][last].append(Call("b"))
        return {}

    def raise_before(cells, rng):
        cells[0][last].insert(rng.randrange(3), Raise())
        return {}

    def raise_after(cells, rng):
        cells[0][last].append(Raise())
        return {}

    def end_early(cells, rng):
        del cells[0][last][rng.randrange(2):]
        return {}

    def late_past_deadline(cells, rng):
        i = rng.randrange(2)
        cells[0][last].insert(i, Compute(2.0))
        cells[0][0][i] = Call(cells[0][0][i].label, timeout=0.5)
        return {}

    def many_late_past_deadline(cells, rng):
        for r in range(1, n):
            cells[0][r].insert(0, Compute(2.0 + 0.1 * r))
        cells[0][0][0] = Call("a", timeout=0.5)
        return {}

    def late_within_deadline(cells, rng):
        i = rng.randrange(2)
        cells[0][last].insert(i, Compute(0.3))
        for r in range(n):
            cells[0][r][i + (r == last)] = Call(BASE[0][i], timeout=1.0)
        return {}

    def interrupt_one(cells, rng):
        cells[0][last].insert(rng.randrange(3), Compute(0.5))
        return {"interrupts": [(0, last)]}

    def stop_button(cells, rng):
        cells[0][last].insert(rng.randrange(3), Compute(0.5))
        return {"interrupts": [(0, r) for r in range(n)]}

    def held_ctrl_c(cells, rng):
        # A loop's stop flag holds Ctrl-C back for the next vote, which never comes while a rank
        # computes elsewhere: the wait ends it after INTERRUPT_GRACE (5 s), in virtual time.
        cells[0][last].insert(rng.randrange(2), Compute(7.0))
        return {"held": [(0, 0)]}

    def stop_button_queued(cells, rng):
        settings = stop_button(cells, rng)
        return {**settings, "queued": True}

    def raise_queued(cells, rng):
        cells[0][last].insert(rng.randrange(3), Raise())
        return {"queued": True}

    def script_late_past_deadline(cells, rng):
        settings = late_past_deadline(cells, rng)
        return {**settings, "script": True, "queued": True}

    def script_raise_between(cells, rng):
        # Issue 49's case: one rank's framework raises inside an mpinb call (TensorFlow's error in
        # its train step), before, between or after the call's collectives; the others wait in, or
        # come to, the next collective.
        cells[0][last].insert(rng.randrange(3), RaiseBetween())
        return {"script": True, "queued": True, "fit": True}

    def script_every_rank_raises_between(cells, rng):
        i = rng.randrange(3)
        for r in range(n):
            cells[0][r].insert(i, RaiseBetween())
        return {"script": True, "queued": True, "fit": True}

    def different_shapes(cells, rng):
        i = rng.randrange(2)
        cells[0][last][i] = Call(BASE[0][i], size=3)
        return {}

    def raise_inside(cells, rng):
        return {"raises": [(0, rng.randrange(n))]}

    def dies_inside(cells, rng):
        return {"deaths": [(0, last)], "one host": True}

    def frozen_inside(cells, rng):
        # SIGSTOP inside a collective, the others under a deadline: it must name the frozen rank.
        for r in range(n - 1):
            cells[0][r] = [Call(label, timeout=0.5) for label in BASE[0]]
        return {"freezes": {(0, last): 2.0}}

    def frozen_inside_no_deadline(cells, rng):
        return {"freezes": {(0, rng.randrange(n)): 2.0}}

    def _after_a_failure(cells):
        # Cell 1 fails (the last rank raises before a: the generation is revoked), and in cell 2
        # rank 0 waits for the others to move to a fresh communicator while the last rank computes.
        cells[0][last].insert(0, Raise())
        cells.append([[Call("c", timeout=0.5)]] + [[Call("c")] for _ in range(n - 2)] + [[Compute(2.0), Call("c")]])

    def late_after_a_failure(cells, rng):
        _after_a_failure(cells)
        return {}

    def interrupted_after_a_failure(cells, rng):
        _after_a_failure(cells)
        cells[1][0] = [Call("c")]
        return {"interrupts": [(1, 0)]}

    def raise_inside_after_a_failure(cells, rng):
        _after_a_failure(cells)
        cells[1][0] = [Call("c")]
        return {"raises": [(1, 0)]}

    def dies(cells, rng):
        cells[0][last].insert(rng.randrange(3), Die())
        return {"one host": True}

    return [("skip", skip), ("skip the second", skip_second), ("extra", extra), ("raise before", raise_before),
            ("raise after", raise_after), ("end early", end_early), ("late past a deadline", late_past_deadline),
            ("many late past a deadline", many_late_past_deadline),
            ("late within a deadline", late_within_deadline), ("interrupt one", interrupt_one),
            ("stop button", stop_button), ("stop button, next cell queued", stop_button_queued),
            ("Ctrl-C held by a stop flag, a rank computing", held_ctrl_c),
            ("raise, next cell queued", raise_queued), ("dies", dies),
            ("different shapes", different_shapes), ("raise inside", raise_inside), ("dies inside", dies_inside),
            ("frozen inside, others under a deadline", frozen_inside),
            ("frozen inside, no deadline", frozen_inside_no_deadline),
            ("late after a failure", late_after_a_failure),
            ("interrupted after a failure", interrupted_after_a_failure),
            ("raise inside after a failure", raise_inside_after_a_failure),
            ("no fault, next cell queued", lambda cells, rng: {"queued": True}),
            ("script: late past a deadline", script_late_past_deadline),
            ("script: a rank's framework raises between two operations", script_raise_between),
            ("script: every rank's framework raises between two operations", script_every_rank_raises_between),
            ("script: no fault", lambda cells, rng: {"script": True, "queued": True}),
            ("no fault", lambda cells, rng: {})]


def build(n: int, fault: str, layout: str, seed: int) -> Scenario | None:
    """The scenario ``fault`` on ``layout`` (None where it does not apply: a death off one host, where
    MPI's launcher ends the job)."""
    rng = random.Random(seed)
    builder = dict(faults(n))[fault]
    cells = copy.deepcopy(_base(n))
    settings = builder(cells, rng)
    if settings.pop("one host", False) and layout != "one host":
        return None
    return Scenario(f"{fault}, {n} ranks, {layout}", n, layouts(n)[layout], cells, **settings)


def all_scenarios(n: int, seeds: int = 1) -> list[Scenario]:
    out = []
    for fault, _ in faults(n):
        for layout in layouts(n):
            for seed in range(seeds):
                scenario = build(n, fault, layout, seed)
                if scenario is not None:
                    out.append(scenario)
    return out
