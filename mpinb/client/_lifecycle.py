"""The two ways an ``MPICluster`` holds a cluster: one it started (:class:`Owned`), one it joined (:class:`Joined`).

Client. ``MPICluster`` keeps what both share (the client, the view, which engine is which rank)
and hands every step whose meaning differs to one of these: starting, stopping, restarting, what
``with`` does, and whether the engines' set-up gives them a thread budget and quiets TensorFlow. An owned
cluster ends everything it started, even when its owner dies (:mod:`mpinb.client._watchdog`); a joined cluster
is left running, and only its engines are replaced on restart.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from mpinb._listeners import confine_listeners_of
from mpinb.client._ipp import engine_uuids
from mpinb.client._launcher_output import has_ended, last_lines, output_of, relays_of, tail
from mpinb.client._processes import (
    descendants,
    end,
    kill,
    launcher_files_of,
    remove_files,
    session_members,
    shared_memory_of,
)
from mpinb.client._watchdog import Watchdog

if TYPE_CHECKING:
    from mpinb.client._options import LaunchOptions

__all__ = ["ClusterHandle", "Joined", "Owned", "tracked_pids"]


class ClusterHandle(Protocol):
    """What these paths use of the ``MPICluster`` that holds them (named here, not imported: the
    cluster imports this module)."""

    n: int
    timeout: float
    cluster: Any
    client: Any
    view: Any
    _ids_by_rank: list[int]
    _path: Owned | Joined

    def start(self) -> Any: ...

    def stop(self) -> None: ...

    def _identify(self, ids: list[int]) -> None: ...

    def _disconnect(self) -> None: ...

    @property
    def _local_engine_pids(self) -> list[int]: ...


_Held = TypeVar("_Held", bound=ClusterHandle)

_STOP_GRACE = 5.0  # seconds the cluster's processes get to exit after ipyparallel's stop


class Owned:
    """A cluster this ``MPICluster`` started: a controller and ``n`` engines under ``mpiexec``."""

    started_by_mpinb = True  # its engines get a thread budget and a quiet TensorFlow (mpinb._engine.set_up)

    def __init__(self, options: LaunchOptions) -> None:
        self.options = options
        self.watchdog: Watchdog | None = None
        self.leftovers: set[str] = set()  # what a killed world leaves (MPI's /dev/shm segments, ...)
        self.slurm: Any = None  # mpinb.client.slurm.SlurmEngines, with launcher="slurm"

    @property
    def one_machine(self) -> bool:
        """Whether every engine runs here: then Hydra's control port answers loopback alone."""
        return self.options.on_this_machine

    def start(self, mc: ClusterHandle) -> None:
        self.slurm = self.options.slurm_engines(mc.n)
        # The engines' own temporary folder (TensorFlow's generated code, anything else they
        # write): removed with the cluster, however it ends.
        tmpdir = tempfile.mkdtemp(prefix="mpinb-engines-") if self.options.on_this_machine else None
        self.leftovers = {tmpdir} if tmpdir else set()
        with _owner_only():
            mc.cluster = self.options.make_cluster(mc.n, self.slurm, tmpdir)
            # Before any process starts: whatever happens to this process from now on, the cluster
            # ends with it (mpinb.client._watchdog).
            self.watchdog = Watchdog()
        self.leftovers |= _cluster_files(mc.cluster)
        self.watchdog.remove_on_death(self.leftovers)
        try:
            _private_cluster_file(mc.cluster)
            self._cancel_on_death(mc)
            # Each launcher is watched as soon as it runs (the watchdog ends their trees too): an owner
            # killed while the engines start leaves no controller behind.
            with _owner_only():
                mc.cluster.start_controller_sync()
            self.watchdog.watch(_launcher_pids(mc.cluster))
            time.sleep(mc.cluster.delay)  # as ipyparallel's start_cluster does
            with _owner_only():
                mc.cluster.start_engines_sync()
            self.watchdog.watch(_launcher_pids(mc.cluster))
            self.leftovers |= _cluster_files(mc.cluster)
            self.watchdog.remove_on_death(self.leftovers)
            mc.client = mc.cluster.connect_client_sync()
            mc._identify(wait_for_new_engines(mc, set()))
            if self.options.on_this_machine:  # Open MPI's prterun listens on every address: mpinb._listeners
                for launcher in list(mc.cluster.engines.values()):
                    confine_listeners_of(getattr(launcher, "pid", None) or -1)
            self._cancel_on_death(mc)
            self.watchdog.watch(mc._local_engine_pids)
            _protect_files(mc.cluster)
            # What MPI removes only when it finalizes: its shared-memory segments (in the engines'
            # memory maps) and Hydra's topology file (held open by its proxies).
            local = mc._local_engine_pids
            self.leftovers |= shared_memory_of(local) | launcher_files_of(local)
            self.watchdog.remove_on_death(self.leftovers)
        except BaseException as err:
            profile = str(mc.cluster.profile_dir) if mc.cluster is not None else None
            mc.stop()
            if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
                raise _disk_full(err, profile) from err
            raise

    def stop(self, mc: ClusterHandle) -> None:
        pids = tracked_pids(mc)
        # The world's files are known from start only once its engines were identified: a start
        # that failed after MPI_Init (a shadowed mpinb, too few GPUs) left MPICH's segments in
        # /dev/shm, 2 MiB each. Read them from whatever of the world still runs now.
        self.leftovers |= shared_memory_of(pids) | launcher_files_of(pids)
        mc._disconnect()
        if mc.cluster is not None:
            if self.slurm is not None:  # engines on other nodes: only Slurm can end them
                self.slurm.cancel()
            kill_engines(mc)
            try:
                mc.cluster.stop_cluster_sync()
            except Exception:  # noqa: BLE001 - already dead processes
                pass
            end(pids, grace=_STOP_GRACE)
            for relay in relays_of(mc.cluster):  # mpiexec has ended: its output too
                relay.close()
        # What outlives engines that did not finalize (SIGKILLed above, or dead before): this
        # world's own files, found at start.
        remove_files(self.leftovers)
        self.leftovers = set()
        if self.watchdog is not None:
            self.watchdog.release()
            self.watchdog = None
        mc.cluster = None

    def restart(self, mc: ClusterHandle, timeout: float | None) -> None:
        # A fresh controller too, so that engine ids are MPI ranks again.
        saved = mc.timeout
        mc.timeout = saved if timeout is None else float(timeout)
        try:
            mc.stop()
            mc.start()
        finally:
            mc.timeout = saved

    def enter(self, mc: _Held) -> _Held:
        return mc.start()

    def _cancel_on_death(self, mc: ClusterHandle) -> None:
        """A Slurm job's engines run where no PID of ours reaches: the watchdog cancels the job."""
        if self.slurm is not None and self.watchdog is not None:
            if mc.view is not None:
                self.slurm.identify(list(mc.cluster.engines.values()), mc.client[mc._ids_by_rank[0]])
            self.watchdog.on_death(self.slurm.cancel_command())


class Joined:
    """A cluster started elsewhere (``ipcluster start --engines=MPI``) that ``MPICluster.connect`` joined."""

    started_by_mpinb = False  # someone else's engines: configured as their owner chose
    one_machine = False  # unknown, and not ours to change
    watchdog = None  # it must outlive this notebook
    slurm = None

    def connect(self, mc: ClusterHandle, profile: str | None, profile_dir: str | None, cluster_id: str) -> None:
        import ipyparallel as ipp

        from mpinb.client._profiles import newest_cluster_id

        # ipp.Cluster() names its connection files by an id the user rarely knows: the newest running.
        cluster_id = cluster_id or newest_cluster_id(profile, profile_dir)
        try:
            mc.cluster = ipp.Cluster.from_file(profile=profile, profile_dir=profile_dir, cluster_id=cluster_id)
            mc.client = mc.cluster.connect_client_sync()
        except Exception:  # noqa: BLE001 - no cluster file: connect by profile alone
            kwargs = {k: v for k, v in (("profile", profile), ("profile_dir", profile_dir)) if v}
            mc.client = ipp.Client(cluster_id=cluster_id or None, **kwargs)
        mc.client.wait_for_engines(1, timeout=mc.timeout)
        mc.n = len(mc.client.ids)
        mc._identify(sorted(mc.client.ids))

    def start(self, mc: ClusterHandle) -> None:
        raise RuntimeError("This MPICluster joined a cluster it did not start (connect()); it cannot start one.")

    def stop(self, mc: ClusterHandle) -> None:
        mc._disconnect()  # the cluster keeps running for whoever started it

    def restart(self, mc: ClusterHandle, timeout: float | None) -> None:
        # New engines under the cluster's own controller (found from its cluster file).
        old = _engine_keys(mc.client)
        kill_engines(mc)
        mc.cluster.stop_engines_sync()
        mc.cluster.start_engines_sync(mc.n)
        mc._identify(wait_for_new_engines(mc, old, timeout=timeout))

    def enter(self, mc: _Held) -> _Held:
        return mc


def wait_for_new_engines(mc: ClusterHandle, old: set[Any], timeout: float | None = None) -> list[int]:
    """Ids of ``mc.n`` engines that were not registered before (``old``: their (id, uuid) pairs)."""
    limit = mc.timeout if timeout is None else timeout
    deadline = time.monotonic() + limit
    said_queued = False
    while True:
        # After a restart the hub may still list dead engines, or hand their ids to the new
        # ones: an engine is new when its (id, uuid) was not registered before.
        new = {eid for eid, _ in _engine_keys(mc.client) - old}
        if len(new) >= mc.n:
            return sorted(new)
        slurm = mc._path.slurm
        launchers = list(mc.cluster.engines.values())
        if slurm is not None and (why := slurm.failure(launchers)):
            raise RuntimeError(why)
        if slurm is None and (ended := [launcher for launcher in launchers if has_ended(launcher)]):
            # An engine that gives up on registering (a controller slow to answer) ends, and its
            # mpiexec with it: waiting on would only end in the timeout, without the reason.
            raise RuntimeError(
                f"the engines' mpiexec ended before {mc.n - len(new)} of {mc.n} engines registered: "
                f"{' | '.join(tail(output_of(launcher), 8) for launcher in ended).strip(' |') or 'no output'}; "
                "check `mpinb info`."
            )
        queued = slurm.queued() if slurm is not None else None
        if slurm is not None and queued and not said_queued:
            said_queued = True  # once: Slurm may keep a job queued for hours, and the wait is bounded
            print(f"mpinb: Slurm job {slurm.job} is queued: {queued}; waiting up to {limit:.0f} s for it to start.",
                  file=sys.stderr, flush=True)
        if time.monotonic() > deadline:
            if slurm is not None and queued:
                raise TimeoutError(
                    f"Slurm job {slurm.job} was still queued after {limit:.0f} s: {queued}; it is cancelled. "
                    "MPICluster(..., timeout=...) or restart(timeout=...) waits longer; `sinfo` shows the nodes."
                )
            # The profile's logs go with the cluster (they are its owner's alone): quote them here.
            said = f" mpiexec says: {last_lines(launchers, 8)};" if slurm is None else f" {slurm.pending(launchers)};"
            raise TimeoutError(
                f"only {len(new)} of {mc.n} MPI engines registered within {limit:.0f} s;{said} "
                "check `mpinb info`."
            )
        time.sleep(0.05)


def kill_engines(mc: ClusterHandle) -> None:
    """SIGKILL the engines' mpiexec trees: graceful stops wait on ranks that may be spinning."""
    if mc.cluster is None:
        return
    for launcher in list(mc.cluster.engines.values()):
        pid = getattr(launcher, "pid", None)
        if pid:
            for child in [*descendants(pid), pid]:
                kill(child)
    for pid in mc._local_engine_pids:
        kill(pid)


def tracked_pids(mc: ClusterHandle) -> list[int]:
    """Every process of ``mc``'s cluster on this host: engines, controller, mpiexec, their trees,
    and what is left in the sessions they lead (the children of a controller killed first)."""
    pids = list(mc._local_engine_pids)
    if mc.cluster is not None:
        for pid in _launcher_pids(mc.cluster):
            pids.append(pid)
            pids.extend(descendants(pid))
    # ipyparallel starts each launcher's process in a session of its own; Hydra its proxies and ranks.
    pids.extend(session_members(list(pids)))
    return sorted(set(pids))


@contextlib.contextmanager
def _owner_only():
    """Umask 077 while ipyparallel starts processes and writes files: the controller's and engines'
    logs (opened in this process), the hub's ``engines<id>.json``, the profile folders, and whatever
    the processes started now write, are the owner's alone. The umask is per process, not per
    thread: another thread of this process creating a file meanwhile gets a stricter mode, never a
    looser one."""
    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)


def _cluster_files(cluster: Any) -> set[str]:
    """What ipyparallel writes for ``cluster`` in its profile (logs, connection and cluster files,
    the hub's engine state): removed with the cluster however it ends (ipyparallel removes some on
    a clean stop only, and never ``engines<id>.json``). Folders are made owner-only on the way."""
    profile = str(cluster.profile_dir)
    cid = cluster.cluster_id
    # Every file named after the cluster's id (never an empty id: that would name every file).
    found = {os.path.join(profile, d, f"*{cid}*") for d in ("log", "security")} if cid else set()
    if cluster.cluster_file:
        found.add(cluster.cluster_file)
    for launcher in [cluster.controller, *cluster.engines.values()]:
        if getattr(launcher, "output_file", ""):
            found.add(launcher.output_file)
    for folder in ("log", "security"):
        with contextlib.suppress(OSError):
            os.chmod(os.path.join(profile, folder), 0o700)
    return found


def _disk_full(err: OSError, profile: str | None) -> OSError:
    """The error of a start that a full disk stopped: where, and how full (an ``OSError`` of the
    same errno; ipyparallel's says neither)."""
    from mpinb.client._engine_output import disk_usage

    where = err.filename or profile or "the cluster's profile folder"
    return OSError(err.errno, f"MPICluster could not write the cluster's files in {where}: {err.strerror} "
                              f"({disk_usage(os.path.join(where, 'x'))}); free space there, or give IPYTHONDIR "
                              "(or MPICluster(profile_dir=...)) a roomier place.")


def _launcher_pids(cluster: Any) -> list[int]:
    launchers = [cluster.controller, *cluster.engines.values()]
    # A launcher that failed to start says pid -1.
    return [pid for pid in (getattr(launcher, "pid", None) for launcher in launchers if launcher is not None)
            if pid and pid > 0]


def _engine_keys(client: Any) -> set[Any]:
    """An identity per registered engine that survives id reuse: (id, uuid)."""
    if client is None:
        return set()
    uuids = engine_uuids(client)
    return {(eid, uuids.get(eid)) for eid in client.ids}


def _private_cluster_file(cluster: Any) -> None:
    """Create the cluster file owner-only before ipyparallel writes it: it opens the file with
    ``open(path, "w")``, which keeps the mode of a file that exists, so it is never 0644."""
    path = getattr(cluster, "cluster_file", "")
    if not path:
        return
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    os.chmod(path, 0o600)


def _protect_files(cluster: Any) -> None:
    """Owner-only modes for everything in the profile's security folder. ipyparallel already
    writes the connection files (which hold the key) 0600; its cluster file (launcher state and
    pids, no key) is 0644, and there is no reason for others to read it either."""
    security = os.path.join(str(cluster.profile_dir), "security")
    if os.path.isdir(security):
        os.chmod(security, 0o700)
        for name in os.listdir(security):
            os.chmod(os.path.join(security, name), 0o600)
