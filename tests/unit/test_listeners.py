"""mpinb._listeners: a child holding a copy of a wildcard listener filters it to loopback, then closes it."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import psutil
import pytest

from support.netsim import answers

_CHILD = """
import os, sys
from mpinb._listeners import confine_inherited_listeners
fd = int(sys.argv[1])
confine_inherited_listeners(loopback_only=sys.argv[2] == "1")
try:
    os.fstat(fd)
    print("open")
except OSError:
    print("closed")
"""


def _outside_addresses() -> list[str]:
    return [a.address for addrs in psutil.net_if_addrs().values() for a in addrs
            if a.family == socket.AF_INET and not a.address.startswith("127.")]



def _after_child(argv: Callable[[int], list[str]], outside: list[str]) -> tuple[Any, bool, list[bool]]:
    """Run ``argv(fd)`` holding a wildcard listener as Hydra's port reaches an engine (the same
    socket, inherited across exec, as descriptor ``fd``); then whether the listener answers on
    loopback and on each of ``outside``. A filter the child attached is the socket's, so it holds
    here, after the child is gone."""
    with socket.socket() as server:
        server.bind(("0.0.0.0", 0))
        server.listen()
        port = server.getsockname()[1]
        child = subprocess.run(argv(server.fileno()), pass_fds=[server.fileno()], capture_output=True, text=True,
                               timeout=60, check=True)
        return child, answers("127.0.0.1", port), [answers(address, port) for address in outside]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="socket filters are Linux's")
@pytest.mark.parametrize("loopback_only", [True, False])
def test_an_inherited_wildcard_listener_is_filtered_to_loopback_and_closed(loopback_only: bool) -> None:
    outside = _outside_addresses()
    if not outside:
        pytest.skip("this machine has no address beyond loopback to probe from")
    child, on_loopback, elsewhere = _after_child(
        lambda fd: [sys.executable, "-c", _CHILD, str(fd), "1" if loopback_only else "0"], outside)
    assert child.stdout.split() == ["closed"], child.stderr
    assert on_loopback
    assert elsewhere == [not loopback_only] * len(outside)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="socket filters are Linux's")
def test_a_one_machine_cluster_starts_its_engines_filtered_from_their_first_line() -> None:
    """MPICluster's engines on one machine start as ``mpinb._engine_boot``, which filters Hydra's port
    before ipyparallel's engine runs (here it prints its version and exits); elsewhere they start
    as ipyparallel's own engines, as remote proxies need that port."""
    from mpinb.client._options import ENGINE_BOOT, LaunchOptions

    def engine_cmd(options: LaunchOptions) -> object:
        return options.make_cluster(2).config.MPIEngineSetLauncher.get("engine_cmd")

    assert engine_cmd(LaunchOptions()) == ENGINE_BOOT
    assert engine_cmd(LaunchOptions(mpi_args=("-hosts", "a,b"))) is None
    outside = _outside_addresses()
    if not outside:
        pytest.skip("this machine has no address beyond loopback to probe from")
    child, on_loopback, elsewhere = _after_child(lambda fd: [*ENGINE_BOOT, "--version"], outside)
    assert child.stdout.strip(), child.stderr  # ipyparallel's engine ran after the filter
    assert on_loopback
    assert not any(elsewhere)


def test_engines_wait_to_register_as_long_as_the_cluster_waits_for_them() -> None:
    """ipyparallel's engines give up registering after 5 s (and their mpiexec ends): a loaded
    host's controller can be slower, so they are given the cluster's own timeout."""
    from mpinb.client._options import LaunchOptions

    config = LaunchOptions(timeout=75.0).make_cluster(2).config
    assert "--IPEngine.timeout=75" in config.MPIEngineSetLauncher.engine_args
