"""The collective layer reaches MPI, the clocks, the core and signals only through its Runtime.

That is what lets the protocol model (``tests/model``) drive the real layer over simulated ranks
without patching it: a module that read ``time.monotonic()`` or ``mpi4py.MPI`` itself would run
outside the model's virtual time and simulated MPI, and nothing would say so. Read from the source
(no import), so a use in a function that no test runs is found too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "mpinb"
LAYER = sorted(PACKAGE.glob("_collective/*.py")) + [PACKAGE / "interrupt.py"]
SEAM = PACKAGE / "_collective" / "runtime.py"

#: Modules only the runtime imports: the clocks and sleeps, signals, MPI.
FORBIDDEN_MODULES = ("time", "signal", "mpi4py", "socket")
#: What ``os`` offers of the same: giving up the core, the cores, sending a signal.
FORBIDDEN_OS = ("sched_yield", "sched_getaffinity", "kill", "killpg")


def reads_outside_the_runtime(source: str) -> list[str]:
    """Each import of a forbidden module and each read of a forbidden ``os`` function in
    ``source``, as ``"line N: what"``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""] if not node.level else []
            if node.module == "os":
                names += [f"os.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os":
            names = [f"os.{node.attr}"]
        else:
            continue
        for name in names:
            if name.split(".")[0] in FORBIDDEN_MODULES or name in {f"os.{f}" for f in FORBIDDEN_OS}:
                found.append(f"line {node.lineno}: {name}")
    return found


@pytest.mark.parametrize("path", [p for p in LAYER if p != SEAM], ids=lambda p: p.name)
def test_the_layer_reads_time_mpi_scheduling_and_signals_only_through_its_runtime(path: Path) -> None:
    found = reads_outside_the_runtime(path.read_text())
    assert not found, (f"{path.relative_to(PACKAGE.parent)} reads {', '.join(found)}: take it from the channel's "
                       "Runtime (mpinb/_collective/runtime.py) instead, so the protocol model sees it")


def test_the_check_finds_each_way_in() -> None:
    source = ("import time\nfrom mpi4py import MPI\nimport signal as s\nimport os\nos.sched_yield()\n"
              "from os import kill\nfrom time import monotonic\nimport mpi4py.MPI\n")
    assert sorted(reads_outside_the_runtime(source)) == [
        "line 1: time", "line 2: mpi4py", "line 3: signal", "line 5: os.sched_yield", "line 6: os.kill",
        "line 7: time", "line 8: mpi4py.MPI"]
    assert reads_outside_the_runtime("import os\nos.path.join('a')\nfrom os import path\n") == []


def test_the_runtime_is_the_one_place_that_reads_them() -> None:
    assert reads_outside_the_runtime(SEAM.read_text())  # the test above would pass on an empty layer


def test_a_held_back_ctrl_c_is_timed_by_its_own_clock() -> None:
    """Each runtime's Ctrl-C is its own, on its own clock: the protocol model gives every simulated
    rank one on virtual time, so the wait's grace after a held-back Ctrl-C runs in virtual time."""
    from mpinb.interrupt import Interrupts

    now = [100.0]
    held = Interrupts(lambda: now[0])
    assert held.pending_since() is None
    error = RuntimeError("rank 1 gave up")
    assert held.instead_if_pending(error) is error
    held.note()
    now[0] = 103.0
    held.note()  # a second signal keeps the first one's time
    assert held.pending_since() == 100.0
    instead = held.instead_if_pending(error)
    assert isinstance(instead, KeyboardInterrupt) and str(instead) == "rank 1 gave up"
    assert held.pending_since() is None  # taken in


def test_a_stop_flag_holds_ctrl_c_back_in_this_process() -> None:
    import signal

    from mpinb.interrupt import PENDING, StopFlag

    with StopFlag() as flag:
        signal.raise_signal(signal.SIGINT)
        assert flag.requested and PENDING.pending_since() is not None
    assert PENDING.pending_since() is None  # leaving the flag forgets it
