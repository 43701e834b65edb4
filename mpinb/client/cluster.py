"""The notebook side: an ipyparallel cluster of MPI engines, addressed by MPI rank, leaving nothing behind."""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from mpinb import _engine, _progress, _roles, _shadow
from mpinb.client import _health, _targets
from mpinb.client._exits import ExitOrder
from mpinb.client._health import Health
from mpinb.client._ipp import group_composite_errors, stamp_cells
from mpinb.client._lifecycle import Joined, Owned, tracked_pids
from mpinb.client._options import LaunchOptions
from mpinb.client._tracebacks import remember_ranks

if TYPE_CHECKING:
    from mpinb.client.monitor import RankMonitor

__all__ = ["Health", "MPICluster"]

_SIGNAL_WAIT = 5.0  # seconds interrupt() waits for the engines' nannies to confirm the signal


class MPICluster:
    """An ipyparallel cluster whose engines form one MPI world, addressed by MPI rank.

    Client: runs in the notebook kernel, never imports ``mpi4py.MPI`` there. Starting it launches a
    controller (listening on the loopback interface by default) and ``n`` engines through
    ``mpiexec``, waits for them, checks that they form one MPI world with ranks ``0..n-1``, and
    activates ``%%px`` on a view ordered by rank. Each engine gets a thread budget (its host's cores
    shared among that host's ranks, unless ``threads_per_rank`` says otherwise) and, when the
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
        BLAS/OpenMP/TensorFlow threads per engine; "auto" shares each host's cores among the ranks
        on that host (decided on the engines, as :func:`mpinb.limit_threads` does).
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
        Passed to :class:`ipyparallel.Cluster`: ``profile``, ``profile_dir``, ``cluster_id``, ``cluster_file``,
        ``controller_args``, ``controller_launcher_class``, ``controller_location``, ``delay``,
        ``engine_timeout``, ``load_profile``, ``send_engines_connection_env``, ``shutdown_atexit``.

    Raises
    ------
    TypeError
        For any other keyword argument (naming it), or ``n``/``threads_per_rank`` not an integer.

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
        options = LaunchOptions.check(
            n, mpi_args=mpi_args, env=env, threads_per_rank=threads_per_rank, log_level=log_level, timeout=timeout,
            controller_ip=controller_ip, launcher=launcher, launcher_args=launcher_args, config=config,
            cluster_kwargs=cluster_kwargs,
        )
        self.n = options.n
        self.timeout = options.timeout
        self.cluster: Any = None
        self.client: Any = None
        self.view: Any = None
        self._ids_by_rank: list[int] = []
        self._engine_pids: list[int] = []
        self._engine_hosts: list[str] = []
        self._devices: list[str] = []
        self._exits: ExitOrder | None = None  # which local engine ended first, once one has
        self._on_start: list[str] = []
        self._since = ""  # when its engines were last identified (the name %%px notices give it)
        self._restarting = False
        self._path: Owned | Joined = Owned(options)  # connect() makes it Joined
        self._monitor: Any = None  # the rank panel, made by monitor()
        if start:
            self.start()

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> MPICluster:
        """Start the controller and engines, wait for them and check the MPI world. Client."""
        _shadow.check("this kernel")  # a folder named mpinb here: the engines would import it too
        if self.cluster is None:
            began = time.monotonic()
            crowded = _crowding(self._path)
            if crowded:
                _say(crowded)
            self._path.start(self)
            if crowded:
                _say(f"the {self.n} ranks started in {time.monotonic() - began:.1f} s; {_footprint(self)}.")
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
        # A whole object (every attribute __init__ sets), holding a joined cluster rather than an
        # owned one: stop() then leaves the cluster running and start() refuses.
        self = cls(1, timeout=timeout, start=False)
        self._path = Joined()
        self._path.connect(self, profile, profile_dir, cluster_id)
        return self

    def stop(self) -> None:
        """Stop engines, ``mpiexec`` and the controller, and make sure no process is left. Client.

        Processes that outlive ipyparallel's own shutdown (an engine stuck in a collective keeps
        spinning; ``mpiexec`` ignores SIGTERM for seconds) are killed. A joined cluster
        (:meth:`connect`) keeps running: this only disconnects from it.
        """
        self._path.stop(self)
        if self._exits is not None:
            self._exits.close()
            self._exits = None
        if not self._restarting:
            _targets.stopped(self)  # %%px goes back to the newest cluster still running, if it ran here

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
        if self.cluster is None:
            raise RuntimeError("restart() needs a cluster started by MPICluster or found from its cluster file.")
        self._restarting = True  # the same cluster again: %%px stays on it
        try:
            self._path.restart(self, timeout)
        finally:
            self._restarting = False
        return self

    def activate(self) -> MPICluster:
        """Make ``%%px`` run on this cluster's ranks. Client.

        A cluster activates ``%%px`` when it starts; with several, the newest running one holds it,
        and each change is said in one line. When the cluster ``%%px`` runs on stops, ``%%px`` goes
        back to the newest one still running.
        """
        if self.view is None:
            raise RuntimeError("activate() needs a running cluster; this MPICluster is stopped: start() it first.")
        _targets.point_px_at(self)
        return self

    def healthy(self, timeout: float = 5.0) -> Health:
        """Probe every engine; name the MPI ranks that are dead or do not answer within ``timeout`` seconds.

        Client. Never raises for a dead or stuck engine: it reports it.
        """
        return _health.ask_every_engine(self.client, self._ids_by_rank, timeout)

    def deaths(self) -> str | None:
        """Which ranks died, and how, as MPI's launcher reported it (``None`` when it did not). Client.

        ``"rank 1 (engine 1, pid 4242) died (SIGKILL); MPI ended the other ranks with it: cluster.restart()
        starts a fresh set of engines."`` A ``%%px`` cell whose engines died says the same. With
        ``launcher="slurm"``, a node whose slurmd no longer answers comes first: ``"ranks 2-3 (node2)
        were lost with their node: its slurmd does not answer (Slurm says allocated); ranks 0-1 are
        alive; ..."``, with srun's word on the ranks that ended after.
        """
        if self.cluster is None:
            return None
        slurm = self._path.slurm
        if slurm is not None and self._engine_hosts:  # a lost node reports nothing itself: ask Slurm's nodes
            lost = slurm.node_loss(self._engine_hosts, _health.registered(self.client, self._ids_by_rank),
                                   list(self.cluster.engines.values()))
            if lost is not None:
                return lost
        first = self._exits.first(self._engine_pids) if self._exits is not None else None
        together = self._exits.together(self._engine_pids) if self._exits is not None else set()
        known = self.client is not None and len(_health.registered(self.client, self._ids_by_rank)) < len(
            self._ids_by_rank)  # the controller already lists fewer engines: one died
        return _health.deaths(self.cluster, self._ids_by_rank, self._engine_pids, first, together, known)

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
        import signal

        from mpinb.client._processes import send

        if self.client is None:
            raise RuntimeError("interrupt() needs a running cluster; this MPICluster is stopped.")
        if self._path.slurm is not None:  # srun keeps a single SIGINT to itself: Slurm signals the tasks
            self._path.slurm.signal(signal.SIGINT)
            return
        here = socket.gethostname()
        alive = set(self.client.ids)
        remote = []
        for eid, pid, host in zip(self._ids_by_rank, self._engine_pids, self._engine_hosts, strict=True):
            if host == here:
                # Straight to the process: ipyparallel's way passes through the controller and the
                # engine's nanny, two more processes a loaded machine may schedule late.
                send(pid, signal.SIGINT)
            elif eid in alive:
                remote.append(eid)
        if remote:
            # ipyparallel's own signal request, as %%px's Stop button sends it: each engine's nanny
            # signals its engine, on the host where it runs.
            sent = self.client.send_signal(signal.SIGINT, targets=remote, block=False)
            try:
                sent.result(timeout=_SIGNAL_WAIT)
            except Exception:  # noqa: BLE001 - an engine gone meanwhile (healthy() names it); the others got theirs
                pass

    def monitor(self) -> RankMonitor:
        """The live rank panel: one row per MPI rank with what it does now (idle, its cell's line,
        the collective it waits in and for whom, or computing outside mpinb), its fit's progress,
        its last step's compute / exchange / wait, its memory, and the slowest rank marked. Client.

        Displayed in a notebook it refreshes twice a second while cells run and freezes when they
        end; ``print`` gives the same rows as text. The ranks publish their state themselves from
        a thread, so the panel works while a cell runs and never queues work behind one.
        """
        from mpinb.client.monitor import RankMonitor

        if self.client is None:
            raise RuntimeError("monitor() needs a running cluster; this MPICluster is stopped: start() it first.")
        if self._monitor is None:
            self._monitor = RankMonitor(self)
        return self._monitor

    def __enter__(self) -> MPICluster:
        return self._path.enter(self)

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.client is not None else "stopped"
        how = ""
        if self._path.slurm is not None and self.cluster is not None:
            how = f" {self._path.slurm.describe()} controller={self.cluster.controller_ip}"
        return f"<MPICluster n={self.n} {state} ranks->engines={self._ids_by_rank}{_devices_text(self._devices)}{how}>"

    # -- rank-ordered data ---------------------------------------------------------------------

    @property
    def devices(self) -> list[str]:
        """Each MPI rank's device, by rank: ``"GPU 0"``, ``"GPU 1, shared by 2 ranks, 4000 MiB"``,
        ``"CPU"`` (see :func:`mpinb.keras.use_one_gpu_per_rank`); empty while stopped. Client."""
        return list(self._devices) if self.client is not None else []

    @property
    def ids_by_rank(self) -> list[int]:
        """Engine id of each MPI rank: ``ids_by_rank[r]`` is rank r's engine."""
        return list(self._ids_by_rank)

    def pull(self, name: str) -> list[Any]:
        """The value of ``name`` in every engine's namespace, as a list indexed by MPI rank. Client."""
        import ipyparallel as ipp

        pairs = self._view().apply_sync(_engine.with_rank, ipp.Reference(name))
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

    # -- internals (shared by both kinds of cluster: mpinb.client._lifecycle) -------------------

    def _view(self) -> Any:
        if self.view is None:
            raise RuntimeError("this MPICluster is stopped; start() or restart() it first.")
        return self.view

    def _identify(self, ids: list[int]) -> None:
        """Learn which engine is which rank, check they form one world, and set every engine up."""
        _roles.note_cluster(self)  # from now on, a collective typed in this client raises (mpinb._roles)
        from mpinb.client.monitor import keep_rank_messages

        # Early: before the ranks publish (from _progress.start on), so none of their messages is
        # lost, and before mpinb's requests, so few are in flight while the client's metadata is replaced.
        keep_rank_messages(self.client)
        view = self.client.direct_view(targets=ids)
        found = view.apply_sync(_engine.identity)
        by_eid = dict(zip(ids, found, strict=True))
        sizes = {info["size"] for info in found}
        ranks = sorted(info["rank"] for info in found)
        if sizes != {len(ids)} or ranks != list(range(len(ids))):
            raise RuntimeError(
                f"the {len(ids)} engines do not form one MPI world (ranks {ranks}, world sizes {sorted(sizes)}); "
                "start them with `ipcluster start --engines=MPI` or MPICluster()."
            )
        self._ids_by_rank = [eid for eid, _ in sorted(by_eid.items(), key=lambda item: item[1]["rank"])]
        # Before any request waits for its output: a fresh engine's output can be dropped for a moment.
        _health.output_flows(self.client, self._ids_by_rank, self.timeout)
        self._engine_pids = [by_eid[eid]["pid"] for eid in self._ids_by_rank]
        self._engine_hosts = [by_eid[eid]["host"] for eid in self._ids_by_rank]
        if self._exits is None:
            self._exits = ExitOrder()
        self._exits.watch(self._local_engine_pids)
        remember_ranks(self._ids_by_rank, self.deaths)
        group_composite_errors()  # view.execute's errors too, not only %%px's, by rank
        stamp_cells(self.client)  # every engine learns which cell a request belongs to
        self.view = self.client.direct_view(targets=self._ids_by_rank)
        self.view.block = True
        self._since = time.strftime("%H:%M:%S")
        _targets.point_px_at(self)
        self.client._mpinb_tell = _weak_tell(self)
        # mpinb's collective set-up (and each rank's thread budget) now, on every engine together.
        self._devices = list(self.view.apply_sync(_engine.set_up, self._path.started_by_mpinb, self._path.one_machine))
        self.view.apply_sync(_progress.start)  # each rank publishes its state for monitor(), from now on
        if self._path.started_by_mpinb:  # a rank killed by a fatal signal names it, and its last words (deaths())
            from mpinb.client._engine_output import fatal_signals_to_launcher, grab_fd
            from mpinb.client._launcher_output import relays_of

            pipes = self.view.apply_sync(fatal_signals_to_launcher)
            relays = relays_of(self.cluster)
            for rank, (found, host) in enumerate(zip(pipes, self._engine_hosts, strict=True)):
                if found and relays and host == socket.gethostname() and (copy := grab_fd(*found)) is not None:
                    relays[0].keep_unread(rank, found[0], copy)
        for code in self._on_start:  # fresh engines after restart(): the setup the notebook asked for
            self.view.execute(code, block=True)

    def _disconnect(self) -> None:
        if self.client is not None:
            try:
                self.client.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass
        self.client = self.view = None
        self._ids_by_rank = []
        self._devices = []

    def _tell(self) -> None:
        """Say what the user should know since the last request: engine output the disk could not keep."""
        from mpinb.client._launcher_output import relays_of

        for relay in relays_of(self.cluster):
            note = relay.news()
            if note:
                _say(note)

    def _tracked_pids(self) -> list[int]:
        return tracked_pids(self)

    @property
    def _watchdog(self) -> Any:
        """The watchdog of a cluster this object started (None otherwise, and once stopped)."""
        return self._path.watchdog

    @property
    def _local_engine_pids(self) -> list[int]:
        """Engine PIDs on this host: a PID means something only on its own host, so these are the
        only ones this machine may signal."""
        here = socket.gethostname()
        return [pid for pid, host in zip(self._engine_pids, self._engine_hosts, strict=True) if host == here]


def _devices_text(devices: list[str]) -> str:
    """`` devices=...`` for the repr: one word when every rank has the same kind (CPU), else by rank."""
    if not devices:
        return ""
    if len(set(devices)) == 1 and not devices[0].startswith("GPU"):
        return f" devices={devices[0]}"
    return " devices=[" + ", ".join(devices) + "]"


def _say(text: str) -> None:
    print(f"mpinb: {text}", file=sys.stderr, flush=True)


def _weak_tell(cluster: MPICluster) -> Any:
    """``cluster._tell``, without keeping ``cluster`` alive from its client."""
    import weakref

    ref = weakref.ref(cluster)

    def tell() -> None:
        held = ref()
        if held is not None:
            held._tell()

    return tell


def _crowding(path: Owned | Joined) -> str:
    """What starting more ranks than this machine has cores means (for a cluster started here,
    on this machine alone), or "" when each rank has a core."""
    from mpinb.client.launch import MPICH_YIELD, usable_cores

    options = getattr(path, "options", None)
    if options is None or not options.on_this_machine:
        return ""
    n, cores = options.n, usable_cores()
    if n <= cores:
        return ""
    waits = ", ".join(f"{var}={options.env.get(var, value)}" for var, value in MPICH_YIELD.items())
    threads = options.threads_per_rank or max(1, cores // n)
    share = n / cores
    return (f"starting {n} ranks on the {cores} core{'s' if cores > 1 else ''} of this machine ({share:.3g} ranks a "
            f"core): each rank computes at about 1/{share:.3g} of a core's speed, and a cell that waits for every "
            f"rank waits for the slowest. Ranks waiting in MPI give their core away ({waits}), with {threads} "
            f"BLAS/OpenMP/TensorFlow thread{'s' if threads > 1 else ''} each. MPICluster(n={cores}) gives each rank "
            "a core of its own.")


def _footprint(cluster: MPICluster) -> str:
    """How many processes this machine runs for ``cluster``, and their memory (resident, summed)."""
    import psutil

    from mpinb.client._lifecycle import tracked_pids

    pids = tracked_pids(cluster)
    rss = 0
    for pid in pids:
        try:
            rss += psutil.Process(pid).memory_info().rss
        except psutil.Error:
            continue
    return f"they run as {len(pids)} processes holding {rss / 2**30:.1f} GiB of memory"
