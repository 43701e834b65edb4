"""Engines as Slurm tasks: a batch job (``sbatch``) from outside an allocation, an ``srun`` step inside one.

Client. :class:`MPICluster` with ``launcher="slurm"`` hands its engines to :class:`SlurmEngines`,
which chooses how to start them, the PMI plugin that makes them one MPI world, and the controller
address the nodes can reach; and which cancels the job (or step) when the cluster stops, or when its
owner dies (through the watchdog). Slurm's commands are run as programs, found on ``PATH``.
"""

from __future__ import annotations

import ipaddress
import os
import re
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

from mpinb.client._launcher_output import has_ended, last_lines, output_of, tail

__all__ = ["PMI_PREFERENCE", "SlurmEngines", "choose_pmi", "in_allocation", "parse_mpi_list", "pmi_relay",
           "reaching_address"]

# MPICH (the mpich wheel) speaks PMI-1, which srun's pmi2 plugin serves (the wheel's MPI_Init fails with
# MPIR_CVAR_PMI_VERSION=2); PMIx only when built with it, and Slurm's pmix
# plugin often does not even load (Debian's needs a libpmix of the same version). Open MPI speaks
# PMIx. pmi2 first, then any pmix flavour Slurm lists.
PMI_PREFERENCE = ("pmi2", "pmix")
_PROBE_TIMEOUT = 30.0  # seconds for one Slurm command that should answer at once
_GONE_TIMEOUT = 15.0  # seconds stop() waits for Slurm to report the job or step ended
_LOOK_EVERY = 2.0  # seconds between looks at whether a starting job has ended
_SLURMD_PORT = 6818  # Slurm's default, when `scontrol show config` does not say


def pmi_relay(pmi: str) -> list[str]:
    """What goes between ``srun --mpi=PMI`` and the engine: with pmi2, :mod:`mpinb.client._pmi1_relay`, which
    keeps MPICH's PMI-1 requests within the 1,024 bytes Slurm's plugin reads at once (longer ones
    corrupt the ranks' address exchange across nodes); nothing with other plugins. Local."""
    if pmi != "pmi2":
        return []
    from mpinb.client import _pmi1_relay

    return [sys.executable, "-I", os.path.abspath(_pmi1_relay.__file__)]


def in_allocation(env: Mapping[str, str] | None = None) -> bool:
    """Whether this process runs inside a Slurm allocation (``salloc``, ``sbatch``, a batch spawner). Local."""
    return bool((os.environ if env is None else env).get("SLURM_JOB_ID"))


def parse_mpi_list(text: str) -> list[str]:
    """Plugin names from ``srun --mpi=list``: one per line after a header, with or without ``srun:``. Local."""
    names = (line.replace("srun:", "").strip() for line in text.splitlines())
    return [name for name in names if name and " " not in name]


def choose_pmi(plugins: Sequence[str]) -> str | None:
    """The PMI plugin to start MPI ranks with, from what ``srun --mpi=list`` offers, or None. Local."""
    for wanted in PMI_PREFERENCE:
        for name in plugins:
            if name == wanted:
                return name
    pmix = sorted(name for name in plugins if name.startswith("pmix"))
    return pmix[0] if pmix else None


def reaching_address(targets: Sequence[str]) -> str | None:
    """The address of this machine's interface that reaches ``targets`` (addresses or names), or None.

    Local: asks the routing table (a UDP socket's ``connect`` sends nothing). The first target
    reached through an interface other than loopback wins; when every target is this machine
    itself, its loopback address is the answer.
    """
    loopback = None
    for target in targets:
        try:
            address = socket.gethostbyname(target)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((address, 9))
                source = probe.getsockname()[0]
        except OSError:
            continue
        if not ipaddress.ip_address(source).is_loopback:
            return source
        loopback = source
    return loopback


class SlurmEngines:
    """How an :class:`MPICluster` with ``launcher="slurm"`` starts, names and ends its engines. Client.

    Parameters
    ----------
    n : int
        Number of engines (MPI ranks, Slurm tasks).
    launcher_args : sequence of str
        Extra ``sbatch`` arguments (outside an allocation) or ``srun`` arguments (inside one), e.g.
        ``["--partition=debug", "--time=00:30:00", "--account=myproject"]``. A ``--mpi=NAME`` among
        them chooses the PMI plugin instead of ``srun --mpi=list``.
    env : mapping
        Environment of the engines (on top of this process's: Slurm exports it).
    threads_per_rank : int, optional
        Threads per engine; by default each node's cores are shared by the ranks on it, as the
        engines count them (:func:`mpinb.limit_threads`), not this machine's.
    """

    def __init__(self, n: int, launcher_args: Sequence[str], env: Mapping[str, str],
                 threads_per_rank: int | None = None) -> None:
        from mpinb.comm import thread_env

        if isinstance(launcher_args, str) or not all(isinstance(a, str) for a in launcher_args):
            raise TypeError("launcher_args must be a list of strings, e.g. ['--partition=debug']; "
                            f"got {launcher_args!r}.")
        self.n = n
        self.inside = in_allocation()
        self.env = {**(thread_env(threads_per_rank) if threads_per_rank else {}), **env}
        self.args = [a for a in launcher_args if not a.startswith("--mpi=")]
        chosen = [a.split("=", 1)[1] for a in launcher_args if a.startswith("--mpi=")]
        self.pmi = chosen[-1] if chosen else self._choose_pmi()
        self.job = os.environ["SLURM_JOB_ID"] if self.inside else ""
        self.step = ""
        # Known before anything is submitted, so that the watchdog can cancel the job by name if
        # the owner dies before sbatch has answered with its id.
        self.job_name = f"mpinb-{os.getpid()}-{secrets.token_hex(4)}"
        self._next_look = 0.0
        self._script_dir = ""
        self._port = 0  # slurmd's port, from `scontrol show config` when first needed
        self._state = ("", "", "")  # the batch job's state, reason and nodes at the last look

    # -- what MPICluster hands to ipyparallel ------------------------------------------------------
    def settings(self) -> tuple[str, dict[str, Any]]:
        """The engine launcher's name for :class:`ipyparallel.Cluster` and its configuration."""
        srun = self._command("srun")
        if self.inside:
            # A step of the allocation this process runs in: ipyparallel's MPI launcher builds
            # `srun --mpi=pmi2 ARGS -n N ENGINE --mpi ...`, a local process whose output it keeps.
            mpi_cmd = [srun, f"--mpi={self.pmi}", f"--job-name={self.job_name}", *self.args]
            return "mpi", {"MPILauncher": {"mpi_cmd": mpi_cmd, "mpi_args": pmi_relay(self.pmi)},
                           "MPIEngineSetLauncher": {"environment": self.env}}
        # A batch job whose one step starts the engines; the command-line arguments of sbatch win
        # over the script's #SBATCH lines, so launcher_args can say anything sbatch takes.
        template = "\n".join([
            "#!/bin/sh",
            f"#SBATCH --job-name={self.job_name}",
            "#SBATCH --ntasks={n}",
            "#SBATCH --output={output_file}",
            "#SBATCH --export=ALL",
            f"exec {shlex.quote(srun)} --mpi={self.pmi} {shlex.join(pmi_relay(self.pmi))} {{program}} --mpi "
            "{program_args}",
            "",
        ])
        # ipyparallel writes the script into its working directory (the notebook's folder) and leaves
        # it there; an absolute name puts it in a private folder, removed once sbatch has read it.
        self._script_dir = tempfile.mkdtemp(prefix="mpinb-sbatch-")
        return "slurm", {"SlurmEngineSetLauncher": {
            "batch_file_name": os.path.join(self._script_dir, f"{self.job_name}.sbatch"),
            "submit_command": [self._command("sbatch"), *self.args],
            "delete_command": [self._command("scancel")],
            "signal_command": [self._command("scancel"), "-s"],
            "batch_template": template,
            "environment": self.env,
        }}

    def controller_ip(self, requested: str | None) -> str:
        """Where the controller listens: ``requested``, or this machine's address that reaches the nodes."""
        if requested is not None:
            return requested
        nodes = self._node_addresses()
        found = reaching_address(nodes)
        if found is None:
            raise RuntimeError(
                f"no interface of this machine reaches the Slurm nodes ({', '.join(nodes) or 'none listed'}); "
                "pass controller_ip=<this machine's address on the network the nodes share>."
            )
        return found

    # -- after the engines started ---------------------------------------------------------------
    def identify(self, launchers: Sequence[Any], engine: Any) -> None:
        """Learn the job (and step) the engines run in, from an engine (an ipyparallel view of one)."""
        self.remove_script()
        found = engine.apply_sync(_slurm_ids)
        ids = [getattr(launcher, "job_id", "") for launcher in launchers]
        self.job = str(found.get("SLURM_JOB_ID") or next(filter(None, ids), "") or self.job)
        if self.inside:
            self.step = found.get("SLURM_STEP_ID", "")

    @property
    def target(self) -> str:
        """What ``scancel`` ends: the batch job, or our step of the allocation (never the allocation)."""
        if self.inside:
            return f"{self.job}.{self.step}" if self.job and self.step else ""
        return self.job

    def cancel_command(self) -> list[str]:
        """The command that ends the engines' job or step, for the watchdog; by name until the id is known."""
        scancel = self._command("scancel")
        if self.target:
            return [scancel, self.target]
        if self.inside:  # our step, before it had an id: the watchdog ends srun, which ends the step
            return []
        return [scancel, f"--name={self.job_name}"] if self.job_name else []

    def remove_script(self) -> None:
        """Remove the batch script: slurmctld keeps its own copy from submission on."""
        if self._script_dir:
            shutil.rmtree(self._script_dir, ignore_errors=True)
            self._script_dir = ""

    def cancel(self) -> None:
        """End the engines' job or step, and wait (a bounded while) until Slurm says it has ended."""
        self.remove_script()
        command = self.cancel_command()
        if not command:
            return
        try:
            subprocess.run(command, check=False, capture_output=True, timeout=_PROBE_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired):
            return  # slurmctld unreachable: ipyparallel's own scancel follows, and the watchdog's
        deadline = time.monotonic() + _GONE_TIMEOUT
        while time.monotonic() < deadline and self._running():
            if self._state[0] == "COMPLETING" and (lost := self._lost_among(self._state[2])):
                # Its nodes that answer are free again; slurmctld completes the job only when it
                # declares the lost ones down (SlurmdTimeout), which no user command can hasten.
                print(f"mpinb: Slurm job {self.job} is cancelled; Slurm lists it COMPLETING until it declares "
                      f"{', '.join(lost)} down (its slurmd does not answer).", file=sys.stderr, flush=True)
                return
            time.sleep(0.2)

    def signal(self, signum: int) -> None:
        """Send ``signum`` to every engine through Slurm (``scancel --signal``): srun itself takes a
        single SIGINT as a request for its tasks' status and passes nothing on."""
        if not self.target:
            raise RuntimeError("the engines' Slurm job is not known yet; nothing to signal.")
        self._run([self._command("scancel"), f"--signal={int(signum)}", self.target])

    def failure(self, launchers: Sequence[Any]) -> str | None:
        """Why the engines will never register (their srun or batch job ended), or None while they may.

        Looks at most every few seconds (squeue asks slurmctld); the answer quotes the launcher's output.
        """
        now = time.monotonic()
        if now < self._next_look:
            return None
        self._next_look = now + _LOOK_EVERY
        if self.inside:
            ended = [launcher for launcher in launchers if has_ended(launcher)]
        else:
            self.job = next(filter(None, (getattr(launcher, "job_id", "") for launcher in launchers)), self.job)
            ended = list(launchers) if self.job and not self._running() else []
        if not ended:
            return None
        output = " | ".join(tail(output_of(launcher)) for launcher in ended).strip(" |")
        what = "srun" if self.inside else f"batch job {self.job}"
        return (f"the engines' {what} ended before they registered (--mpi={self.pmi}; `srun --mpi=list` shows "
                f"what this Slurm offers, launcher_args=['--mpi=NAME'] picks one): {output or 'no output'}")

    def node_loss(self, hosts: Sequence[str], registered: Sequence[int], launchers: Sequence[Any]) -> str | None:
        """Which ranks a lost node took, which ended after, which live (see :mod:`._slurm_faults`); None
        when every node of the engines answers. ``hosts``: each rank's node; ``registered``: ranks whose
        engines the controller lists."""
        from mpinb.client import _slurm_faults as faults

        nodes = list(dict.fromkeys(hosts))
        try:
            port = self._slurmd_port()
            listing = self._run([self._command("sinfo"), "-h", "-N", "-n", ",".join(nodes), "-o", "%N %o %t"]).stdout
        except (RuntimeError, OSError, ValueError):
            return None  # slurmctld does not answer: nothing Slurm says can be added
        lost = {}
        for line in listing.splitlines():
            name, address, state = (line.split() + ["", "", ""])[:3]
            if name in nodes and not faults.slurmd_answers(address or name, port):
                lost[name] = _STATE_WORDS.get(state.rstrip("*~#!%$@^-"), state) + (
                    ", not responding" if state.endswith("*") else "")
        text = " ".join(output_of(launcher) for launcher in launchers)
        found = faults.NodeLoss(lost=lost, exits=faults.parse_srun_exits(text), registered=list(registered))
        return faults.describe_node_loss(found, hosts, self.job)

    def queued(self) -> str | None:
        """``"PENDING (Resources)"`` while the engines' batch job waited in Slurm's queue at the last look
        (:meth:`failure` looks every few seconds), else None."""
        state, reason, _ = self._state
        # "None" is a job the scheduler has not looked at yet: just submitted, not yet queued for a reason.
        if state != "PENDING" or self.inside or reason in ("", "None"):
            return None
        return f"{state} ({reason})"

    def pending(self, launchers: Sequence[Any]) -> str:
        """What Slurm and srun say of engines that have not registered in time: the steps of the
        job (a step that has not ended holds the CPUs a new one asks for) and srun's last lines."""
        said: list[str] = []
        if self.job:
            try:
                steps = self._run([self._command("squeue"), "-h", "-s", "-j", self.job, "-o", "%i %N"]).stdout
            except RuntimeError:
                steps = ""
            listed = "; ".join(line.strip() for line in steps.splitlines() if line.strip()) or "none"
            said.append(f"Slurm lists these steps of job {self.job}: {listed}")
        said.append(f"srun says: {last_lines(launchers)}")
        return "; ".join(said)

    def describe(self) -> str:
        """For ``repr(cluster)``: how the engines were started."""
        where = f"step {self.target}" if self.inside else f"job {self.job or '?'}"
        return f"slurm {where} --mpi={self.pmi}"

    # -- private ----------------------------------------------------------------------------------
    def _choose_pmi(self) -> str:
        out = self._run([self._command("srun"), "--mpi=list"])
        plugins = parse_mpi_list(out.stdout + out.stderr)
        pmi = choose_pmi(plugins)
        if pmi is None:
            raise RuntimeError(
                f"`srun --mpi=list` offers no PMI plugin (saw: {', '.join(plugins) or 'nothing'}): ranks started "
                "by srun could not find each other. Ask for a Slurm with pmi2 or PMIx, pass "
                "launcher_args=['--mpi=NAME'] for one it has, or use launcher='mpiexec' inside an allocation."
            )
        return pmi

    def _node_addresses(self) -> list[str]:
        """NodeAddr of the nodes the engines may run on: the allocation's, or every node's."""
        argv = [self._command("sinfo"), "-h", "-N", "-o", "%o"]
        nodelist = os.environ.get("SLURM_JOB_NODELIST") if self.inside else None
        if nodelist:
            argv += ["-n", nodelist]
        out = self._run(argv).stdout
        return list(dict.fromkeys(line.strip() for line in out.splitlines() if line.strip()))

    def _slurmd_port(self) -> int:
        if not self._port:
            config = self._run([self._command("scontrol"), "show", "config"]).stdout
            found = re.search(r"^SlurmdPort\s*=\s*(\d+)", config, re.MULTILINE)
            self._port = int(found[1]) if found else _SLURMD_PORT
        return self._port

    def _running(self) -> bool:
        # Steps have no state column: a step squeue lists is still running.
        fields = ["-s", "-o", "%i"] if self.inside else ["-o", "%i|%T|%N|%r"]
        argv = [self._command("squeue"), "-h", "-j", self.job, *fields]
        try:
            out = self._run(argv).stdout
        except RuntimeError:
            return False
        if self.inside:
            return any(line.split()[0] == self.target for line in out.splitlines() if line.strip())
        rows = [line.strip().split("|") for line in out.splitlines() if line.count("|") == 3]
        self._state = (rows[0][1], rows[0][3], rows[0][2]) if rows else ("", "", "")
        return bool(rows) and rows[0][1] in _NOT_ENDED

    def _lost_among(self, nodelist: str) -> list[str]:
        """The nodes of ``nodelist`` (Slurm's compressed form) whose slurmd does not answer."""
        from mpinb.client._slurm_faults import slurmd_answers

        if not nodelist:
            return []
        try:
            names = self._run([self._command("scontrol"), "show", "hostnames", nodelist]).stdout.split()
            port = self._slurmd_port()
            listing = self._run([self._command("sinfo"), "-h", "-N", "-n", nodelist, "-o", "%N %o"]).stdout
        except (RuntimeError, OSError):
            return []
        addresses = dict(line.split()[:2] for line in listing.splitlines() if len(line.split()) >= 2)
        return [name for name in names if not slurmd_answers(addresses.get(name, name), port)]

    def _run(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(argv, check=False, capture_output=True, text=True, timeout=_PROBE_TIMEOUT)
        except subprocess.TimeoutExpired as err:
            raise RuntimeError(f"`{shlex.join(argv)}` did not answer within {_PROBE_TIMEOUT:g} s: "
                               "is slurmctld reachable (`scontrol ping`)?") from err

    @staticmethod
    def _command(name: str) -> str:
        found = shutil.which(name)
        if found is None:
            raise FileNotFoundError(
                f"{name} not found on PATH: launcher='slurm' needs Slurm's client commands (srun, sbatch, "
                "scancel, squeue, sinfo) on this machine, as on a login node."
            )
        return found


def _slurm_ids() -> dict[str, str]:
    import os

    return {name: os.environ.get(name, "") for name in ("SLURM_JOB_ID", "SLURM_STEP_ID")}


# squeue's states of a job that still holds (or waits for) nodes.
_NOT_ENDED = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "STOPPED",
              "SIGNALING", "STAGE_OUT"}

# sinfo's short node states, in words.
_STATE_WORDS = {"alloc": "allocated", "mix": "mixed", "idle": "idle", "down": "down", "drain": "drained",
                "drng": "draining", "comp": "completing", "fail": "failed", "maint": "maintenance"}
