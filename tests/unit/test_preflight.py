"""``mpinb info --hosts/--slurm`` pre-flight, the parts that need no network: hostfiles, controller
addresses, and fake ``srun``/launcher scripts on PATH that answer as a broken setup would."""

from __future__ import annotations

import os
import stat
import sys
import time
from pathlib import Path

import pytest

from mpinb.client import cli, preflight

# TEST-NET-3 (RFC 5737): never assigned to a machine, so binding to it fails; nothing is sent.
NOT_HERE = "203.0.113.77"


def script(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def path_with(folder: Path) -> dict[str, str]:
    return {**os.environ, "PATH": f"{folder}{os.pathsep}{os.environ.get('PATH', '')}"}


# -- hostfiles ---------------------------------------------------------------------------------------
def test_read_hostfile_mpich_and_open_mpi_forms(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("# cluster\nnode1:4\n\nnode2 slots=2  # comment\nnode3\n")
    assert preflight.read_hostfile(f) == [("node1", 4), ("node2", 2), ("node3", None)]


def test_read_hostfile_rejects_bad_counts_and_empty_files(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("node1:four\n")
    with pytest.raises(ValueError, match=r"line 1: the slot count must be a whole number; got 'node1:four'"):
        preflight.read_hostfile(f)
    f.write_text("# nothing\n")
    with pytest.raises(ValueError, match="lists no hosts"):
        preflight.read_hostfile(f)


# -- the controller's address ------------------------------------------------------------------------
def test_controller_address_not_on_this_machine():
    finding = preflight.check_controller(NOT_HERE)
    assert not finding.ok
    assert f"controller address {NOT_HERE}: not assigned to any interface of this machine" in str(finding)
    assert "cannot listen there; use one of:" in finding.detail


def test_controller_on_loopback_cannot_serve_other_hosts():
    finding = preflight.check_controller("127.0.0.1")
    assert not finding.ok
    assert "a loopback address" in finding.detail and "engines on other hosts cannot reach it" in finding.detail
    assert preflight.check_controller("127.0.0.1", remote=False).ok


@pytest.mark.parametrize("value", ["node1", "10.0.0.300"])
def test_controller_address_must_be_an_address(value):
    finding = preflight.check_controller(value)
    assert not finding.ok and "not an IP address" in finding.detail


def test_controller_on_every_interface():
    assert preflight.check_controller("0.0.0.0").ok


# -- srun ------------------------------------------------------------------------------------------------
def test_srun_missing(tmp_path):
    (finding,) = preflight.check_srun(env={**os.environ, "PATH": str(tmp_path)})
    assert not finding.ok
    assert str(finding).startswith("FAIL  srun: not found on PATH: run inside a Slurm allocation")


SINGLETON_SRUN = """
case "$1" in
  --mpi=list) printf 'MPI plugin types are...\\n\\tnone\\n\\tcray_shasta\\n' ;;
  *) echo "Hello, World! I am process 0 of 1 on node1."; echo "Hello, World! I am process 0 of 1 on node1." ;;
esac
"""


def test_srun_without_pmi_is_diagnosed_as_singletons(tmp_path):
    script(tmp_path, "srun", SINGLETON_SRUN)
    listing, run = preflight.check_srun(env=path_with(tmp_path), timeout=10)
    assert not listing.ok and "offers no PMI plugin (saw: none, cray_shasta; exit 0)" in listing.detail
    assert "one-rank world" in listing.detail
    assert not run.ok
    assert "2 separate one-rank worlds ('process 0 of 1' 2 times)" in run.detail
    assert "--mpi=pmix" in run.detail


def test_srun_with_pmi(tmp_path):
    script(tmp_path, "srun", """
case "$1" in
  --mpi=list) printf 'MPI plugin types are...\\n\\tnone\\n\\tpmi2\\n\\tpmix\\n'
              printf 'specific pmix plugin versions available: pmix_v4\\n' ;;
  *) echo "Hello, World! I am process 1 of 2 on node2."; echo "Hello, World! I am process 0 of 2 on node1." ;;
esac
""")
    listing, run = preflight.check_srun(env=path_with(tmp_path), timeout=10)
    assert listing.ok and "pmi2" in listing.detail and "pmix" in listing.detail
    assert run.ok and run.detail == "two ranks of one world of 2."


def test_srun_that_hangs_is_stopped_with_its_cause(tmp_path):
    script(tmp_path, "srun", 'echo "srun: job 42 queued and waiting for resources"; exec sleep 60\n')
    t0 = time.monotonic()
    listing, run = preflight.check_srun(env=path_with(tmp_path), timeout=0.5)
    assert time.monotonic() - t0 < 10
    assert not listing.ok and "no answer within 0.5 s" in listing.detail
    assert not run.ok and "srun waited for an allocation" in run.detail


def test_info_slurm_reports_the_singletons(tmp_path, capsys, monkeypatch):
    script(tmp_path, "srun", SINGLETON_SRUN)
    monkeypatch.setenv("PATH", path_with(tmp_path)["PATH"])
    assert cli.main(["info", "--slurm", "--timeout", "10"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  srun -n 2 python -m mpi4py.bench helloworld: 2 separate one-rank worlds" in out
    assert "0 of 2 pre-flight checks passed" in out


# -- hosts through a launcher ---------------------------------------------------------------------------
def test_launcher_missing():
    (finding,) = preflight.check_hosts(["node1"], launcher="/nonexistent/ssh")
    assert not finding.ok and "not found" in finding.detail


def test_hosts_unreachable_silent_and_reachable(tmp_path):
    # A stand-in ssh: "node1" runs the command here, "node2" refuses, "node3" never answers.
    launcher = script(tmp_path, "fake-ssh", """
while [ "${1#-}" != "$1" ]; do shift; done
host=$1; shift
case "$host" in
  node1) exec sh -c "$*" ;;
  node2) echo "ssh: connect to host node2 port 22: Connection refused" >&2; exit 255 ;;
  *) exec sleep 60 ;;
esac
""")
    t0 = time.monotonic()
    found = preflight.check_hosts(["node1", "node2", "node3"], launcher=str(launcher), controller_ip="127.0.0.1",
                                  timeout=3)
    assert time.monotonic() - t0 < 10
    by_host = {f.subject: f for f in found}
    assert by_host["node1"].ok, by_host["node1"]
    node1 = by_host["node1"].detail
    assert "reaches 127.0.0.1" in node1 and f"python {sys.version.split()[0]}" in node1
    assert not by_host["node2"].ok
    assert by_host["node2"].detail == ("not reachable with fake-ssh (exit 255): "
                                       "ssh: connect to host node2 port 22: Connection refused")
    assert not by_host["node3"].ok and by_host["node3"].detail.startswith("no answer through fake-ssh within 3 s")


def test_host_without_this_python(tmp_path):
    launcher = script(tmp_path, "fake-ssh", 'shift 2; exec sh -c "$*"\n')
    (finding,) = preflight.check_hosts(["node1"], launcher=str(launcher), python="/nonexistent/python3", timeout=5)
    assert not finding.ok and "/nonexistent/python3 is not there" in finding.detail


def test_info_rejects_a_malformed_host_list(capsys):
    assert cli.main(["info", "--hosts", "node1:x"]) == 2
    assert "--hosts takes HOST or HOST:SLOTS" in capsys.readouterr().err
