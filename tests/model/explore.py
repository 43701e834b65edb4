"""Drive the simulator: a bounded exhaustive search of schedules (every combination of the first few
branching choices, the rest taking the first option), seeded random walks (every choice drawn), and
the shortest choice list that still reproduces a violation."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from protocol_sim import Scenario, run_schedule


class Chooser:
    """Follows ``prefix``, then picks ``rng``'s choice (or the first) at every later step; records
    the number of options and the pick at each branching step."""

    def __init__(self, prefix: list[int] | None = None, rng: random.Random | None = None) -> None:
        self.prefix, self.rng = list(prefix or ()), rng
        self.trace: list[tuple[int, int]] = []

    def choose(self, k: int) -> int:
        i = len(self.trace)
        if i < len(self.prefix):
            c = min(self.prefix[i], k - 1)
        else:
            c = self.rng.randrange(k) if self.rng is not None else 0
        self.trace.append((k, c))
        return c


@dataclass
class Found:
    scenario: Scenario
    violation: str
    choices: list[int]
    steps: int


@dataclass
class Tally:
    schedules: int = 0
    found: list[Found] = field(default_factory=list)
    rules: set = field(default_factory=set)


def exhaustive(scenario: Scenario, depth: int, limit: int, tally: Tally, stop_at_first: bool = True) -> None:
    """Every schedule whose first ``depth`` branching choices differ (later ones: the first option),
    at most ``limit`` of them, depth first."""
    prefix: list[int] = []
    runs = 0
    while runs < limit:
        chooser = Chooser(prefix)
        record, violation, steps = run_schedule(scenario, chooser)
        runs += 1
        tally.schedules += 1
        if record is not None:
            tally.rules |= record.rules
        if violation:
            tally.found.append(Found(scenario, violation, [c for _, c in chooser.trace], steps))
            if stop_at_first:
                return
        trace = chooser.trace[:depth]
        while trace and trace[-1][1] + 1 >= trace[-1][0]:
            trace.pop()
        if not trace:
            return
        prefix = [c for _, c in trace[:-1]] + [trace[-1][1] + 1]


def random_walks(scenario: Scenario, seeds: range, tally: Tally, stop_at_first: bool = True) -> None:
    for seed in seeds:
        chooser = Chooser(rng=random.Random(seed))
        record, violation, steps = run_schedule(scenario, chooser)
        tally.schedules += 1
        if record is not None:
            tally.rules |= record.rules
        if violation:
            tally.found.append(Found(scenario, violation, [c for _, c in chooser.trace], steps))
            if stop_at_first:
                return


def shortest(found: Found, tries: int = 200) -> Found:
    """A shorter choice list that still violates: drop the tail, then set choices to the first option."""
    best = found
    choices = list(found.choices)
    budget = tries
    # Later choices first: a violation usually needs only the early ones.
    i = len(choices) - 1
    while i >= 0 and budget > 0:
        if choices[i] != 0:
            trial = choices[:i] + [0] + choices[i + 1:]
            budget -= 1
            _, violation, steps = run_schedule(found.scenario, Chooser(trial))
            if violation:
                choices = trial
                best = Found(found.scenario, violation, _trim(trial), steps)
        i -= 1
    return Found(best.scenario, best.violation, _trim(choices), best.steps)


def _trim(choices: list[int]) -> list[int]:
    while choices and choices[-1] == 0:
        choices = choices[:-1]
    return choices


def replay(scenario: Scenario, choices: list[int]) -> str | None:
    """The violation ``choices`` reproduce on ``scenario``, or None."""
    return run_schedule(scenario, Chooser(choices))[1]


# -- jobs, for a pool of worker processes -------------------------------------------------------
def run_job(job: tuple) -> dict:
    """One unit of work: ``(mode, n, fault, layout, seed, amount, mutant)``; mode ``"exhaustive"``
    (``amount`` = (depth, limit)) or ``"walks"`` (``amount`` = number of seeds). With ``mutant``, the
    seeded bug is in place and the job stops at the first violation."""
    import contextlib
    import time

    from mutants import MUTANTS
    from scenarios import build

    mode, n, fault, layout, seed, amount, mutant = job
    scenario = build(n, fault, layout, seed)
    tally = Tally()
    t0 = time.monotonic()
    if scenario is not None:
        with MUTANTS[mutant]() if mutant else contextlib.nullcontext():
            if mode == "exhaustive":
                exhaustive(scenario, amount[0], amount[1], tally, stop_at_first=True)
            else:
                random_walks(scenario, range(seed * 100_000, seed * 100_000 + amount), tally, stop_at_first=True)
            found = [shortest(tally.found[0], tries=40)] if tally.found and not mutant else tally.found[:1]
    else:
        found = []
    return {"job": job, "schedules": tally.schedules, "seconds": time.monotonic() - t0,
            "found": [(f.scenario.name, f.violation, f.choices, f.steps) for f in found],
            "rules": sorted(tally.rules, key=lambda rule: (rule[0].code, rule[1]))}
