"""What ``MPICluster(...)`` accepts, checked in one place, and the ipyparallel cluster it describes.

Client. Every argument of ``MPICluster`` is checked here and kept in one frozen record; the
``ipyparallel.Cluster`` of a cluster that ``MPICluster`` starts is made from that record alone. A
new start-up argument is a field here, its check in :meth:`LaunchOptions.check`, and its use in
:meth:`LaunchOptions.make_cluster`.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mpinb._checks import check_int

__all__ = ["PASSED_TO_IPYPARALLEL", "LaunchOptions"]

# The arguments of ipyparallel.Cluster (9.2.0's traits) that MPICluster hands on unchanged. The
# others it sets itself (engines, n, controller_ip, log_level, config) or must not be changed under
# it (engine_launcher_class: the engines are MPI ranks started through mpiexec). Anything else is a
# mistake to report, not an argument to forward: ipyparallel would ignore most of them silently.
PASSED_TO_IPYPARALLEL = frozenset({
    "cluster_file", "cluster_id", "controller_args", "controller_launcher_class", "controller_location",
    "delay", "engine_timeout", "load_profile", "profile", "profile_dir", "send_engines_connection_env",
    "shutdown_atexit",
})


@dataclass(frozen=True)
class LaunchOptions:
    """How to start a cluster: ``MPICluster``'s arguments, checked (see its docstring)."""

    n: int = 4
    mpi_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    threads_per_rank: int | None = None  # None: "auto", each host's cores shared by its ranks
    log_level: int = logging.ERROR
    timeout: float = 120.0
    controller_ip: str | None = None  # None: loopback for mpiexec, the address reaching the nodes for Slurm
    launcher: str = "mpiexec"
    launcher_args: tuple[str, ...] = ()
    config: Any = None
    cluster_kwargs: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def check(
        cls,
        n: int,
        *,
        mpi_args: Sequence[str] | None,
        env: Mapping[str, str] | None,
        threads_per_rank: int | str,
        log_level: str | int,
        timeout: float,
        controller_ip: str | None,
        launcher: str = "mpiexec",
        launcher_args: Sequence[str] | None = None,
        config: Any,
        cluster_kwargs: Mapping[str, Any],
    ) -> LaunchOptions:
        """The options, or the error that names the first argument that is wrong. Local."""
        check_int(n, "n", minimum=1, unit="number of engines")
        if launcher not in ("mpiexec", "slurm"):
            raise ValueError(f"launcher must be 'mpiexec' or 'slurm'; got {launcher!r}.")
        if launcher_args and launcher != "slurm":
            raise ValueError("launcher_args go with launcher='slurm'; mpiexec's arguments are mpi_args.")
        if mpi_args and launcher == "slurm":
            raise ValueError("mpi_args are mpiexec's; with launcher='slurm' pass srun/sbatch arguments as "
                             "launcher_args.")
        if threads_per_rank != "auto":
            check_int(threads_per_rank, "threads_per_rank", minimum=1, alternative="'auto'")
        unknown = sorted(set(cluster_kwargs) - PASSED_TO_IPYPARALLEL)
        if unknown:
            names = ", ".join(repr(name) for name in unknown)
            what = "an unexpected keyword argument" if len(unknown) == 1 else "unexpected keyword arguments"
            raise TypeError(
                f"MPICluster() got {what} {names}; besides its own arguments it passes only these on to "
                f"ipyparallel.Cluster: {', '.join(sorted(PASSED_TO_IPYPARALLEL))}."
            )
        return cls(
            n=n,
            mpi_args=tuple(mpi_args or ()),
            env=dict(env or {}),
            threads_per_rank=None if threads_per_rank == "auto" else int(threads_per_rank),
            log_level=logging.getLevelName(log_level) if isinstance(log_level, str) else int(log_level),
            timeout=float(timeout),
            controller_ip=controller_ip,
            launcher=launcher,
            launcher_args=tuple(launcher_args or ()),
            config=config,
            cluster_kwargs=dict(cluster_kwargs),
        )

    def slurm_engines(self, n: int) -> Any:
        """The Slurm job or step that will run ``n`` engines (:mod:`mpinb.client.slurm`), or
        ``None`` with ``launcher="mpiexec"``. Client."""
        if self.launcher != "slurm":
            return None
        from mpinb.client.slurm import SlurmEngines

        return SlurmEngines(n, self.launcher_args, {"PYTHONUNBUFFERED": "1", **self.env}, self.threads_per_rank)

    @property
    def on_this_machine(self) -> bool:
        """Whether every engine runs here: ``mpiexec`` without a host list. Local."""
        return self.launcher == "mpiexec" and not any(arg.lstrip("-") in _HOST_OPTIONS for arg in self.mpi_args)

    def make_cluster(self, n: int, slurm: Any = None, tmpdir: str | None = None) -> Any:
        """The ``ipyparallel.Cluster`` (not started) for ``n`` MPI engines under these options, as
        the Slurm job or step ``slurm`` when one is given; ``tmpdir`` is the engines' ``TMPDIR``. Client."""
        import ipyparallel as ipp

        from mpinb.client._engine_output import RelayedMPIEngineSetLauncher
        from mpinb.client.launch import find_mpiexec, is_hydra, mpi_env

        # Only a budget the user gave goes into the environment: "auto" is decided on each engine,
        # which knows its host (mpinb._engine.set_up). PYTHONFAULTHANDLER: a rank killed by a fatal
        # signal (a native abort, a segfault) names it on its stderr, for its death report.
        engine_env = {**mpi_env(n, threads_per_rank=self.threads_per_rank, base={}), "PYTHONUNBUFFERED": "1",
                      "PYTHONFAULTHANDLER": "1", **(_LOOPBACK if self.on_this_machine else {}),
                      **({"TMPDIR": tmpdir} if tmpdir else {}), **self.env}
        mpiexec = find_mpiexec()
        # Hydra tags each line with its rank, so that a dead rank's last words can be told from the
        # others' (mpinb.client._engine_output); unless the user chose a prefix of their own.
        tagged = is_hydra(mpiexec) and not any(arg in _PREFIX_OPTIONS for arg in self.mpi_args)
        launch: dict[str, dict[str, Any]]
        engines: Any
        engines, launch, controller_ip = RelayedMPIEngineSetLauncher, {
            "MPILauncher": {"mpi_cmd": [mpiexec], "mpi_args": [*(["-prepend-rank"] if tagged else []),
                                                               *self.mpi_args]},
            "MPIEngineSetLauncher": {"environment": engine_env,
                                     **({"engine_cmd": ENGINE_BOOT} if self.on_this_machine else {})},
        }, self.controller_ip or "127.0.0.1"
        if slurm is not None:  # a Slurm job or step instead: mpinb.client.slurm decides how
            (engines, launch), controller_ip = slurm.settings(), slurm.controller_ip(self.controller_ip)
        # ipyparallel's engine gives up registering after 5 s, and its mpiexec ends with it: a
        # loaded host's controller can take longer to answer (CI: 0 of 2 engines ever registered).
        # An engine waits as long as MPICluster waits for it.
        for name, settings in launch.items():
            if name.endswith("EngineSetLauncher"):
                settings["engine_args"] = [*settings.get("engine_args", ()), f"--IPEngine.timeout={self.timeout:g}"]
        kwargs = dict(self.cluster_kwargs)
        # CURVE on every connection: a process without the controller's public key (it is in the
        # owner-only connection files) completes no handshake, so another account on this host or
        # on the network reads nothing and delivers nothing (a bare TCP port on loopback is open to
        # every local user). ipyparallel passes the key to the engines and the client itself.
        # (A controller given the option twice refuses to start: the user's own choice wins.)
        given = list(kwargs.get("controller_args", ()))
        kwargs["controller_args"] = given if any("enable_curve" in arg for arg in given) else [_CURVE, *given]
        return ipp.Cluster(engines=engines, n=n, controller_ip=controller_ip, log_level=self.log_level,
                           config=_config(launch, self.config), **kwargs)


# The engines of a one-machine cluster: Hydra's wildcard port is confined to loopback from their
# first line (mpinb._engine_boot), then ipyparallel's engine runs with its usual arguments.
ENGINE_BOOT = [sys.executable, "-m", "mpinb._engine_boot"]

_CURVE = "--IPController.enable_curve=True"

# Hydra's options that prefix each line of output.
_PREFIX_OPTIONS = frozenset({"-l", "-prepend-rank", "--prepend-rank", "-prepend-pattern", "--prepend-pattern"})
# mpiexec's options that put ranks on other hosts.
_HOST_OPTIONS = frozenset({"f", "hostfile", "machinefile", "host", "hosts", "hostlist"})
# When every rank runs on this machine, MPI's network transports stay on loopback: UCX (the mpich
# wheel's) and libfabric's TCP provider (conda-forge's MPICH) would otherwise listen on every
# address the machine has. (Hydra's own control port ignores these: it binds every address, and
# the engines filter it to loopback instead, from their first line: ENGINE_BOOT.) Open MPI's ranks
# open a TCP listener on 0.0.0.0 and :: for their TCP transport even when every peer is local; a
# one-machine world needs only shared memory and self. (prterun's own port: the client filters it,
# mpinb._listeners.)
_LOOPBACK = {"UCX_NET_DEVICES": "lo", "FI_TCP_IFACE": "lo", "FI_SOCKETS_IFACE": "lo", "OMPI_MCA_btl": "self,sm"}


def _config(base: dict[str, Any], extra: Any) -> Any:
    from traitlets.config import Config

    config = Config(base)
    if extra is not None:
        config.merge(extra if isinstance(extra, Config) else Config(extra))
    return config
