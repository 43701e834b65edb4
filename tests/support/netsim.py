"""Simulated hosts for the multihost tier: one network + UTS namespace per host, joined by a bridge.

Each host is a *holder* process (``unshare --net --uts python -c _HOLDER``) that owns a fresh network
namespace and a fresh hostname, so anything entered into it with ``nsenter --target PID --net --uts``
sees only that host's interfaces and name. One more holder, the *switch*, owns the Linux bridge;
a veth pair links each host's ``eth0`` to it, and one more joins it to the root namespace (the
*uplink*, where this process, mpiexec and the ipyparallel controller live), all on a private /24
(``10.213.X.0/24``, X chosen free at start). The addresses exist only there, and nothing is routed
anywhere else: the namespaces have no default route, the root namespace does not forward.

The namespaces are anonymous, so they cannot outlive their processes: each holder reads its stdin,
a pipe from this process; when it closes (at :meth:`SimulatedHosts.stop`, or when this process dies,
even by SIGKILL) the holder ends every process left in its namespace and exits, and the kernel
removes the namespace and its links. The uplink, the only piece in the root namespace, is
named with a per-run prefix (``mnbt`` + 6 hex digits), so a leftover can never collide with another
run, and the host map travels in an environment variable, not a file. :meth:`SimulatedHosts.stop`
also ends any process still inside the namespaces, and :meth:`SimulatedHosts.leftovers` says what,
if anything, is still there.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HOLDERS", "LAUNCHER", "PREFIX", "TCP", "YIELD", "Host", "SimulatedHosts", "processes_left",
           "session_environment", "skip_tier_unless", "unavailable_reason"]

LAUNCHER = Path(__file__).resolve().parent.parent / "multihost" / "launcher.sh"  # the ssh stand-in Hydra calls
PREFIX = "mnbt"  # every link this module creates starts with it (plus 6 hex digits per run)
_TOOLS = ("ip", "unshare", "nsenter")

# MPI between ranks on different simulated hosts must go over the bridge. The namespaces share one
# kernel, so UCX (the mpich wheel's default netmod) takes peers on other hosts for neighbours and
# uses shared memory and CMA (measured: 13 KiB crossed the bridge during an 8 MiB Allreduce, and
# UCX_LOG_LEVEL=info shows "intra-node ... sysv/memory cma/memory" for them). Restricted to TCP it
# goes through each host's eth0; MPICH's own shared memory still carries the traffic between
# ranks on the same host, as on real machines. OFI's tcp provider works as well.
TCP = {"ucx": {"UCX_TLS": "tcp"}, "ofi": {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp"}}
# Three ranks on two cores: MPICH yields instead of spinning while it waits.
YIELD = {"MPIR_CVAR_ENABLE_HEAVY_YIELD": "1", "MPIR_CVAR_POLLS_BEFORE_YIELD": "1"}
HOLDERS: set[int] = set()  # PIDs of the live holders of this process's simulated hosts


@dataclass(frozen=True)
class Host:
    """One simulated host: its hostname, its address on the bridge, and the holder of its namespaces."""

    name: str
    address: str
    pid: int
    port: str  # its bridge port, in the switch's namespace
    netns: int  # inode of its network namespace

    def run(self, argv: list[str], *, timeout: float = 30.0, **kwargs) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on this host (inside its namespaces), capturing text output."""
        return subprocess.run(_enter(self.pid) + list(argv), check=False, capture_output=True, text=True,
                              timeout=timeout, **kwargs)


def unavailable_reason() -> str | None:
    """Why hosts cannot be simulated here (one line), or None when they can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "needs root to create network namespaces (run as root, e.g. in CI)"
    missing = [tool for tool in _TOOLS if shutil.which(tool) is None]
    if missing:
        return f"needs {', '.join(missing)} (iproute2 and util-linux) to create network namespaces"
    try:
        probe = subprocess.run(["unshare", "--net", "--uts", "--", "true"], check=False, capture_output=True,
                               text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"`unshare --net --uts true` failed: {err}"
    if probe.returncode:
        return f"cannot create network namespaces: `unshare --net --uts true`: {_last_line(probe.stderr)}"
    # Namespaces alone are not enough (a container may allow them but not bridges or veths): build
    # one host and take it down again, ~0.1 s.
    trial = SimulatedHosts(names=["probe"])
    try:
        trial.start()
    except (OSError, RuntimeError, subprocess.SubprocessError) as err:
        return f"cannot build a simulated host: {err}"
    finally:
        trial.stop()
    left = trial.leftovers()
    return f"could not remove a trial simulated host: {left}" if left else None


class SimulatedHosts:
    """``count`` hosts named ``host1``... on a private bridge; use as a context manager.

    Attributes (after start): ``hosts`` (list of :class:`Host`), ``uplink`` (the root namespace's
    link to the bridge), ``gateway`` (its address: where a controller listens and mpiexec's proxies
    call back), ``subnet`` and ``hosts_by_name``; :meth:`env` gives ``launcher.sh`` the host map.
    """

    def __init__(self, count: int = 2, *, names: list[str] | None = None) -> None:
        self.names = list(names or [f"host{i + 1}" for i in range(count)])
        self.tag = PREFIX + secrets.token_hex(3)
        self.uplink = f"{self.tag}gw"  # the root namespace's one link, to the switch
        self.hosts: list[Host] = []
        self.subnet: ipaddress.IPv4Network | None = None
        self.gateway = ""
        self.launcher = str(LAUNCHER)
        self._launcher_copy = ""
        self._switch: subprocess.Popen[bytes] | None = None
        self._holders: list[subprocess.Popen[bytes]] = []  # the switch's and every host's
        self._inodes: set[int] = set()

    # -- lifecycle ---------------------------------------------------------------------------------
    def __enter__(self) -> SimulatedHosts:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> SimulatedHosts:
        """Build the switch and the hosts. The bridge lives in the switch's own namespace, and the
        root namespace's only piece is one end of a veth pair: when the holders exit, even after
        this process was SIGKILLed, the kernel removes all of it."""
        self.subnet = _free_subnet()
        addresses = list(self.subnet.hosts())
        prefix = self.subnet.prefixlen
        self.gateway = str(addresses[0])
        self._switch = self._hold("switch")
        switch = _enter(self._switch.pid)
        _run([*switch, "ip", "link", "add", "br0", "type", "bridge"])
        _run([*switch, "ip", "link", "set", "br0", "up"])
        _ip("link", "add", self.uplink, "type", "veth", "peer", "name", "gw", "netns", str(self._switch.pid))
        _run([*switch, "ip", "link", "set", "gw", "master", "br0", "up"])
        _ip("addr", "add", f"{self.gateway}/{prefix}", "dev", self.uplink)
        _ip("link", "set", self.uplink, "up")
        for i, name in enumerate(self.names):
            holder = self._hold(name)
            port = f"h{i + 1}"
            _run([*switch, "ip", "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", str(holder.pid)])
            _run([*switch, "ip", "link", "set", port, "master", "br0", "up"])
            address = str(addresses[10 + i])
            inside = _enter(holder.pid)
            _run([*inside, "ip", "addr", "add", f"{address}/{prefix}", "dev", "eth0"])
            _run([*inside, "ip", "link", "set", "eth0", "up"])
            self.hosts.append(Host(name, address, holder.pid, port, _netns_inode(holder.pid)))
        if not os.access(LAUNCHER, os.X_OK):
            # A checkout that lost the file's mode (an archive, a copy): Hydra needs an executable.
            fd, self._launcher_copy = tempfile.mkstemp(prefix=f"{self.tag}-launcher-", suffix=".sh")
            with os.fdopen(fd, "w") as out:
                out.write(LAUNCHER.read_text())
            os.chmod(self._launcher_copy, 0o755)
            self.launcher = self._launcher_copy
        return self

    def stop(self) -> None:
        """Remove everything this object created; safe to call twice and after a failed start."""
        holder_pids = {p.pid for p in self._holders}
        # Whatever a test left running inside the namespaces (a rank, an engine, a proxy): ours.
        for pid in _pids_in_netns(self._inodes) - holder_pids:
            _kill(pid)
        if _link_exists(self.uplink):  # goes with the switch anyway; at once is tidier
            subprocess.run(["ip", "link", "del", self.uplink], check=False, capture_output=True)
        for holder in self._holders:  # each ends what still runs on its host, and exits
            try:
                holder.stdin.close()  # type: ignore[union-attr]
            except OSError:
                pass
        for holder in self._holders:
            try:
                holder.wait(timeout=5)
            except subprocess.TimeoutExpired:
                _kill(holder.pid)
                holder.wait()
            HOLDERS.discard(holder.pid)
            if holder.stdout is not None:
                holder.stdout.close()
        # The kernel tears a namespace down shortly after its last process: wait for that.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and (_pids_in_netns(self._inodes) or _link_exists(self.uplink)):
            time.sleep(0.02)
        if self._launcher_copy:
            Path(self._launcher_copy).unlink(missing_ok=True)

    def _hold(self, name: str) -> subprocess.Popen[bytes]:
        holder = _start_holder(name)
        self._holders.append(holder)
        HOLDERS.add(holder.pid)
        self._inodes.add(_netns_inode(holder.pid))
        return holder

    def leftovers(self) -> list[str]:
        """What of this run is still there: links, processes in its namespaces, holders."""
        found = [f"link {name}" for name in _links() if name.startswith(self.tag)]
        found += [f"process {pid} in a simulated network namespace" for pid in sorted(_pids_in_netns(self._inodes))]
        found += [f"holder process {p.pid}" for p in self._holders if p.poll() is None]
        if self._launcher_copy and Path(self._launcher_copy).exists():
            found.append(f"file {self._launcher_copy}")
        return found

    # -- what the tests use -----------------------------------------------------------------------
    @property
    def hosts_by_name(self) -> dict[str, Host]:
        return {h.name: h for h in self.hosts}

    def hostfile(self, slots: dict[str, int], path: str | os.PathLike) -> Path:
        """An MPICH hostfile (``address:slots`` per line) for the named hosts, in that order."""
        lines = [f"{self.hosts_by_name[name].address}:{n}" for name, n in slots.items()]
        Path(path).write_text("\n".join(lines) + "\n")
        return Path(path)

    def env(self) -> dict[str, str]:
        """What the launcher wrapper needs in its environment to find the hosts: the host map itself,
        ``name:address:holder-pid`` comma-separated, so no file can be left behind. mpiexec and
        ipyparallel's launchers pass their environment on to the wrapper."""
        return {"MPINB_SIMHOSTS": ",".join(f"{h.name}:{h.address}:{h.pid}" for h in self.hosts)}

    def mpi_args(self, hostfile: str | os.PathLike) -> list[str]:
        """``mpiexec`` arguments that place ranks on the simulated hosts through the wrapper."""
        return [
            "-f", str(hostfile),
            "-launcher", "ssh", "-launcher-exec", self.launcher,
            # The proxies call back to mpiexec at this interface's address (the gateway), not at
            # this machine's hostname, which means loopback inside a namespace.
            "-iface", self.uplink,
        ]

    def mpiexec(
        self, slots: dict[str, int], argv: list[str], *, env: dict[str, str], timeout: float,
        hostfile: str | os.PathLike,
    ) -> subprocess.CompletedProcess[str]:
        """``mpiexec -n <sum of slots>`` over the named hosts, output captured, under a hard timeout
        (exit 124, after the whole process group is killed, when it runs out)."""
        from mpinb.client.launch import find_mpiexec

        n = sum(slots.values())
        cmd = [find_mpiexec(), *self.mpi_args(self.hostfile(slots, hostfile)), "-n", str(n), *argv]
        proc = subprocess.Popen(cmd, env={**env, **self.env()}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        self.watch(proc.pid)
        try:
            out, _ = proc.communicate(timeout=timeout)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code = 124
            _killpg(proc.pid)
            out, _ = proc.communicate()
            out += f"\n[netsim] mpiexec killed after {timeout:g} s"
        finally:
            _killpg(proc.pid)  # the proxies entered the hosts through nsenter, in this group
            proc.wait()
        return subprocess.CompletedProcess(cmd, code, out, None)

    def watch(self, pid: int) -> None:
        """End process group ``pid`` (a session leader in the root namespace, such as mpiexec) with the
        hosts, even if this process dies first: the switch's holder does it when its stdin closes."""
        if self._switch is None or self._switch.stdin is None:
            raise RuntimeError("watch() needs started hosts")
        start = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
        self._switch.stdin.write(f"{pid} {start}\n".encode())
        self._switch.stdin.flush()

    def bridge_bytes(self) -> dict[str, int]:
        """Bytes each host has sent into the bridge: its eth0's transmit counter, read from the
        holder's view of /proc/net/dev (its network namespace)."""
        return {h.name: _tx_bytes(h.pid, "eth0") for h in self.hosts}


# -- what the tiers' conftests share ------------------------------------------------------------------
@contextlib.contextmanager
def session_environment(extra: dict[str, str]):
    """``os.environ`` with ``extra`` and a private IPYTHONDIR for a tier's session, restored afterwards.

    For the processes the tests start (mpiexec, Slurm's commands, ipyparallel's launchers); the
    IPYTHONDIR is read when ipyparallel builds profile paths, so no test touches the user's profiles.
    """
    ipython_dir = tempfile.mkdtemp(prefix="mpinb-test-ipython-")
    values = {**extra, "IPYTHONDIR": ipython_dir, "IPP_NONINTERACTIVE": "1"}
    saved = {var: os.environ.get(var) for var in values}
    try:
        os.environ.update(values)
        yield
    finally:
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value
        shutil.rmtree(ipython_dir, ignore_errors=True)


def skip_tier_unless(items: list, folder: Path, tier: str, unavailable) -> None:
    """Mark the collected tests of ``folder`` skipped, with one reason, when ``unavailable()`` gives one."""
    import pytest

    mine = [item for item in items if Path(str(item.fspath)).parent == folder]
    reason = unavailable() if mine else None
    for item in mine if reason else []:
        item.add_marker(pytest.mark.skip(reason=f"{tier} tier: {reason}"))


def mpi_leftovers() -> set[str]:
    """What a killed MPI world can leave on this machine now: MPICH's and UCX's segments in /dev/shm
    and Hydra's topology files in /tmp (full paths)."""
    found: set[str] = set()
    for folder, prefixes in (("/dev/shm", ("mpich_shm_", "ucx_shm")), ("/tmp", ("hydra_hwloc_xmlfile_",))):
        try:
            found.update(f"{folder}/{n}" for n in os.listdir(folder) if n.startswith(prefixes))
        except OSError:
            continue
    return found


def remove_orphans(before: set[str] | None) -> list[str]:
    """Remove what appeared since ``before`` (see :func:`mpi_leftovers`) and that no process maps or
    holds open; returns the paths. For the tiers whose ranks on simulated hosts, or Slurm jobs, are
    killed before MPI finalizes: their files are on this machine, but no cluster of this host owns them."""
    if before is None:
        return []
    new = mpi_leftovers() - before
    if not new:
        return []
    used: set[str] = set()
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/maps") as fh:
                used.update(line.split(maxsplit=5)[-1].strip() for line in fh if "/dev/shm/" in line)
            for fd in os.listdir(f"/proc/{pid}/fd"):
                used.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except (OSError, IndexError):
            continue
    removed = sorted(new - used)
    for path in removed:
        try:
            os.unlink(path)
        except OSError:
            pass
    return removed


def processes_left(tags: tuple[str, ...], keep: set[int] = frozenset()) -> list[int]:
    """PIDs of this process's descendants whose command line holds one of ``tags`` (except ``keep``
    and the hosts' holders) that are still alive 10 s on; they are killed."""
    import psutil

    found = []
    for proc in psutil.Process().children(recursive=True):
        if proc.pid in HOLDERS or proc.pid in keep:
            continue
        try:
            if any(tag in " ".join(proc.cmdline()) for tag in tags):
                found.append(proc)
        except psutil.Error:
            continue
    _, alive = psutil.wait_procs(found, timeout=10)
    for proc in alive:
        proc.kill()
    return [p.pid for p in alive]


# -- private helpers --------------------------------------------------------------------------------
def _enter(pid: int) -> list[str]:
    return ["nsenter", "--target", str(pid), "--net", "--uts", "--"]


# The holder: owns a host's namespaces (started under ``unshare --net --uts``), names the host, and
# reads its stdin until it closes — at stop(), or when its owner dies however it dies
# (pytest-timeout's thread method ends pytest with os._exit: no finalizer runs). Then it ends every
# process still running in its network namespace (ranks, proxies, engines started on this host),
# and the process groups of the root-namespace processes it was told to watch ("PID STARTTIME"
# lines: mpiexec), and exits; the kernel removes the namespace and its links.
_HOLDER = r"""
import os, signal, socket, subprocess, sys
socket.sethostname(sys.argv[1])
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
print("ready", flush=True)
watched = [line.split() for line in sys.stdin if line.strip()]
me = os.stat("/proc/self/ns/net").st_ino
for entry in os.listdir("/proc"):
    if entry.isdigit() and int(entry) != os.getpid():
        try:
            if os.stat(f"/proc/{entry}/ns/net").st_ino == me:
                os.kill(int(entry), signal.SIGKILL)
        except OSError:
            pass
for pid, start in watched:
    try:  # the same process, not a later one that got its number
        if open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[19] == start:
            os.killpg(int(pid), signal.SIGKILL)
    except (OSError, IndexError):
        pass
"""


def _start_holder(name: str) -> subprocess.Popen[bytes]:
    holder = subprocess.Popen(
        ["unshare", "--net", "--uts", "--", sys.executable, "-c", _HOLDER, name],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        # Out of the owner's process group, so a group kill (tests/run.py on a tier timeout) leaves
        # it alive to clean up its host when the owner is gone.
        start_new_session=True,
    )
    ready, _, _ = select.select([holder.stdout], [], [], 10.0)
    line = holder.stdout.readline() if ready else b""  # type: ignore[union-attr]
    if line.strip() != b"ready":
        _kill(holder.pid)
        holder.wait()
        rest = holder.stdout.read().decode(errors="replace") if holder.stdout else ""  # type: ignore[union-attr]
        raise RuntimeError(f"the holder of simulated host {name} did not start: "
                           f"{_last_line(line.decode(errors='replace') + rest)}")
    return holder


def _free_subnet() -> ipaddress.IPv4Network:
    """A 10.213.X.0/24 that no address or route on this machine overlaps."""
    used: list[ipaddress.IPv4Network] = []
    out = subprocess.run(["ip", "-4", "-o", "addr"], check=False, capture_output=True, text=True, timeout=10).stdout
    used += [ipaddress.ip_interface(m).network for m in re.findall(r"inet (\S+)", out)]
    routes = subprocess.run(["ip", "-4", "route", "show", "table", "all"], check=False, capture_output=True,
                            text=True, timeout=10).stdout
    for line in routes.splitlines():
        dest = line.split()[0] if line.split() else ""
        if dest in ("default", "broadcast", "local", "unreachable", "blackhole", "prohibit"):
            dest = line.split()[1] if dest != "default" and len(line.split()) > 1 else ""
        try:
            net = ipaddress.ip_network(dest, strict=False)
        except ValueError:
            continue
        if net.prefixlen > 0:
            used.append(net)
    choices = list(range(1, 255))
    secrets.SystemRandom().shuffle(choices)
    for x in choices:
        candidate = ipaddress.ip_network(f"10.213.{x}.0/24")
        if not any(candidate.overlaps(net) for net in used):
            return candidate
    raise RuntimeError("no free 10.213.X.0/24 subnet for the simulated hosts")


def _ip(*args: str) -> None:
    _run(["ip", *args])


def _run(argv: list[str]) -> None:
    proc = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=30)
    if proc.returncode:
        raise RuntimeError(f"`{' '.join(argv)}` failed: {_last_line(proc.stderr or proc.stdout)}")


def _links() -> list[str]:
    return sorted(os.listdir("/sys/class/net"))


def _link_exists(name: str) -> bool:
    return os.path.exists(f"/sys/class/net/{name}")


def _tx_bytes(pid: int, link: str) -> int:
    for line in Path(f"/proc/{pid}/net/dev").read_text().splitlines():
        name, _, counters = line.partition(":")
        if name.strip() == link:
            return int(counters.split()[8])  # receive: 8 fields, then transmit bytes
    raise LookupError(f"no link {link} in the network namespace of process {pid}")


def _netns_inode(pid: int) -> int:
    return os.stat(f"/proc/{pid}/ns/net").st_ino


def _pids_in_netns(inodes: set[int]) -> set[int]:
    found = set()
    if not inodes:
        return found
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}/ns/net").st_ino in inodes:
                    found.add(int(entry))
            except OSError:
                continue
    return found


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _last_line(text: str) -> str:
    lines = [line for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no message)"


def answers(address: str, port: int) -> bool:
    """Whether a TCP connection to ``address:port`` (IPv4 or IPv6) is accepted within a second: a
    listener filtered to loopback lets a connection from another address time out."""
    import socket

    with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect((address, port))
        except TimeoutError:
            return False
        return True
