"""A real Slurm for the slurm tier: munged, slurmctld and one slurmd per simulated host.

The hosts are the multihost tier's (tests/support/netsim.py): each ``slurmd -N hostX`` runs inside
host X's network and UTS namespaces, so every node has its own hostname and address on the private
bridge, and slurmctld (like the notebook) runs in the root namespace at the bridge's gateway
address. Debian's Slurm 22.05 is built with MULTIPLE_SLURMD, so the daemons share this machine's
filesystem; everything they write (configuration, munge key and socket, state, spool, logs) is in one
temporary folder, and the ports are free ones chosen at start, so nothing collides with a Slurm the
machine may run itself. :meth:`SlurmCluster.stop` ends every daemon by PID (the hosts' holders end
whatever a job left inside their namespaces) and removes the folder.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from support import netsim  # noqa: E402

__all__ = ["DAEMON_PIDS", "SlurmCluster", "unavailable_reason"]

CPUS_PER_NODE = 2
DAEMON_PIDS: set[int] = set()  # the live daemons of this process's Slurm clusters

_CONF = """\
ClusterName=mpinbtest
SlurmctldHost={controller}({gateway})
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
FirstJobId={first_job}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={folder}/munge/socket
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool/%n
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd-%n.pid
SlurmctldLogFile={folder}/log/slurmctld.log
SlurmdLogFile={folder}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
# Every pending job looked at each 2 s (Slurm: 60 s): a job queued behind a lost node starts as soon
# as the nodes that answer are free, as the node-loss test expects, not a minute later.
SchedulerParameters=sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=2
MinJobAge=2
InactiveLimit=0
MessageTimeout=10
SlurmctldTimeout=60
SlurmdTimeout=60
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def unavailable_reason() -> str | None:
    """Why a Slurm cannot run here (one line), or None when it can."""
    missing = [d for d in ("munged", "slurmctld", "slurmd", "srun", "sbatch") if shutil.which(d, path=_path()) is None]
    if missing:
        return (f"needs Debian's slurmctld, slurmd, slurm-client and munge (missing {', '.join(missing)}; "
                "`apt-get install slurmctld slurmd slurm-client munge`)")
    return netsim.unavailable_reason()


class SlurmCluster:
    """``count`` Slurm nodes (``host1``...), each a slurmd on a simulated host; :meth:`start`, then :meth:`stop`.

    Attributes (after start): ``sim`` (the :class:`netsim.SimulatedHosts`), ``folder``, ``conf``
    (the slurm.conf path: Slurm's commands find it through :meth:`env`).
    """

    def __init__(self, count: int = 3) -> None:
        self.sim = netsim.SimulatedHosts(count)
        self.folder = ""
        self.conf = ""
        self._daemons: list[subprocess.Popen[bytes]] = []

    def env(self) -> dict[str, str]:
        """What Slurm's commands need to talk to this cluster, and the launcher wrapper its hosts."""
        return {"SLURM_CONF": self.conf, **self.sim.env()}

    def start(self) -> SlurmCluster:
        self._mpi_files_before = netsim.mpi_leftovers()
        self.sim.start()
        self.folder = tempfile.mkdtemp(prefix="mpinb-slurm-")
        folder = Path(self.folder)
        for sub in ("munge", "state", "log", "spool"):
            (folder / sub).mkdir(mode=0o700)
        for host in self.sim.hosts:
            (folder / "spool" / host.name).mkdir(mode=0o700)
        key = folder / "munge" / "key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o600)
        self._spawn(["munged", "-F", "--force", f"--socket={folder}/munge/socket", f"--key-file={key}",
                     f"--pid-file={folder}/munge/pid", f"--log-file={folder}/log/munged.log",
                     f"--seed-file={folder}/munge/seed"])
        _wait_for(lambda: (folder / "munge" / "socket").exists(), 10, "munged did not create its socket")
        nodes = "\n".join(f"NodeName={h.name} NodeHostname={h.name} NodeAddr={h.address} CPUs={CPUS_PER_NODE} "
                          "State=UNKNOWN" for h in self.sim.hosts)
        ctld_port, slurmd_port = _free_ports(2)
        self.conf = str(folder / "slurm.conf")
        Path(self.conf).write_text(_CONF.format(
            controller=socket.gethostname().split(".")[0], gateway=self.sim.gateway, ctld_port=ctld_port,
            slurmd_port=slurmd_port, folder=folder, nodes=nodes,
            # Job ids unlike any earlier run's: MPICH names its shared-memory segments after the
            # job's PMI key space, so a segment a killed job left would collide with a new job's.
            first_job=secrets.randbelow(10**7) + 1000))
        self._spawn(["slurmctld", "-D", "-i", "-f", self.conf])
        for host in self.sim.hosts:
            self._spawn(["nsenter", "--target", str(host.pid), "--net", "--uts", "--",
                         "slurmd", "-D", "-N", host.name, "-f", self.conf])
        _wait_for(self._nodes_idle, 30, "the Slurm nodes did not come up", self._log_tail)
        return self

    def stop(self) -> None:
        """End every daemon (SIGTERM, then SIGKILL), the hosts with what jobs left on them, and the folder;
        safe after a failed start."""
        for proc in reversed(self._daemons):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(self._daemons):
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            DAEMON_PIDS.discard(proc.pid)
        self._daemons = []
        self.sim.stop()
        # What jobs killed by scancel or an owner's death left (MPI did not finalize): the segments
        # and launcher files that appeared meanwhile and that no process uses any more.
        netsim.remove_orphans(getattr(self, "_mpi_files_before", None))
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)

    def leftovers(self) -> list[str]:
        found = self.sim.leftovers()
        if self.folder and Path(self.folder).exists():
            found.append(f"folder {self.folder}")
        found += [f"{p.args[0]} {p.pid}" for p in self._daemons if p.poll() is None]
        return found

    def run(self, argv: list[str], *, timeout: float = 30.0, env: dict[str, str] | None = None,
            ) -> subprocess.CompletedProcess[str]:
        """A Slurm command against this cluster, output captured."""
        return subprocess.run(argv, check=False, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **(env or {}), **self.env()})

    def jobs(self) -> list[str]:
        """``JOBID STATE NAME`` of every job not yet finished."""
        out = self.run(["squeue", "-h", "-t", "PD,R,CG,S,CF", "-o", "%i %T %j"]).stdout
        return [line.strip() for line in out.splitlines() if line.strip()]

    def lose_node(self, name: str) -> None:
        """What a crashed node looks like to everyone else: its slurmd, slurmstepd and tasks SIGKILLed
        at once (every process in the host's namespaces but their holder), nothing said to anyone."""
        host = self.sim.hosts_by_name[name]
        uts = os.readlink(f"/proc/{host.pid}/ns/uts")
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == host.pid:
                continue
            try:
                if os.readlink(entry / "ns" / "uts") == uts:
                    os.kill(int(entry.name), signal.SIGKILL)
            except OSError:
                continue  # ended meanwhile
        for proc in list(self._daemons):
            if proc.args[-4:-2] == ["-N", name]:
                proc.wait(timeout=10)
                self._daemons.remove(proc)
                DAEMON_PIDS.discard(proc.pid)

    def restore_node(self, name: str, timeout: float = 90.0) -> None:
        """A lost node back, as after a reboot: declared down first (what slurmctld does SlurmdTimeout
        after the crash; it ends the jobs the crash left COMPLETING there at once, instead of at its
        next 30 s look), then its slurmd started again in the host's namespaces, its spool as the crash
        left it; ReturnToService=2 returns it to service. Returns once Slurm lists the node idle."""
        host = self.sim.hosts_by_name[name]
        if self._node_state(name) != "idle":
            self.run(["scontrol", "update", f"NodeName={name}", "State=DOWN", "Reason=crashed"])
        if not any(p.args[-4:-2] == ["-N", name] and p.poll() is None for p in self._daemons):
            self._spawn(["nsenter", "--target", str(host.pid), "--net", "--uts", "--",
                         "slurmd", "-D", "-N", name, "-f", self.conf])
        _wait_for(lambda: self._node_state(name) == "idle", timeout, f"{name} did not come back", self._log_tail)

    def log(self, name: str = "slurmctld") -> str:
        path = Path(self.folder) / "log" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # -- private ----------------------------------------------------------------------------------
    def _spawn(self, argv: list[str]) -> None:
        with open(Path(self.folder) / "log" / f"{Path(argv[0]).name}.err", "ab") as err:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                    env={**os.environ, "PATH": _path(), "SLURM_CONF": self.conf},
                                    start_new_session=True)
        self._daemons.append(proc)
        DAEMON_PIDS.add(proc.pid)

    def _nodes_idle(self) -> bool:
        if any(p.poll() is not None for p in self._daemons):
            raise RuntimeError(f"a Slurm daemon exited at start: {self._log_tail()}")
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=10).stdout.split("\n")
        states = dict(line.split() for line in out if line.strip())
        return len(states) == len(self.sim.hosts) and all(s == "idle" for s in states.values())

    def _node_state(self, name: str) -> str:
        return self.run(["sinfo", "-h", "-n", name, "-o", "%t"], timeout=10).stdout.strip()

    def _log_tail(self) -> str:
        tails = []
        for path in sorted((Path(self.folder) / "log").glob("*")):
            lines = path.read_text(errors="replace").strip().splitlines()[-3:]
            if lines:
                tails.append(f"{path.name}: " + " | ".join(lines))
        return "; ".join(tails)


def _path() -> str:
    # The daemons live in /usr/sbin, which a non-login root shell may not have on PATH.
    return os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _wait_for(ready, seconds: float, what: str, detail=lambda: "") -> None:
    deadline = time.monotonic() + seconds
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} within {seconds:g} s: {detail()}")
        time.sleep(0.1)
