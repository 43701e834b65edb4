"""The notebook side: an ipyparallel cluster of MPI engines, addressed by MPI rank, leaving nothing behind."""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from mpinb.client._ipp import ENGINE_EXIT, NANNY_SAW_EXIT, engine_deaths, px_magics, stamp_cells
from mpinb.client._processes import descendants, end, kill, remove_files, shared_memory_of
from mpinb.client._tracebacks import install as install_grouped_tracebacks
from mpinb.client._tracebacks import rank_ranges, remember_ranks
from mpinb.client._watchdog import Watchdog
from mpinb.errors import _check_int

__all__ = ["Health", "MPICluster"]


@dataclass(frozen=True)
class Health:
    """Which MPI ranks answered a probe (see :meth:`MPICluster.healthy`); true when all did.

    ``silent`` ranks have engines that did not answer in time (busy, or stuck); ``dead`` ranks have
    no engine any more (it died, and MPI ended the others of its world with it, usually).
    """

    answered: list[int]
    silent: list[int]
    seconds: float = field(default=0.0)
    dead: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.silent and not self.dead

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        if self.ok:
            return f"all {len(self.answered)} ranks answered in {self.seconds:.2f} s"
        parts = []
        if self.dead:
            parts.append(f"{_ranks(self.dead)} {'has' if len(self.dead) == 1 else 'have'} no engine any more "
                         "(it died)")
        if self.silent:
            parts.append(f"{_ranks(self.silent)} did not answer within {self.seconds:.1f} s (busy in a cell, "
                         "or blocked outside mpinb)")
        return "; ".join(parts) + "; MPICluster.restart() starts a fresh set of engines."


class MPICluster:
    """An ipyparallel cluster whose engines form one MPI world, addressed by MPI rank.

    Client: runs in the notebook kernel, never imports ``mpi4py.MPI`` there. Starting it launches a
    controller (listening on the loopback interface by default) and ``n`` engines through
    ``mpiexec``, waits for them, checks that they form one MPI world with ranks ``0..n-1``, and
    activates ``%%px`` on a view ordered by rank. Each engine gets a thread budget and, when the
    machine has fewer cores than ranks, MPICH's yield settings, so ranks don't starve each other.

    Parameters
    ----------
    n : int, default 4
        Number of engines (MPI ranks).
    mpi_args : sequence of str, optional
        Extra ``mpiexec`` arguments (e.g. ``["-hostfile", "hosts"]``).
    env : mapping, optional
        Extra environment variables for the engines.
    threads_per_rank : int or "auto", default "auto"
        BLAS/OpenMP/TensorFlow threads per engine; "auto" shares this machine's cores.
    log_level : str or int, default "ERROR"
        ipyparallel's log level; above ERROR, stopping a cluster prints engine logs into the cell.
    timeout : float, default 120
        Seconds to wait for engines to register.
    controller_ip : str, optional
        Where the controller listens: by default ``127.0.0.1``, and with ``launcher="slurm"`` this
        machine's address that reaches the Slurm nodes. Engines on other hosts need a reachable address.
    launcher : {"mpiexec", "slurm"}, default "mpiexec"
        How the engines start: ``mpiexec`` here (or across a hostfile), or as Slurm tasks: a batch job
        submitted with ``sbatch`` from outside an allocation, an ``srun`` step inside one
        (:mod:`mpinb.client.slurm`).
    launcher_args : sequence of str, optional
        With ``launcher="slurm"``: extra ``sbatch``/``srun`` arguments, e.g.
        ``["--partition=debug", "--time=00:30:00", "--account=proj"]`` (``--mpi=NAME`` picks the PMI).
    start : bool, default True
        Start immediately; with ``False`` call :meth:`start` (or use ``with``).
    config : traitlets.config.Config or dict, optional
        Extra ipyparallel configuration, merged last (e.g. another engine command).
    cluster_kwargs
        Passed to :class:`ipyparallel.Cluster` (``profile_dir``, ``cluster_id``, ...).

    Examples
    --------
    >>> with mpinb.MPICluster(n=4) as cluster:
    ...     cluster.view.execute("import mpinb; w = mpinb.world()")
    ...     cluster.pull("w")[0].size
    4
    """

    def __init__(
        self,
        n: int = 4,
        *,
        mpi_args: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        threads_per_rank: int | str = "auto",
        log_level: str | int = "ERROR",
        timeout: float = 120.0,
        controller_ip: str | None = None,
        launcher: str = "mpiexec",
        launcher_args: Sequence[str] | None = None,
        start: bool = True,
        config: Any = None,
        **cluster_kwargs: Any,
    ) -> None:
        _check_int(n, "n", minimum=1, unit="number of engines")
        if threads_per_rank != "auto":
            _check_int(threads_per_rank, "threads_per_rank", minimum=1, alternative="'auto'")
        self.n = n
        self.timeout = float(timeout)
        self._mpi_args = list(mpi_args or [])
        self._env = dict(env or {})
        self._threads = threads_per_rank
        self._log_level = logging.getLevelName(log_level) if isinstance(log_level, str) else int(log_level)
        self._controller_ip = controller_ip
        if launcher not in ("mpiexec", "slurm"):
            raise ValueError(f"launcher must be 'mpiexec' or 'slurm'; got {launcher!r}.")
        if launcher_args and launcher != "slurm":
            raise ValueError("launcher_args go with launcher='slurm'; mpiexec's arguments are mpi_args.")
        if mpi_args and launcher == "slurm":
            raise ValueError("mpi_args are mpiexec's; with launcher='slurm' pass srun/sbatch arguments as "
                             "launcher_args.")
        self._launcher, self._launcher_args = launcher, list(launcher_args or [])
        self._slurm: Any = None  # mpinb.client.slurm.SlurmEngines, for launcher="slurm"
        self._config = config
        self._cluster_kwargs = cluster_kwargs
        self.cluster: Any = None
        self.client: Any = None
        self.view: Any = None
        self._ids_by_rank: list[int] = []
        self._engine_pids: list[int] = []
        self._engine_hosts: list[str] = []
        self._owns_cluster = True
        self._on_start: list[str] = []
        self._shared_memory: set[str] = set()  # MPI's segments in /dev/shm, removed by stop()
        self._watchdog: Watchdog | None = None  # only for a cluster this object started
        if start:
            self.start()

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> MPICluster:
        """Start the controller and engines, wait for them and check the MPI world. Client."""
        if self.cluster is not None:
            return self
        if not self._owns_cluster:
            raise RuntimeError("This MPICluster joined a cluster it did not start (connect()); it cannot start one.")
        import ipyparallel as ipp

        from mpinb.client.launch import find_mpiexec, mpi_env

        threads = None if self._threads == "auto" else int(self._threads)
        base_env = mpi_env(self.n, threads_per_rank=threads, base={})
        engine_env = {**base_env, "PYTHONUNBUFFERED": "1", **self._env}
        engines, launch, controller_ip = "mpi", {
            "MPILauncher": {"mpi_cmd": [find_mpiexec()], "mpi_args": self._mpi_args},
            "MPIEngineSetLauncher": {"environment": engine_env},
        }, self._controller_ip or "127.0.0.1"
        if self._launcher == "slurm":  # a Slurm job or step instead: mpinb.client.slurm decides how
            from mpinb.client.slurm import SlurmEngines

            slurm_env = {"PYTHONUNBUFFERED": "1", **self._env}
            self._slurm = SlurmEngines(self.n, self._launcher_args, slurm_env, threads)
            (engines, launch), controller_ip = self._slurm.settings(), self._slurm.controller_ip(self._controller_ip)
        config = _config(launch, self._config)
        self.cluster = ipp.Cluster(
            engines=engines,
            n=self.n,
            controller_ip=controller_ip,
            log_level=self._log_level,
            config=config,
            **self._cluster_kwargs,
        )
        # Before any process starts: whatever happens to this process from now on, the cluster ends
        # with it (mpinb.client._watchdog).
        self._watchdog = Watchdog()
        try:
            self._cancel_on_death()
            self.cluster.start_cluster_sync()
            self._watch_launchers()
            self.client = self.cluster.connect_client_sync()
            self._identify(self._wait_for_new_engines(set()))
            self._cancel_on_death()
            self._watchdog.watch(self._local_engine_pids)
            self._protect_files()
            self._shared_memory = shared_memory_of(self._local_engine_pids)
        except BaseException:
            self.stop()
            raise
        return self

    @classmethod
    def connect(
        cls, *, profile: str | None = None, profile_dir: str | None = None, cluster_id: str = "", timeout: float = 60.0
    ) -> MPICluster:
        """Attach to a running cluster, e.g. one started with ``ipcluster start --engines=MPI -n 4``.

        Client. The engines must be MPI ranks of one world. Without ``cluster_id``, the newest
        cluster of the profile whose controller runs (a ``LookupError`` lists the ids found when
        none does). :meth:`stop` on a connected cluster only disconnects; :meth:`restart` works
        when ipyparallel's cluster file is available.
        """
        import ipyparallel as ipp

        from mpinb.client._profiles import newest_cluster_id

        # ipp.Cluster() names its connection files by an id the user rarely knows: the newest running.
        cluster_id = cluster_id or newest_cluster_id(profile, profile_dir)
        # A whole object (every attribute __init__ sets), marked as joined rather than owned:
        # stop() then leaves the cluster running and start() refuses.
        self = cls(1, timeout=timeout, start=False)
        self._owns_cluster = False
        try:
            self.cluster = ipp.Cluster.from_file(profile=profile, profile_dir=profile_dir, cluster_id=cluster_id)
            self.client = self.cluster.connect_client_sync()
        except Exception:  # noqa: BLE001 - no cluster file: connect by profile alone
            kwargs = {k: v for k, v in (("profile", profile), ("profile_dir", profile_dir)) if v}
            self.client = ipp.Client(cluster_id=cluster_id or None, **kwargs)
        self.client.wait_for_engines(1, timeout=self.timeout)
        self.n = len(self.client.ids)
        self._identify(sorted(self.client.ids))
        return self

    def stop(self) -> None:
        """Stop engines, ``mpiexec`` and the controller, and make sure no process is left. Client.

        Processes that outlive ipyparallel's own shutdown (an engine stuck in a collective keeps
        spinning; ``mpiexec`` ignores SIGTERM for seconds) are killed.
        """
        pids = self._tracked_pids()
        if self.client is not None:
            try:
                self.client.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass
        if self.cluster is not None and self._owns_cluster:
            if self._slurm is not None:  # engines on other nodes: only Slurm can end them
                self._slurm.cancel()
            self._kill_engines()
            try:
                self.cluster.stop_cluster_sync()
            except Exception:  # noqa: BLE001 - already dead processes
                pass
            end(pids, grace=5.0)
            # MPI's shared-memory segments outlive engines that did not finalize (SIGKILLed above, or
            # dead before): remove this world's, found in the engines' memory maps at start.
            remove_files(self._shared_memory)
            self._shared_memory = set()
        if self._watchdog is not None:
            self._watchdog.release()
            self._watchdog = None
        self.client = self.view = None
        if self._owns_cluster:
            self.cluster = None
        self._ids_by_rank = []

    def restart(self, *, timeout: float | None = None) -> MPICluster:
        """Replace every engine by a fresh MPI world of the same size and wait for the new one. Client.

        The last resort, for a rank stuck outside mpinb: in its own raw MPI call or in C code, where
        neither a deadline nor SIGINT reaches it. (A rank waiting in an mpinb collective stops at its
        deadline or at :meth:`interrupt`, and the next cells work without a restart.) The engines'
        namespaces are lost. A cluster this object started gets a fresh controller too, so that
        engine ids are MPI ranks again (``%%px`` output headers ``[stdout:1]`` name rank 1) and
        ``cluster.client``/``cluster.view`` are new objects; a joined cluster (:meth:`connect`)
        keeps its controller, and its new engines get new ids (addressed by rank as always).
        """
        if self._owns_cluster and self.cluster is not None:
            saved = self.timeout
            self.timeout = saved if timeout is None else float(timeout)
            try:
                self.stop()
                self.start()
            finally:
                self.timeout = saved
            return self
        if self.cluster is None:
            raise RuntimeError("restart() needs a cluster started by MPICluster or found from its cluster file.")
        # A joined cluster, found from its cluster file: new engines under its own controller.
        old = self._engine_keys()
        self._kill_engines()
        self.cluster.stop_engines_sync()
        self.cluster.start_engines_sync(self.n)
        self._identify(self._wait_for_new_engines(old, timeout=timeout))
        return self

    def healthy(self, timeout: float = 5.0) -> Health:
        """Probe every engine; name the MPI ranks that are dead or do not answer within ``timeout`` seconds.

        Client. Never raises for a dead or stuck engine: it reports it.
        """
        t0 = time.perf_counter()
        try:
            alive = set(self.client.ids)
        except Exception:  # noqa: BLE001 - a closed client: nothing answers
            alive = set()
        dead = [rank for rank, eid in enumerate(self._ids_by_rank) if eid not in alive]
        pending = {}
        for rank, eid in enumerate(self._ids_by_rank):
            if eid in alive:
                try:
                    pending[rank] = self.client[eid].apply_async(_rank_here)
                except Exception:  # noqa: BLE001 - unregistered between the two looks
                    dead.append(rank)
        deadline = t0 + timeout
        while time.perf_counter() < deadline and not all(ar.ready() for ar in pending.values()):
            time.sleep(0.02)
        silent = [rank for rank, ar in pending.items() if not ar.ready()]
        answered = [rank for rank, ar in pending.items() if ar.ready() and ar.successful()]
        dead += [rank for rank, ar in pending.items() if ar.ready() and not ar.successful()]
        for rank in silent:
            try:  # don't leave the probe queued behind the stuck cell
                self.client.abort(pending[rank].msg_ids)
            except Exception:  # noqa: BLE001
                pass
        return Health(answered=answered, silent=silent, seconds=time.perf_counter() - t0, dead=sorted(dead))

    def deaths(self) -> str | None:
        """Which ranks died, and how, as MPI's launcher reported it (``None`` when it did not). Client.

        ``"rank 1 (engine 1, pid 4242) died (SIGKILL); MPI ended the other ranks with it: cluster.restart()
        starts a fresh set of engines."`` A ``%%px`` cell whose engines died says the same.
        """
        if self.cluster is None:
            return None
        give_up = time.monotonic() + 1.0  # mpiexec's report (with the signal) may follow the nannies
        while True:
            text = ""
            for launcher in list(self.cluster.engines.values()):
                try:
                    text += launcher.get_output() or ""
                except Exception:  # noqa: BLE001 - no output file
                    continue
            if not NANNY_SAW_EXIT.search(text) or ENGINE_EXIT.search(text) or time.monotonic() > give_up:
                break
            time.sleep(0.05)
        found = []
        for engine, pid, how in engine_deaths(text):
            rank = self._ids_by_rank.index(engine) if engine in self._ids_by_rank else None
            if rank is None and pid in self._engine_pids:
                rank = self._engine_pids.index(pid)
            found.append(f"rank {rank if rank is not None else '?'} (engine {engine}, pid {pid}) died"
                         + (f" ({how})" if how != "its process ended" else ""))
        if not found:
            return None
        return "; ".join(found) + "; MPI ended the other ranks with it: cluster.restart() starts a fresh set of engines."

    def on_start(self, code: str) -> None:
        """Run ``code`` on every engine now, and again on the fresh engines after every :meth:`restart`. Client.

        For the setup cells a notebook would otherwise replay by hand (imports, data loading):
        ``cluster.on_start("import mpinb; X, y = mpinb.data.load_digits()")``. Each piece of code
        runs in the order given; an error raises here as from ``%%px``.
        """
        if not isinstance(code, str):
            raise TypeError(f"on_start takes code as a string; got {type(code).__name__}.")
        self._on_start.append(code)
        if self.view is not None:
            self.view.execute(code, block=True)

    def interrupt(self) -> None:
        """Send SIGINT to every engine, like Ctrl-C on each rank. Client.

        Interrupting the notebook kernel stops only the client's wait; the engines keep running.
        mpinb's long loops (``KMeans.fit``, ``mpinb.keras.fit``) turn SIGINT into a collective stop,
        so every rank leaves at the same iteration and raises ``KeyboardInterrupt``; a rank waiting
        in any mpinb collective stops waiting and raises ``KeyboardInterrupt`` -- inside such a loop
        and on a TensorFlow thread too, at the latest ``mpinb.interrupt.INTERRUPT_GRACE`` (5 s) after
        the signal (the next collective works again); plain Python code is interrupted as usual. A rank blocked inside
        its own raw MPI call does not react: use :meth:`restart` then.
        """
        import signal as _signal

        local = self._local_engine_pids
        if local and len(local) == len(self._engine_pids):
            for pid in local:
                os.kill(pid, _signal.SIGINT)
        elif self._slurm is not None:  # srun does not pass a single SIGINT on: Slurm signals the tasks
            self._slurm.signal(_signal.SIGINT)
        elif self.cluster is not None:  # engines on other hosts: ask their launcher
            self.cluster.signal_engines_sync(_signal.SIGINT)
        else:
            raise RuntimeError("interrupt() needs engines on this host or a cluster file to signal them.")

    def __enter__(self) -> MPICluster:
        return self.start() if self._owns_cluster else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.client is not None else "stopped"
        how = ""
        if self._slurm is not None and self.cluster is not None:
            how = f" {self._slurm.describe()} controller={self.cluster.controller_ip}"
        return f"<MPICluster n={self.n} {state} ranks->engines={self._ids_by_rank}{how}>"

    # -- rank-ordered data ---------------------------------------------------------------------

    @property
    def ids_by_rank(self) -> list[int]:
        """Engine id of each MPI rank: ``ids_by_rank[r]`` is rank r's engine."""
        return list(self._ids_by_rank)

    def pull(self, name: str) -> list[Any]:
        """The value of ``name`` in every engine's namespace, as a list indexed by MPI rank. Client."""
        import ipyparallel as ipp

        pairs = self._view().apply_sync(_with_rank, ipp.Reference(name))
        return [value for _, value in sorted(pairs, key=lambda pair: pair[0])]

    def pull_root(self, name: str) -> Any:
        """The value of ``name`` on MPI rank 0. Client."""
        return self.client[self._ids_by_rank[0]].pull(name, block=True)

    def gather(self, name: str) -> Any:
        """Concatenate each rank's ``name`` (arrays along axis 0, or lists) in MPI rank order. Client."""
        parts = self.pull(name)
        if all(isinstance(p, np.ndarray) for p in parts):
            return np.concatenate([np.atleast_1d(p) for p in parts])
        if all(isinstance(p, (list, tuple)) for p in parts):
            return [item for p in parts for item in p]
        return np.concatenate([np.atleast_1d(np.asarray(p)) for p in parts])

    def scatter(self, name: str, array: Any) -> None:
        """Give each rank its balanced, contiguous share of ``array`` (rows) as ``name``. Client.

        For small data already in the notebook; large data should be loaded by the ranks themselves
        (:mod:`mpinb.data`).
        """
        from mpinb.shards import shard_bounds

        data = np.asarray(array) if not hasattr(array, "shape") else array
        if len(data.shape) == 0:
            raise ValueError("scatter() cuts rows along axis 0; got a 0-d value.")
        size = len(self._ids_by_rank)
        futures = []
        for rank, eid in enumerate(self._ids_by_rank):
            lo, hi = shard_bounds(int(data.shape[0]), rank=rank, size=size)
            futures.append(self.client[eid].push({name: data[lo:hi]}, block=False))
        for fut in futures:
            fut.get(self.timeout)

    # -- internals -----------------------------------------------------------------------------

    def _view(self) -> Any:
        if self.view is None:
            raise RuntimeError("this MPICluster is stopped; start() or restart() it first.")
        return self.view

    def _engine_keys(self) -> set[Any]:
        """An identity per registered engine that survives id reuse: the engine's uuid."""
        if self.client is None:
            return set()
        uuids = getattr(self.client, "_engines", {})
        return {(eid, uuids.get(eid)) for eid in self.client.ids}

    def _wait_for_new_engines(self, old: set[Any], timeout: float | None = None) -> list[int]:
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while True:
            # After a restart the hub may still list dead engines, or hand their ids to the new
            # ones: an engine is new when its (id, uuid) was not registered before.
            new = {eid for eid, _ in self._engine_keys() - old}
            if len(new) >= self.n:
                return sorted(new)
            if self._slurm is not None and (why := self._slurm.failure(list(self.cluster.engines.values()))):
                raise RuntimeError(why)
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"only {len(new)} of {self.n} MPI engines registered within {limit:.0f} s; "
                    "check `mpinb info` and the engines' log in the profile directory."
                )
            time.sleep(0.05)

    def _identify(self, ids: list[int]) -> None:
        view = self.client.direct_view(targets=ids)
        found = view.apply_sync(_engine_identity)
        by_eid = dict(zip(ids, found))
        sizes = {info["size"] for info in found}
        ranks = sorted(info["rank"] for info in found)
        if sizes != {len(ids)} or ranks != list(range(len(ids))):
            raise RuntimeError(
                f"the {len(ids)} engines do not form one MPI world (ranks {ranks}, world sizes {sorted(sizes)}); "
                "start them with `ipcluster start --engines=MPI` or MPICluster()."
            )
        self._ids_by_rank = [eid for eid, _ in sorted(by_eid.items(), key=lambda item: item[1]["rank"])]
        self._engine_pids = [by_eid[eid]["pid"] for eid in self._ids_by_rank]
        self._engine_hosts = [by_eid[eid]["host"] for eid in self._ids_by_rank]
        remember_ranks(self._ids_by_rank)
        stamp_cells(self.client)  # every engine learns which cell a request belongs to
        self.view = self.client.direct_view(targets=self._ids_by_rank)
        self.view.block = True
        _activate(self.view, self.deaths)
        # mpinb's collective set-up now, on every engine together: from the first cell on, a
        # collective that times out can name the missing ranks and say where each of them is.
        self.view.apply_sync(_set_up_collectives, self._owns_cluster)
        for code in self._on_start:  # fresh engines after restart(): the setup the notebook asked for
            self.view.execute(code, block=True)

    def _protect_files(self) -> None:
        """Owner-only modes for everything in the profile's security folder. ipyparallel already
        writes the connection files (which hold the key) 0600; its cluster file (launcher state and
        pids, no key) is 0644, and there is no reason for others to read it either."""
        security = os.path.join(str(self.cluster.profile_dir), "security")
        if os.path.isdir(security):
            os.chmod(security, 0o700)
            for name in os.listdir(security):
                os.chmod(os.path.join(security, name), 0o600)

    def _tracked_pids(self) -> list[int]:
        pids = list(self._local_engine_pids)
        if self.cluster is not None:
            launchers = [self.cluster.controller, *self.cluster.engines.values()]
            for launcher in launchers:
                pid = getattr(launcher, "pid", None) if launcher is not None else None
                if pid:
                    pids.append(pid)
                    pids.extend(descendants(pid))
        return sorted(set(pids))

    @property
    def _local_engine_pids(self) -> list[int]:
        """Engine PIDs on this host: a PID means something only on its own host, so these are the
        only ones this machine may signal."""
        here = socket.gethostname()
        return [pid for pid, host in zip(self._engine_pids, self._engine_hosts) if host == here]

    def _cancel_on_death(self) -> None:
        """A Slurm job's engines run where no PID of ours reaches: the watchdog cancels the job."""
        if self._slurm is not None and self._watchdog is not None:
            if self.view is not None:
                self._slurm.identify(list(self.cluster.engines.values()), self.client[self._ids_by_rank[0]])
            self._watchdog.on_death(self._slurm.cancel_command())

    def _watch_launchers(self) -> None:
        """Give the watchdog the controller's and mpiexec's PIDs (it ends their trees too)."""
        if self._watchdog is None or self.cluster is None:
            return
        launchers = [self.cluster.controller, *self.cluster.engines.values()]
        self._watchdog.watch(getattr(launcher, "pid", None) for launcher in launchers if launcher is not None)

    def _kill_engines(self) -> None:
        """SIGKILL the engines' mpiexec trees: graceful stops wait on ranks that may be spinning."""
        if self.cluster is None:
            return
        for launcher in list(self.cluster.engines.values()):
            pid = getattr(launcher, "pid", None)
            if pid:
                for child in [*descendants(pid), pid]:
                    kill(child)
        for pid in self._local_engine_pids:
            kill(pid)


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + rank_ranges(ranks)


def _engine_identity() -> dict[str, Any]:
    import os
    import socket

    from mpi4py import MPI

    return {
        "rank": MPI.COMM_WORLD.Get_rank(),
        "size": MPI.COMM_WORLD.Get_size(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }


def _set_up_collectives(quiet_tensorflow: bool) -> None:
    import mpinb

    mpinb.world(timeout=120)
    if quiet_tensorflow:
        # Engines we started: TensorFlow's C++ start-up lines would print once per rank in %%px.
        from mpinb._quiet_tf import quiet_future_import

        quiet_future_import()


def _rank_here() -> int:
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank()


def _with_rank(value: Any) -> tuple[int, Any]:
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank(), value


def _config(base: dict[str, Any], extra: Any) -> Any:
    from traitlets.config import Config

    config = Config(base)
    if extra is not None:
        config.merge(extra if isinstance(extra, Config) else Config(extra))
    return config


def _activate(view: Any, deaths: Any = None) -> None:
    """Make ``view`` the target of ``%%px`` in a notebook, with errors grouped by rank.

    What ``view.activate()`` does, except that output is shown when every rank is done rather than
    streamed: streamed, each rank's error prints on its own as it arrives (16 ranks, 16
    tracebacks); at the end, identical errors show once, with the ranks that raised them.
    ``%%px --stream`` (or ``%pxconfig --stream``) streams again.
    """
    install_grouped_tracebacks()
    try:
        from IPython import get_ipython
    except ImportError:
        return
    ip = get_ipython()
    if ip is not None:
        magics = px_magics(ip, view, deaths)
        magics.stream_output = False
        ip.magics_manager.register(magics)


