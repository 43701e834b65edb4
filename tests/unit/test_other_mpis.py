"""What mpinb does for Open MPI's launcher: its death reports read, its wildcard port filtered."""

from __future__ import annotations

import socket
import subprocess
import sys

import psutil
import pytest

from mpinb._listeners import confine_listeners_of
from mpinb.client._ipp import engine_deaths
from support.netsim import answers

NANNIES = ("2026-12-07 13:39:17.936 [KernelNanny.1] Pipe closed, parent 4712 has status: zombie\n"
           "2026-12-07 13:39:18.451 [KernelNanny.0] Pipe closed, parent 4711 has status: None\n")
PRTERUN = ("--------------------------------------------------------------------------\n"
           "prterun noticed that process rank 1 with PID {pid} on node vm exited on\n"
           "signal 9 (Killed).\n"
           "--------------------------------------------------------------------------\n")


@pytest.mark.parametrize("pid", ["4712", "0"])
def test_prterun_s_word_on_a_killed_rank_names_its_signal(pid: str) -> None:
    # Open MPI 5.0's prterun says "PID 0": the rank is matched to its engine by the engines' log.
    logs = "2026-12-07 13:39:10.162 [IPEngine.1.1] Completed registration with id 1\n"
    text = logs + NANNIES + PRTERUN.format(pid=pid)
    assert engine_deaths(text) == [(1, 4712, "SIGKILL")]
    assert engine_deaths(logs + NANNIES + PRTERUN.format(pid="4711")) == [(1, 4712, "its process ended")]


def test_a_death_report_stops_waiting_at_any_launcher_s_word() -> None:
    # The report waits (up to 1 s) after the nannies for the launcher's word on the signal: Hydra's
    # and prterun's both end the wait, the nannies' alone do not.
    from mpinb.client._ipp import LAUNCHER_SAW_EXIT

    hydra = "=   PID 4712 RUNNING AT vm\n=   EXIT CODE: 9\n"
    assert LAUNCHER_SAW_EXIT.search(NANNIES + PRTERUN.format(pid="0"))
    assert LAUNCHER_SAW_EXIT.search(NANNIES + hydra)
    assert LAUNCHER_SAW_EXIT.search("prterun detected that one or more processes exited with non-zero status, thus")
    assert not LAUNCHER_SAW_EXIT.search(NANNIES)


_LISTENER = """
import socket, sys, time
listeners = []
for family, address in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
    sock = socket.socket(family)
    sock.bind((address, 0))
    sock.listen()
    listeners.append(sock)
print(*(s.getsockname()[1] for s in listeners), flush=True)
time.sleep(60)
"""



def test_a_child_s_wildcard_listeners_answer_loopback_alone() -> None:
    outside = [a.address for addrs in psutil.net_if_addrs().values() for a in addrs
               if a.family in (socket.AF_INET, socket.AF_INET6) and not a.address.startswith(("127.", "::1", "fe80"))]
    if not outside:
        pytest.skip("this machine has no address but loopback")
    child = subprocess.Popen([sys.executable, "-c", _LISTENER], stdout=subprocess.PIPE, text=True)
    try:
        port4, port6 = (int(p) for p in child.stdout.readline().split())  # type: ignore[union-attr]
        assert confine_listeners_of(child.pid) == 2
        assert answers("127.0.0.1", port4) and answers("127.0.0.1", port6) and answers("::1", port6)
        for address in outside:
            if ":" not in address:
                assert not answers(address, port4), address
            assert not answers(address, port6), address
    finally:
        child.kill()
        child.wait()
    assert confine_listeners_of(child.pid) == 0  # gone: nothing to do, no error


IMPI_BOTH_KILLED = "".join(
    "===================================================================================\n"
    "=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES\n"
    f"=   RANK {rank} PID {4711 + rank} RUNNING AT vm\n"
    "=   KILLED BY SIGNAL: 9 (Killed)\n"
    "===================================================================================\n" for rank in (0, 1))


class _Relay:
    def __init__(self, text: str, said: dict[int, tuple[str | None, list[str]]] | None = None) -> None:
        self.text, self.said = text, said or {}

    def recent(self) -> str:
        return self.text

    def last_words(self, rank: int) -> tuple[str | None, list[str]]:
        return self.said.get(rank, (None, []))


class _Cluster:
    def __init__(self, relay: _Relay) -> None:
        self.engines = {"mpi": type("Launcher", (), {"relay": relay})()}


def test_ranks_that_ended_together_are_named_together_not_guessed() -> None:
    # CI, Intel MPI on a loaded host: rank 1 was SIGKILLed, rank 0's nanny logged first, and Hydra
    # reports both ranks killed by signal 9: when this host saw them end at once, no rank is guessed.
    from mpinb.client._health import deaths

    nannies = NANNIES.splitlines(keepends=True)
    text = nannies[1] + nannies[0] + IMPI_BOTH_KILLED  # rank 0's nanny first
    cluster = _Cluster(_Relay(text))
    said = deaths(cluster, [0, 1], [4711, 4712], None, {4711, 4712})
    assert said is not None and said.startswith("one of ranks 0-1 (engines 0, 1; pids 4711, 4712) died first: "
                                                "they ended too close together"), said
    named = deaths(cluster, [0, 1], [4711, 4712], 4712, set())
    assert named is not None and named.startswith("rank 1 (engine 1, pid 4712) died"), named
    # A rank whose own Python reported a fatal signal is named even when the host saw both at once.
    told = _Cluster(_Relay(text, {1: ("SIGSEGV", ["Fatal Python error: Segmentation fault"])}))
    said = deaths(told, [0, 1], [4711, 4712], None, {4711, 4712})
    assert said is not None and said.startswith("rank 1 (engine 1, pid 4712) died (SIGSEGV)"), said


def test_the_rank_this_host_saw_end_first_is_named_before_its_nanny_s_line_arrives() -> None:
    # CI, MPICH on a loaded host: rank 1 was SIGKILLed and this host saw it end first; mpiexec's
    # report (about rank 0, which it killed with SIGKILL after) and rank 0's nanny line came through
    # the launcher's output before rank 1's nanny line, and the report named rank 0.
    from mpinb.client._health import deaths

    rank0_only = NANNIES.splitlines(keepends=True)[1] + "=   PID 4711 RUNNING AT vm\n=   EXIT CODE: 9\n"
    said = deaths(_Cluster(_Relay(rank0_only)), [0, 1], [4711, 4712], 4712, set())
    assert said is not None and said.startswith("rank 1 (engine 1, pid 4712) died; "), said
    # With rank 1's line there, Hydra's word on it.
    said = deaths(_Cluster(_Relay(NANNIES + "=   PID 4712 RUNNING AT vm\n=   EXIT CODE: 9\n")), [0, 1], [4711, 4712],
                  4712, set())
    assert said is not None and said.startswith("rank 1 (engine 1, pid 4712) died (exit code 9)"), said


class _LateRelay(_Relay):
    """A relay whose nannies' lines arrive ``after`` seconds from now (a loaded host)."""

    def __init__(self, text: str, after: float) -> None:
        super().__init__(text)
        import time

        self.at = time.monotonic() + after

    def recent(self) -> str:
        import time

        return self.text if time.monotonic() >= self.at else ""


def test_a_death_the_controller_knows_waits_for_the_launcher_s_words() -> None:
    # CI: a %%px cell's EngineError was rendered before the dead engine's nanny line had come through
    # mpiexec's output, and named no rank. When the controller already lists fewer engines, the
    # report waits for the words (here 0.3 s late); when it does not, nothing died: no wait.
    import time

    from mpinb.client._health import deaths

    text = NANNIES + "=   PID 4712 RUNNING AT vm\n=   EXIT CODE: 9\n"
    said = deaths(_Cluster(_LateRelay(text, 0.3)), [0, 1], [4711, 4712], 4712, set(), known=True)
    assert said is not None and said.startswith("rank 1 (engine 1, pid 4712) died"), said
    t0 = time.monotonic()
    assert deaths(_Cluster(_LateRelay(text, 0.3)), [0, 1], [4711, 4712], None, set(), known=False) is None
    assert time.monotonic() - t0 < 0.2
