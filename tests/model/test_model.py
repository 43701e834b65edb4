"""The protocol model tier: mpinb's collective layer driven over many orderings, with faults.

``python3 tests/run.py --tier model``. The simulator (:mod:`protocol_sim`) runs the real layer over
simulated ranks; this file explores schedules of every fault scenario (:mod:`scenarios`) and checks
that every seeded bug (:mod:`mutants`) is caught. The search is a sample, not every ordering: at 2
and 3 ranks a bounded exhaustive search (every combination of the first 7, resp. 6, branching
choices, depth first, later choices taking the first option, up to a budget of schedules per
scenario; :func:`explore.exhaustive`), then seeded random walks at 4, 5, 8 and 16 ranks (every
choice drawn; :func:`explore.random_walks`). An ordering that differs only after the depth is met
at 2 and 3 ranks only if a walk at 4 or more happens to make it. Each schedule runs within a budget
of steps and virtual time (see :mod:`protocol_sim`), so a bug that makes the protocol slow is
reported as a violation, not as the tier's timeout. It ends with one line:
``model: N schedules, 0 violations, M of M mutants caught``.

``MPINB_MODEL_SCHEDULES`` scales the search (default 100,000 schedules asked for: the exhaustive
searches end early where a small world has fewer orderings); the work is spread over a process per
core. A whole-suite run (``python3 tests/run.py``) asks for 12,000, to keep the suite within its 15
minutes on two cores; every mutant is sought either way.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import time

import pytest
from explore import Chooser, replay, run_job
from mutants import MUTANTS
from protocol_sim import run_schedule
from scenarios import build, faults, layouts

import mpinb._collective.protocol as _p

# The exploration is one long test: on a slow 2-core machine it takes a few minutes.
pytestmark = pytest.mark.timeout(900)

SUMMARY: dict = {"schedules": 0, "violations": 0, "mutants": 0, "caught": 0, "by_size": {}, "rules": set()}
TARGET = int(os.environ.get("MPINB_MODEL_SCHEDULES", "100000"))


def _pool_map(jobs: list[tuple]) -> list[dict]:
    workers = max(1, min(len(os.sched_getaffinity(0)), 8))
    if workers == 1:
        return [run_job(job) for job in jobs]
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        return pool.map(run_job, jobs, chunksize=1)


def _exhaustive_jobs(target: int) -> list[tuple]:
    """Exhaustive search at 2 and 3 ranks (up to 30 and 35% of the target), over every fault and
    host layout."""
    jobs: list[tuple] = []
    for n, share, depth in ((2, 0.3, 7), (3, 0.35, 6)):
        scenarios = [(f, lay) for f, _ in faults(n) for lay in layouts(n) if build(n, f, lay, 0) is not None]
        limit = max(1, int(target * share / len(scenarios)))
        jobs += [("exhaustive", n, f, lay, 0, (depth, limit), None) for f, lay in scenarios]
    return jobs


def _walk_jobs(count: int) -> list[tuple]:
    """About ``count`` random walks at 4, 5, 8 and 16 ranks, over every fault and host layout."""
    jobs: list[tuple] = []
    big = [(n, f, lay) for n in (4, 5, 8, 16) for f, _ in faults(n) for lay in layouts(n)
           if build(n, f, lay, 0) is not None]
    # Larger worlds cost more per schedule (2.3, 3.2, 6.1 and 19 ms here at 4, 5, 8 and 16 ranks)
    # and add few orderings that smaller ones lack: the tree of notices, many hosts.
    weights = {4: 16, 5: 4, 8: 2, 16: 1}
    total = sum(weights[n] for n, _, _ in big)
    for n, f, lay in big:
        per_seed = math.ceil(count * weights[n] / total / 4)  # rounded up: at least ``count`` in all
        for seed in range(4):  # the fault's own random choices (where it strikes)
            jobs.append(("walks", n, f, lay, seed + 1, per_seed, None))
    return jobs


@pytest.fixture(scope="module")
def exploration() -> list[tuple]:
    """The exploration, run once for the tests that read it, whichever runs first or alone: the
    violations found, as (job, finding) pairs; the rules taken go to ``SUMMARY["rules"]``."""
    t0 = time.monotonic()
    results = _pool_map(_exhaustive_jobs(TARGET))
    # The exhaustive searches end early where a small world has fewer orderings: the walks make up
    # the rest of the target (at least 35 % of it).
    done = sum(r["schedules"] for r in results)
    results += _pool_map(_walk_jobs(max(int(TARGET * 0.35), TARGET - done)))
    found = [(r["job"], f) for r in results for f in r["found"]]
    for r in results:
        n = r["job"][1]
        SUMMARY["by_size"][n] = SUMMARY["by_size"].get(n, 0) + r["schedules"]
        SUMMARY["rules"] |= {tuple(x) for x in r["rules"]}
    SUMMARY["schedules"] += sum(r["schedules"] for r in results)
    SUMMARY["violations"] += len(found)
    SUMMARY["seconds"] = time.monotonic() - t0
    return found


def test_the_protocol_holds_in_every_explored_schedule(exploration: list[tuple]) -> None:
    found = exploration
    report = "\n".join(f"[{name}] {violation}\n    replay: replay(build{job[1:5]}, {choices})"
                       for job, (name, violation, choices, _) in found[:10])
    assert not found, f"{len(found)} scenario(s) violate the protocol's guarantees:\n{report}"


def test_every_rule_of_the_table_is_exercised(exploration: list[tuple]) -> None:
    unused = [f"{r.phase.text} --{r.event}-->" for r in _p.RULES if (r.phase, r.event) not in SUMMARY["rules"]]
    assert not unused, f"rules of the protocol table no explored schedule took: {unused}"


@pytest.mark.parametrize("mutant", list(MUTANTS))
def test_the_model_catches(mutant: str) -> None:
    """Random walks over every scenario at 3 and 4 ranks, with the bug in place, until one violates."""
    t0 = time.monotonic()
    SUMMARY["mutants"] += 1
    jobs = [("walks", n, f, lay, 1, 6, mutant) for n in (3, 4) for f, _ in faults(n) for lay in layouts(n)
            if build(n, f, lay, 0) is not None]
    caught = None
    # In rounds, so that an early catch stops the search.
    for start in range(0, len(jobs), 16):
        results = _pool_map(jobs[start:start + 16])
        hits = [f for r in results for f in r["found"]]
        SUMMARY["schedules_mutants"] = SUMMARY.get("schedules_mutants", 0) + sum(r["schedules"] for r in results)
        if hits:
            caught = hits[0]
            break
    SUMMARY.setdefault("mutant_times", {})[mutant] = (time.monotonic() - t0, caught and caught[0])
    assert caught is not None, f"no explored schedule noticed the mutant {mutant!r}"
    SUMMARY["caught"] += 1


# -- schedules the model found, replayed as unit tests --------------------------------------------
def test_a_rank_that_finished_and_moved_on_is_not_taken_for_one_that_left() -> None:
    """Found by the model: with the next cell queued, rank 0 finished the cell-end operation and
    began the next cell before rank 2 saw that operation complete; rank 2 took rank 0 for a rank that
    had left without entering, gave up, and failed its cell. The rule now compares places, not cells."""
    scenario = build(3, "no fault, next cell queued", "one host", 0)
    assert replay(scenario, []) is None
    with MUTANTS["a rank in a later cell taken for one that left"]():
        assert replay(scenario, []) is not None


def test_a_rank_never_moves_data_on_an_arrival_completed_for_an_abandoned_operation() -> None:
    """Two ranks come late to a collective rank 0 gave up on; one has read the notice and completes
    the arrival for the others, the other has not: the abandoned vote keeps it from moving data."""
    scenario = build(3, "many late past a deadline", "two hosts", 0)
    assert replay(scenario, ABANDONED_RACE) is None
    with MUTANTS["the abandoned arrival without its abandoned vote"]():
        assert "moved data" in (replay(scenario, ABANDONED_RACE) or "")


def test_a_skipped_collective_fails_every_rank_of_its_cell() -> None:
    """Issue 33's case: every rank but the last calls a, then every rank b. The last rank's b paired
    with the others' a; the cell-end comparison makes every rank's cell fail, naming the divergence."""
    scenario = build(3, "skip", "one host", 0)
    log: list[str] = []
    record, violation, _ = run_schedule(scenario, Chooser([]), log)
    assert violation is None, violation
    assert all(record.cell_errors[r, 1] for r in range(3))
    assert all("different collectives in this cell" in record.errors[r, 1] for r in range(3))
    with MUTANTS["the skipped-collective check turned off"]():
        assert "wrong value" in (replay(scenario, []) or "")


ABANDONED_RACE: list[int] = []  # the default schedule (found again by random walks and shortened)


def test_a_rank_that_dies_while_data_move_is_named_to_the_others() -> None:
    """Found by the model: rank 1 died after its arrival; rank 0, in the data phase, looked for no
    departed rank there and waited forever. It now raises within the bound, naming the death."""
    scenario = build(2, "dies inside", "one host", 0)
    record, violation, _ = run_schedule(scenario, Chooser([]), [])
    assert violation is None, violation
    assert record.cell_errors[0, 1] and "died" in record.errors[0, 1], record.errors


def test_a_rank_that_gave_up_while_moving_to_a_fresh_communicator_has_left() -> None:
    """Found by the model: after a failed cell, rank 0 timed out in the next cell while waiting for
    the others to move to a fresh communicator; rank 1, waiting for the same move, did not take it
    for a rank that had left (its place had not grown) and waited for the late rank 2 instead."""
    scenario = build(3, "late after a failure", "one host", 0)
    assert replay(scenario, [0, 0, 0, 1]) is None


# -- found by the invariants of time and of truth (issue 50) ----------------------------------------
def test_a_rank_that_raised_after_the_last_collective_fails_no_other_rank() -> None:
    """Found by the model at 2 ranks: rank 1 raised after the cell's last collective, and rank 0's
    cell-end comparison, told by its own wait that rank 1 had left, read the revoked generation one
    too early and raised a false CollectiveMismatchError. Now every other rank returns; at 4 ranks on
    their own hosts too, where the revocation can arrive before the raising rank's cell-end note."""
    for n, layout in ((2, "one host"), (4, "own hosts")):
        scenario = build(n, "raise after", layout, 0)
        record, violation, _ = run_schedule(scenario, Chooser([]))
        assert violation is None, violation
        assert record.cell_errors[n - 1, 1] and not any(record.cell_errors[r, 1] for r in range(n - 1))
    with MUTANTS["a false mismatch when a rank raised after the cell's last collective"]():
        assert "CollectiveMismatchError" in (replay(build(2, "raise after", "one host", 0), []) or "")


def test_a_rank_that_raised_inside_the_last_collective_after_its_data_moved_is_no_divergence() -> None:
    """Found by the model at 4 ranks (100,000 schedules): rank 1 raised inside b once its data had
    moved, revoking it; the others completed b and moved to a fresh communicator for the cell-end
    comparison. Seeing there that rank 1 had ended its cell (or rank 0, which had ended its own after
    its comparison was given up), they took that rank's place on the old communicator for fewer
    collectives: a false CollectiveMismatchError. A place at or after this rank's last one is now no
    divergence; no cell ends with a mismatch."""
    scenario = build(4, "raise inside", "one host", 1)
    for choices in RAISED_INSIDE_B:
        record, violation, _ = run_schedule(scenario, Chooser(choices))
        assert violation is None, violation
        assert not any("CollectiveMismatchError" in record.errors.get((r, 1), "") for r in range(4)), record.errors


RAISED_INSIDE_B = [[4, 3, 1, 0, 2, 5, 0, 1, 1, 1, 1, 1, 4, 0, 3, 4, 0, 4, 0, 2],
                   [4, 3, 1, 0, 2, 5, 0, 1, 1, 1, 1, 1, 4, 0, 3, 4, 7, 4, 0, 2, 1, 1, 1]]


def test_a_timeout_names_a_rank_stopped_while_the_others_arrive() -> None:
    """Found by the model at 2 ranks: rank 1, stopped (SIGSTOP) after posting its arrival, looked
    arrived, and rank 0's timeout said "every rank seems to have arrived". It now names the stop."""
    scenario = build(2, "frozen inside, others under a deadline", "one host", 0)
    record, violation, _ = run_schedule(scenario, Chooser([]))
    assert violation is None, violation
    assert "rank 1 (its process is stopped (SIGSTOP" in record.errors[0, 1], record.errors[0, 1]
    with MUTANTS["a stopped rank unnamed in a timeout while ranks arrive"]():
        assert "does not name stopped rank(s) [1]" in (replay(scenario, []) or "")


def test_the_move_to_a_fresh_communicator_ends_by_the_deadline() -> None:
    scenario = build(2, "late after a failure", "one host", 0)
    assert replay(scenario, []) is None
    with MUTANTS["the move to a fresh communicator ignoring the deadline"]():
        assert "after its deadline (slack" in (replay(scenario, []) or "")


def test_a_revocation_reaches_a_rank_waiting_at_the_place_given_up() -> None:
    scenario = build(2, "late past a deadline", "own hosts", 0)
    assert replay(scenario, []) is None
    with MUTANTS["a revocation reaching one place too few (> for >=)"]():
        assert "after rank 0 revoked it at #2 (bound 1 s)" in (replay(scenario, []) or "")


def test_a_schedule_past_its_budget_is_a_violation() -> None:
    """Without the tree, a rank whose host's board says a revocation is due waits up to 5 s for it
    in 10 us sleeps: about 500,000 steps a rank. The run stops at its budget (1,000 steps a rank)."""
    scenario, choices = build(4, "raise after", "own hosts", 0), [0] * 13 + [3, 2]
    assert replay(scenario, choices) is None
    with MUTANTS["a revocation not passed on down the tree"]():
        assert (replay(scenario, choices) or "").startswith("over budget: 4,000 steps")


def test_the_waits_run_on_the_runtimes_clock() -> None:
    """The seam: a channel whose waits read the process's clock instead of its runtime's runs
    outside virtual time, and its deadline never passes there."""
    scenario = build(2, "late past a deadline", "own hosts", 0)
    assert replay(scenario, []) is None
    with MUTANTS["the waits timed by the process's clock, not the runtime's"]():
        assert "after its deadline" in (replay(scenario, []) or "")


def test_the_simulator_patches_nothing_of_the_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The seam: in the middle of a run, every module of the layer holds what it held before (the
    simulated ranks reach it through their runtimes), but for the channels registered by handle."""
    import sys

    import protocol_sim

    def snapshot() -> dict[str, dict[str, int]]:
        return {name: {key: id(value) for key, value in vars(module).items()} for name, module in sys.modules.items()
                if name.startswith("mpinb._collective") or name == "mpinb.interrupt"}

    before, during = snapshot(), []
    observe = protocol_sim.Sim.observe

    def watching(self: protocol_sim.Sim, *args: object) -> None:
        if not during:
            during.append(snapshot())
        observe(self, *args)

    monkeypatch.setattr(protocol_sim.Sim, "observe", watching)
    assert run_schedule(build(3, "raise inside", "own hosts", 0), Chooser([]))[1] is None
    assert during, "no step was observed"
    changed = {name: sorted(key for key in attrs if during[0][name].get(key) != attrs[key])
               for name, attrs in before.items()}
    assert not {name: keys for name, keys in changed.items() if keys}


def test_a_ctrl_c_held_back_by_a_stop_flag_ends_the_wait_after_the_grace_in_virtual_time() -> None:
    """The seam lets the model reach the interrupt grace of ``wait.poll``: rank 0's stop flag holds
    Ctrl-C back while it waits for rank 2, which computes for 7 s; its own runtime's Interrupts, on
    the virtual clock, end the wait 5 s later, and the others raise with it."""
    import random

    scenario = build(3, "Ctrl-C held by a stop flag, a rank computing", "one host", 1)
    log: list[str] = []
    record, violation, _ = run_schedule(scenario, Chooser(rng=random.Random(100_000)), log)
    assert violation is None, violation
    assert record.errors[0, 1].startswith("KeyboardInterrupt: interrupted on rank 0"), record.errors
    held = next(float(line.split()[0]) for line in log if "held back by a stop flag" in line)
    ended = next(float(line.split()[0]) for line in log if "rank 0: cell 1 ends" in line)
    assert 5.0 <= ended - held <= 5.1
