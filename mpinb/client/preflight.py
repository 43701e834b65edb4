"""Pre-flight checks before a multi-host start: can the launcher reach each host, can the hosts reach the
controller's address, does ``mpiexec`` form one world across them, does ``srun`` speak PMI.

Client. A multi-host start that goes wrong usually hangs — an engine waits forever for a controller
on an address it cannot reach, ``ssh`` waits for a password, ``srun`` starts N unrelated one-rank
worlds — so every probe here runs under a short timeout and turns what it saw into one sentence
with the cause and the fix. Nothing here imports ``mpi4py.MPI``: the MPI probes run in children.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from mpinb._words import ranks as ranks_text
from mpinb.client._processes import finish

__all__ = [
    "Finding",
    "check_controller",
    "check_hosts",
    "check_mpi_across",
    "check_srun",
    "read_hostfile",
]

# Runs on each host through the launcher: who it is, whether this Python and mpi4py are there (the
# engines start with this same path), and whether it can open a TCP connection to the controller's
# address (argv: ip port timeout, or nothing).
_HOST_PROBE = r"""
import socket, sys
print("HOSTNAME", socket.gethostname())
print("PYTHON", sys.version.split()[0])
try:
    import mpi4py
    print("MPI4PY", mpi4py.__version__)
except ImportError as err:
    print("MPI4PY missing", err)
if len(sys.argv) > 3:
    try:
        socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
        print("CONTROLLER ok")
    except OSError as err:
        print("CONTROLLER", getattr(err, "strerror", None) or err)
"""
_RANK_LINE = re.compile(r"\[rank (\d+)/(\d+)\] host (\S+),")
_HELLO = re.compile(r"I am process (\d+) of (\d+)")


@dataclass(frozen=True)
class Finding:
    """One pre-flight result: what was checked, whether it passed, and one sentence saying what was
    seen (with the fix when it failed)."""

    subject: str
    ok: bool
    detail: str

    def __str__(self) -> str:
        return f"{'ok  ' if self.ok else 'FAIL'}  {self.subject}: {self.detail}"


def read_hostfile(path: str | os.PathLike[str]) -> list[tuple[str, int | None]]:
    """Hosts and slot counts from an MPICH (``host:4``) or Open MPI (``host slots=4``) hostfile.

    Local. Blank lines and ``#`` comments are skipped; a host without a count gets ``None``.
    """
    hosts: list[tuple[str, int | None]] = []
    for number, raw in enumerate(Path(path).read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        words = line.split()
        name, _, rest = words[0].partition(":")
        count = rest.split(":", 1)[0]  # MPICH allows more fields after the count
        for word in words[1:]:
            if word.startswith(("slots=", "max_slots=")) and not count:
                count = word.split("=", 1)[1]
        if count and not count.isdigit():
            raise ValueError(
                f"{path}, line {number}: the slot count must be a whole number; got {raw.strip()!r}."
            )
        hosts.append((name, int(count) if count else None))
    if not hosts:
        raise ValueError(f"{path} lists no hosts; write one host per line, e.g. `node1:4`.")
    return hosts


def check_controller(ip: str, *, remote: bool = True) -> Finding:
    """Whether the controller can listen on ``ip`` here, and whether that can work for engines on
    other hosts (``remote``).

    Local: looks at this machine only; :func:`check_hosts` tries the address from the hosts.
    """
    subject = f"controller address {ip}"
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return Finding(subject, False, "not an IP address; pass the address of this machine's interface "
                       "that the hosts reach (ipyparallel's controller_ip takes an address, not a name).")
    interfaces = local_addresses()
    if address.is_unspecified:
        return Finding(subject, True, "listens on every interface of this machine (reachable from anywhere "
                       "that routes here; prefer the one interface the hosts use).")
    if not _can_bind(ip):
        usable = [a for a in interfaces if not (ipaddress.ip_address(a).is_loopback
                                                or ipaddress.ip_address(a).is_link_local)]
        have = ", ".join(f"{a} ({interfaces[a]})" for a in usable) or "none found"
        return Finding(subject, False, "not assigned to any interface of this machine, so the controller "
                       f"cannot listen there; use one of: {have}.")
    where = interfaces.get(str(address), "this machine")
    if address.is_loopback and remote:
        return Finding(subject, False, f"a loopback address ({where}): engines on other hosts cannot reach "
                       "it. Pass controller_ip=<this machine's address on the network the hosts share>.")
    return Finding(subject, True, f"assigned to {where}.")


def check_hosts(
    hosts: Sequence[str],
    *,
    launcher: str = "ssh",
    controller_ip: str | None = None,
    timeout: float = 10.0,
    python: str | None = None,
    env: Mapping[str, str] | None = None,
) -> list[Finding]:
    """Run a tiny probe on every host through ``launcher`` (Hydra's ssh convention:
    ``launcher -x HOST COMMAND``), each under ``timeout`` seconds, all at once.

    Client. Reports, per host, whether the launcher got there, the hostname it answered with, whether
    ``python`` (default: this interpreter's path, which is what ``mpiexec`` starts the engines with)
    and mpi4py exist there, and — with a ``controller_ip`` of this machine — whether the host can
    open a TCP connection to that address (a listener is opened there for the duration of the probe).
    """
    python = python or sys.executable
    exe = shutil.which(launcher)
    if exe is None:
        return [Finding(f"launcher {launcher}", False, "not found; install an OpenSSH client, or pass the "
                        "program mpiexec should use (--launcher-exec PATH).")]
    listener = None
    argv_tail: list[str] = []
    if controller_ip is not None and not _can_bind(controller_ip):
        controller_ip = None  # not this machine's: check_controller says so; nothing to connect to
    if controller_ip is not None:
        family = socket.AF_INET6 if ":" in controller_ip else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.bind((controller_ip, 0))
        listener.listen(64)  # the kernel completes the handshakes; nothing needs to accept them
        argv_tail = [controller_ip, str(listener.getsockname()[1]), str(max(1.0, timeout / 3))]
    name = Path(exe).name
    # Real ssh must fail rather than prompt for a password or a host key.
    ssh_options = ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, int(timeout))}"] if name == "ssh" else []
    command = shlex.join([python, "-c", _HOST_PROBE, *argv_tail])
    try:
        started = {}
        for host in hosts:
            started[host] = (time.monotonic(), _spawn([exe, *ssh_options, "-x", host, command], env))
        findings = []
        deadline = time.monotonic() + timeout
        for host, (t0, proc) in started.items():
            out, code = finish(proc, max(0.1, deadline - time.monotonic()))
            seconds = time.monotonic() - t0
            findings.append(_host_finding(host, name, python, controller_ip, out, code, seconds, timeout))
        return findings
    finally:
        if listener is not None:
            listener.close()


def check_mpi_across(
    hosts: Sequence[str],
    n: int,
    *,
    launcher: str = "ssh",
    iface: str | None = None,
    timeout: float = 60.0,
    env: Mapping[str, str] | None = None,
) -> Finding:
    """Run mpinb's rank check on ``n`` ranks over ``hosts`` through ``mpiexec -f`` and the launcher.

    Client. Passes when the ranks form one world of ``n`` and the collectives give the right
    answers; reports which host each rank ran on. ``iface``: the interface whose address the hosts
    use to call back to ``mpiexec`` (Hydra's ``-iface``).
    """
    from mpinb.client.launch import find_mpiexec, mpi_env

    subject = f"{n} MPI ranks across {len(hosts)} host(s)"
    exe = shutil.which(launcher)
    if exe is None:
        return Finding(subject, False, f"launcher {launcher} not found.")
    with tempfile.NamedTemporaryFile("w", prefix="mpinb-hosts-", suffix=".txt", delete=False) as f:
        f.write("\n".join(hosts) + "\n")
    cmd = [find_mpiexec(), "-f", f.name, "-launcher", "ssh", "-launcher-exec", exe,
           *(["-iface", iface] if iface else []),
           "-n", str(n), sys.executable, "-m", "mpi4py", "-m", "mpinb.jobs.rankcheck"]
    t0 = time.monotonic()
    try:
        out, code = finish(_spawn(cmd, mpi_env(n, base=os.environ if env is None else env)), timeout)
    finally:
        os.unlink(f.name)
    seconds = time.monotonic() - t0
    return _mpi_finding(subject, n, out, code, seconds, timeout)


def check_srun(
    *,
    timeout: float = 20.0,
    python: str | None = None,
    env: Mapping[str, str] | None = None,
    mpi: str | None = None,
) -> list[Finding]:
    """Whether Slurm's ``srun`` can start MPI ranks that form one world.

    Client. Two probes, each under ``timeout`` seconds: ``srun --mpi=list`` (does Slurm offer a PMI
    plugin — pmi2 or PMIx — that an MPI library can use?) and ``srun --mpi=PMI -n 2 python -m
    mpi4py.bench helloworld`` (do two ranks see a world of two, or two one-rank "singleton" worlds,
    which is what an srun without PMI gives: every later collective then "works" on one rank each,
    or hangs). ``mpi`` names the plugin to try (``"none"`` shows what a missing one does); by
    default it is the one ``MPICluster(launcher="slurm")`` would choose, or Slurm's default when
    the list offers none.
    """
    from mpinb.client.slurm import choose_pmi, parse_mpi_list

    exe = shutil.which("srun", path=(env or os.environ).get("PATH"))
    if exe is None:
        return [Finding("srun", False, "not found on PATH: run inside a Slurm allocation (salloc/sbatch) on a "
                        "node with Slurm's client tools, or start the ranks with mpiexec and a hostfile.")]
    findings = []
    listing = "srun --mpi=list"
    out, code = finish(_spawn([exe, "--mpi=list"], env), timeout)
    names: list[str] = []
    if code is None:
        findings.append(Finding(listing, False, f"no answer within {timeout:g} s (slurmctld unreachable?)."))
    else:
        names = parse_mpi_list(out)
        pmi = [w for w in names if w.lower().startswith("pmi")]
        if code == 0 and pmi:
            findings.append(Finding(listing, True, f"offers {', '.join(pmi)}."))
        else:
            findings.append(Finding(
                listing, False,
                f"offers no PMI plugin (saw: {', '.join(names) or _one_line(out) or 'nothing'}; exit {code}): "
                "ranks started by srun cannot find each other and each becomes a one-rank world. Use a "
                "Slurm built with PMIx or PMI2 (`srun --mpi=pmix` / `--mpi=pmi2`), or start the ranks with "
                "mpiexec inside the allocation (`mpiexec -launcher slurm`).",
            ))
    plugin = mpi or (choose_pmi(names) if code == 0 else None)
    flag = [f"--mpi={plugin}"] if plugin else []
    hello = [exe, *flag, "-n", "2", python or sys.executable, "-m", "mpi4py.bench", "helloworld"]
    out, code = finish(_spawn(hello, env), timeout)
    subject = " ".join(["srun", *flag, "-n 2 python -m mpi4py.bench helloworld"])
    if code is None:
        findings.append(Finding(subject, False, f"did not finish within {timeout:g} s: srun waited for an "
                                "allocation or the ranks waited for each other (run it inside salloc/sbatch)."))
        return findings
    worlds = [(int(r), int(s)) for r, s in _HELLO.findall(out)]
    if code == 0 and sorted(worlds) == [(0, 2), (1, 2)]:
        findings.append(Finding(subject, True, "two ranks of one world of 2."))
    elif len(worlds) >= 2 and all(w == (0, 1) for w in worlds):
        findings.append(Finding(
            subject, False,
            f"{len(worlds)} separate one-rank worlds ('process 0 of 1' {len(worlds)} times): srun started the "
            "processes without PMI, so MPI never learnt of the others. Pass `--mpi=pmix` or `--mpi=pmi2` "
            "(see `srun --mpi=list`), or start the ranks with mpiexec.",
        ))
    else:
        findings.append(Finding(subject, False, f"exit {code}: {_one_line(out) or 'no output'}"))
    return findings


def local_addresses() -> dict[str, str]:
    """This machine's IP addresses and the interface each is on (from ``ip -o addr``; empty without
    it). Local."""
    if shutil.which("ip") is None:
        return {}
    try:
        out = subprocess.run(["ip", "-o", "addr"], check=False, capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    found = {}
    for line in out.splitlines():
        m = re.match(r"\d+:\s+(\S+)\s+inet6?\s+([^/\s]+)", line)
        if m:
            found[m.group(2)] = m.group(1)
    return found


# -- private helpers --------------------------------------------------------------------------------
def _can_bind(ip: str) -> bool:
    """Whether ``ip`` is an address of this machine: binding needs it to be, and sends nothing."""
    try:
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((ip, 0))
        return True
    except (OSError, ValueError):
        return False


def _spawn(argv: list[str], env: Mapping[str, str] | None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=None if env is None else dict(env), start_new_session=True,
    )


def _host_finding(host: str, launcher: str, python: str, controller_ip: str | None, out: str,
                  code: int | None, seconds: float, timeout: float) -> Finding:
    fields: dict[str, str] = {}
    for line in out.splitlines():
        key, _, value = line.partition(" ")
        if key in ("HOSTNAME", "PYTHON", "MPI4PY", "CONTROLLER"):
            fields[key] = value.strip()
    if code is None and "HOSTNAME" not in fields:
        return Finding(host, False, f"no answer through {launcher} within {timeout:g} s (a password or "
                       "host-key prompt, or a firewall dropping the connection); `ssh HOST true` must work "
                       "without any prompt.")
    if "HOSTNAME" not in fields:
        # ssh exits 255 for its own failures, and a remote shell 127 for a missing command.
        if code != 255 and (code == 127 or "No such file" in out):
            return Finding(host, False, f"reached, but {python} is not there: every host needs this Python "
                           "environment at the same path (mpiexec starts the engines with it).")
        return Finding(host, False, f"not reachable with {launcher} (exit {code}): "
                       f"{_one_line(out) or 'no message'}")
    parts = [(f"reached with {launcher} in {seconds:.2f} s, hostname {fields['HOSTNAME']}, "
              f"python {fields.get('PYTHON', '?')}")]
    ok = True
    if fields.get("MPI4PY", "").startswith("missing"):
        ok = False
        parts.append("but mpi4py is missing there (install the same environment on every host)")
    else:
        parts.append(f"mpi4py {fields.get('MPI4PY', '?')}")
    if controller_ip is not None:
        seen = fields.get("CONTROLLER")
        if seen == "ok":
            parts.append(f"reaches {controller_ip}")
        else:
            ok = False
            parts.append(f"but cannot reach the controller address {controller_ip} ({seen or 'no answer'}): "
                         "pass an address of this machine on a network this host shares")
    return Finding(host, ok, "; ".join(parts) + ".")


def _mpi_finding(subject: str, n: int, out: str, code: int | None, seconds: float, timeout: float) -> Finding:
    summaries = [json.loads(line[10:]) for line in out.splitlines() if line.startswith("RANKCHECK ")]
    placed = {int(r): h for r, s, h in _RANK_LINE.findall(out) if int(s) == n}
    if code is None:
        return Finding(subject, False, f"did not finish within {timeout:g} s and was killed: the ranks could "
                       "not connect to each other or to mpiexec (a firewall between the hosts, or MPI using an "
                       "interface they cannot reach: see UCX_NET_DEVICES / FI_TCP_IFACE, and mpiexec's -iface). "
                       "Last output: " + (_one_line(out) or "none"))
    if len(summaries) > 1 and all(s.get("ranks") == 1 for s in summaries):
        return Finding(subject, False, f"{len(summaries)} separate one-rank worlds instead of one of {n}: "
                       "mpiexec and the MPI library mpi4py loads do not match (use the mpiexec next to this "
                       "Python).")
    if code != 0 or len(summaries) != 1 or not summaries[0].get("ok"):
        return Finding(subject, False, f"exit {code}: {_one_line(out) or 'no output'}")
    by_host: dict[str, list[int]] = {}
    for rank in sorted(placed):
        by_host.setdefault(placed[rank], []).append(rank)
    where = ", ".join(f"{host}: {ranks_text(r, sep=',')}" for host, r in by_host.items())
    return Finding(subject, True, f"one world of {n} ({where}); allreduce and rank-ordered gather correct; "
                   f"{seconds:.1f} s.")


def _one_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    return (lines[-1] if lines else "")[:300]
