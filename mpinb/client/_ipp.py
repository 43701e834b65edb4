"""What mpinb needs from ipyparallel beyond its public API, in one place. Client.

Everything here reaches into ipyparallel's private parts or patches its classes; each item says
why, and was checked against ipyparallel 9.2.0. The rest of mpinb uses ipyparallel's public API
only (``Cluster``, ``Client``, ``DirectView``, ``client.send_signal``, launchers' ``pid`` and
``get_output()``).

- :func:`stamp_cells` wraps ``Client._build_targets``, ``Client.send_execute_request`` and
  ``send_apply_request`` (and ``ParallelFunction.__call__``, what ``DirectView.map`` runs):
  ipyparallel sends one execute request per engine, each with its own message id, so nothing in a
  request tells an engine which requests to the other engines belong to the same cell. A
  ``DirectView.execute`` call passes one metadata dict to every request it sends; stamping that dict
  once gives every engine of one cell the same id, and the engine ids it goes to
  (:mod:`mpinb._collective.cells` reads them in the engines' ``pre_execute`` hook).
- :func:`px_magics` and :func:`activate` subclass ``ParallelMagics``: ipyparallel's ``%%px`` sends
  SIGINT to the engines when its blocking wait is interrupted (the Stop button), shows their output
  and returns: the ranks' errors -- the one that started it all among them -- are never shown. The
  subclass waits a moment for them and raises them as any failed cell does, grouped by rank.
- :func:`group_composite_errors` replaces ``CompositeError.render_traceback``, so that one error
  raised by 16 ranks shows once.
- :func:`engine_uuids` reads ``Client._engines``: the only place that tells an engine from a new one
  that the hub gave the same id.
- :func:`engine_deaths` reads the engine launcher's output, whose lines are ipyparallel's (and
  Hydra's) log format, not an API.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

from mpinb._collective.cells import CELL_KEY, TARGETS_KEY

__all__ = ["activate", "engine_deaths", "engine_uuids", "group_composite_errors", "px_magics", "stamp_cells"]

_STOP_WAIT = 10.0  # seconds a stopped %%px cell waits for every rank's outcome
_RELAY_EVERY = 0.25  # seconds between looks at a running cell's notices

def stamp_cells(client: Any) -> None:
    """Stamp every execute and apply request of one call through ``client`` with one cell id
    (idempotent); a ``DirectView.map`` is one cell too, on the engines that get a part. Requests
    without a shared metadata dict are left alone: the engines count them."""
    if getattr(client, "_mpinb_stamps_cells", False):
        return
    send, send_apply, build = client.send_execute_request, client.send_apply_request, client._build_targets
    last: dict[str, Any] = {"targets": None, "id": 0, "group": None}

    def build_targets(targets: Any) -> Any:
        idents, ids = build(targets)
        last["targets"] = [int(i) for i in ids]
        return idents, ids

    def fresh_id() -> int:
        # Increasing, and unique per client: the engines compare cells by id to tell an earlier
        # cell from a later one.
        last["id"] = max(time.time_ns(), last["id"] + 1)
        return last["id"]

    def stamp(metadata: dict | None) -> None:
        if metadata is None or CELL_KEY in metadata:
            return
        group = last["group"]
        if group is not None:  # one part of a map: the map's cell
            metadata[CELL_KEY], metadata[TARGETS_KEY] = group
            return
        metadata[CELL_KEY] = fresh_id()
        if last["targets"] is not None:
            metadata[TARGETS_KEY] = last["targets"]

    def tell() -> None:
        # What the cluster has to say since the last request (output its disk could not keep):
        # said before the next one, as view.execute has no other place to say it.
        said = getattr(client, "_mpinb_tell", None)
        if said is not None:
            said()

    def send_execute_request(socket: Any, code: str, silent: bool = True, metadata: dict | None = None,
                             ident: Any = None, **kwargs: Any) -> Any:
        tell()
        stamp(metadata)
        return send(socket, code, silent=silent, metadata=metadata, ident=ident, **kwargs)

    def send_apply_request(*args: Any, **kwargs: Any) -> Any:
        tell()
        stamp(kwargs.get("metadata"))
        return send_apply(*args, **kwargs)

    @contextlib.contextmanager
    def map_group(targets: list[int]) -> Iterator[None]:
        last["group"] = (fresh_id(), targets)
        try:
            yield
        finally:
            last["group"] = None

    client._build_targets = build_targets
    client.send_execute_request = send_execute_request
    client.send_apply_request = send_apply_request
    client._mpinb_map_group = map_group
    client._mpinb_stamps_cells = True
    _maps_are_cells()


def _maps_are_cells() -> None:
    """Wrap ``ParallelFunction.__call__`` (what ``DirectView.map`` runs; idempotent): it sends one
    ``apply`` per engine, each of its own, so without this every part of one map would be a cell
    sent to one engine only, and a collective in the mapped function would be refused."""
    from ipyparallel.client.remotefunction import ParallelFunction

    call = ParallelFunction.__call__
    if getattr(call, "_mpinb_cells", False):
        return

    def __call__(self: Any, *sequences: Any, **kwargs: Any) -> Any:
        view = self.view
        group = getattr(view.client, "_mpinb_map_group", None)
        if group is None or "Balanced" in type(view).__name__:
            return call(self, *sequences, **kwargs)
        targets = view.targets
        ids = view.client._build_targets(targets)[1] if targets == "all" else (
            [targets] if isinstance(targets, int) else list(targets))
        length = max((len(seq) for seq in sequences if hasattr(seq, "__len__")), default=0)
        if length == 0 or not all(hasattr(seq, "__len__") for seq in sequences):
            return call(self, *sequences, **kwargs)  # as ipyparallel: an empty map, or iterators
        # The engines that get a non-empty part, as ipyparallel splits the sequences.
        everything = list(range(length))
        getting = [int(t) for i, t in enumerate(ids)
                   if len(self.mapObject.getPartition(everything, i, len(ids), length))]
        with group(getting):
            return call(self, *sequences, **kwargs)

    __call__._mpinb_cells = True  # type: ignore[attr-defined]
    ParallelFunction.__call__ = __call__


def px_magics(shell: Any, view: Any, deaths: Callable[[], str | None] | None = None, owner: Any = None) -> Any:
    """ipyparallel's ``%px``/``%%px`` magics on ``view``, showing every rank's error after the Stop
    button, and, when engines died, which rank died how (``deaths()`` tells). With ``owner`` (the
    ``MPICluster`` of ``view``): a cell refused with the way out once it stopped, and its notes
    (output the disk could not keep) said after each cell."""
    import weakref

    from ipyparallel.client.magics import ParallelMagics
    from ipyparallel.error import CompositeError

    held = weakref.ref(owner) if owner is not None else None

    class StoppedCellsShowTheirErrors(ParallelMagics):
        def parallel_execute(self, cell: str, block: Any = None, **kwargs: Any) -> Any:
            cluster = held() if held is not None else None
            if held is not None and (cluster is None or cluster.view is None):
                _refuse_stopped(cluster)
            try:
                return self._run(cell, block, **kwargs)
            finally:
                if cluster is not None:
                    cluster._tell()

        def _run(self, cell: str, block: Any = None, **kwargs: Any) -> Any:
            _require_engines(self.view)
            self.last_result = None
            blocking = self.view.block if block is None else block
            streaming = kwargs.get("stream_output")
            streams = self.stream_output if streaming is None else streaming
            relay = _NoticeRelay(self) if blocking and not streams else None
            try:
                out = super().parallel_execute(cell, block=block, **kwargs)
            except CompositeError as err:
                if deaths is not None and any(name == "EngineError" for name, *_ in err.elist):
                    err.mpinb_deaths = deaths()
                raise
            finally:
                if relay is not None:
                    relay.stop()
            result = self.last_result
            if (self.view.block if block is None else block) and result is not None:
                # A blocking cell that returned without raising either succeeded or was stopped
                # (ipyparallel then signals the engines and swallows the interrupt): every rank
                # now stops, and says how.
                result.wait(timeout=_STOP_WAIT)
                if result.done() and not result.successful():
                    result.get()  # raises the ranks' errors, grouped, as after any failed cell
            return out

    return StoppedCellsShowTheirErrors(shell, view, "")


def activate(view: Any, deaths: Callable[[], str | None] | None = None, owner: Any = None) -> None:
    """Make ``view`` the target of ``%%px`` in a notebook, with errors grouped by rank.

    What ``view.activate()`` does, with :func:`px_magics` in place of ipyparallel's magics (its
    ``activate`` takes no magics class), and output shown when every rank is done rather than
    streamed: streamed, each rank's error prints on its own as it arrives (16 ranks, 16
    tracebacks); at the end, identical errors show once, with the ranks that raised them.
    ``%%px --stream`` (or ``%pxconfig --stream``) streams again.
    """
    group_composite_errors()
    try:
        from IPython import get_ipython
    except ImportError:
        return
    ip = get_ipython()
    if ip is not None:
        magics = px_magics(ip, view, deaths, owner)
        magics.stream_output = False
        ip.magics_manager.register(magics)


def group_composite_errors() -> None:
    """Render ``CompositeError`` (what ``%%px`` and ``view.execute`` raise) once per distinct error,
    named by rank, and give it ``by_rank``; idempotent.

    ipyparallel prints every engine's traceback in turn and offers no hook for its rendering, so
    the class's ``render_traceback`` is replaced (it is what IPython's ``_render_traceback_``
    calls). The rendering itself is :mod:`mpinb.client._tracebacks`'.
    """
    from ipyparallel import error

    from mpinb.client._tracebacks import by_rank, render

    if getattr(error.CompositeError, "_mpinb_grouped", False):
        return
    error.CompositeError.render_traceback = render
    error.CompositeError.by_rank = property(by_rank)
    error.CompositeError._mpinb_grouped = True


def engine_uuids(client: Any) -> dict[int, Any]:
    """Each registered engine's uuid, by engine id.

    After a restart the hub may still list dead engines, or hand their ids to new ones; only the
    uuid tells them apart, and ``Client._engines`` (id -> uuid) is the one place the client keeps
    it: ipyparallel has no public accessor.
    """
    return dict(getattr(client, "_engines", {}))


def _refuse_stopped(cluster: Any) -> None:
    """A ``%%px`` cell for a cluster that stopped, with no other running: say how to point it."""
    from IPython.core.error import UsageError

    from mpinb.client._targets import describe

    what = describe(cluster) if cluster is not None else "an MPICluster that no longer exists"
    # IPython shows a UsageError (that class exactly) as its message, not a traceback through magics.
    raise UsageError(
        f"%%px runs on {what}, which is stopped, and no other MPICluster is running: start one "
        "(MPICluster(n=...) takes %%px), or restart() a stopped one; cluster.activate() points %%px at a "
        "running cluster."
    )


def _require_engines(view: Any) -> None:
    """Refuse a cell for engines that are gone, naming their ranks and the way out."""
    from mpinb._words import ranks as ranks_text
    from mpinb.client._tracebacks import rank_of_engine

    targets = view.targets if isinstance(view.targets, list) else [view.targets]
    try:
        alive = set(view.client.ids)
    except Exception:  # noqa: BLE001 - a closed client
        alive = set()
    gone = [t for t in targets if isinstance(t, int) and t not in alive]
    if gone:
        ranks = sorted(rank_of_engine(t) for t in gone)
        raise RuntimeError(
            f"the engines of {ranks_text(ranks)} are gone (an engine "
            "died, and MPI ended its world): the cluster needs cluster.restart() before the next %%px cell."
        )


class _NoticeRelay:
    """While a blocking ``%%px`` cell runs without streaming (its output shows when every rank is
    done), print the engines' ``mpinb:`` notices -- whom a rank waits for, and where they are -- as
    they arrive, so that a waiting cell is never silent. A thread in the cell's context, so that the
    lines land in that cell."""

    def __init__(self, magics: Any) -> None:
        import contextvars
        import threading

        self._seen: dict[Any, Any] = {}
        self._magics, self._done = magics, threading.Event()
        self._thread = threading.Thread(target=contextvars.copy_context().run, args=(self._run,), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        self._thread.join()

    def _run(self) -> None:
        import sys

        from mpinb.client._tracebacks import rank_of_engine

        while not self._done.wait(_RELAY_EVERY):
            result = self._magics.last_result
            if result is None:
                continue
            try:
                # result.stderr is in the order of the cell's targets, updated as output arrives;
                # AsyncResult keeps those targets only in its private _targets.
                stderr = result.stderr
                texts = list(zip(result._targets, stderr if isinstance(stderr, list) else [stderr], strict=False))
            except Exception:  # noqa: BLE001 - no metadata yet
                continue
            for engine, text in texts:
                lines = (text or "").splitlines()
                for line in lines[self._seen.get(engine, 0):]:
                    if line.startswith("mpinb: "):
                        print(f"[stderr:{rank_of_engine(engine)}] {line}", file=sys.stderr, flush=True)
                self._seen[engine] = len(lines)


# Each engine's nanny logs the moment its engine process ends (the first to log is usually the rank
# that died: MPI ends the others after it), and Hydra reports how the job's processes ended: the
# exit code of one process it names by PID (not necessarily the first to end), and the job's signal.
NANNY_SAW_EXIT = re.compile(r"\[KernelNanny\.(?P<engine>\d+)\] Pipe closed, parent (?P<pid>\d+) has status")
ENGINE_EXIT = re.compile(r"EXIT STRING: .*\(signal (?P<signal>\d+)\)|EXIT CODE: (?P<code>\d+)")
# Any launcher's word that the job's ranks ended, which a death report waits for: Hydra's (MPICH,
# Intel MPI) exit string or code, or prterun's (Open MPI) "exited on signal N" / "non-zero status".
LAUNCHER_SAW_EXIT = re.compile(ENGINE_EXIT.pattern + r"|exited on\s+signal \d+|exited with non-zero status")
_HYDRA_NAMES = re.compile(r"PID (?P<pid>\d+) RUNNING AT .*\n.*EXIT CODE: (?P<code>\d+)")
# Open MPI's prterun names a rank it saw killed by a signal: "prterun noticed that process rank 1 with
# PID 4242 on node n1 exited on signal 9 (Killed)." Open MPI 5.0's says "PID 0": then the rank tells,
# which each engine's log names with its engine id ("[IPEngine.RANK.ID]", the id it asked for first).
_PRTERUN_NAMES = re.compile(r"process rank (?P<rank>\d+) with PID (?P<pid>\d+) on node \S+ exited on\s+"
                            r"signal (?P<signal>\d+)")


def engine_deaths(text: str, first_pid: int | None = None,
                  first_engine: int | None = None) -> list[tuple[int, int, str]]:
    """``(engine id, pid, how)`` of the engine that died first, from the engine launcher's output:
    the engine of ``first_pid`` when it is known (the kernel saw it end first, see ``_exits``, or
    its own Python reported a fatal signal), else the first whose nanny logged. ``first_engine``:
    ``first_pid``'s engine id, which names it even before its nanny's line has come through (the
    launcher's output carries the nannies' lines in whatever order a loaded host runs them).
    ``how`` is Hydra's word on that process, when Hydra's report names it."""
    import signal as _signal

    ended = list(NANNY_SAW_EXIT.finditer(text))
    if not ended:
        return []
    logged = next((m for m in ended if int(m["pid"]) == first_pid), None)
    if logged is None and first_pid is not None and first_engine is not None:
        engine, pid = first_engine, first_pid  # known first, its nanny's line not here yet
    else:
        logged = logged or ended[0]
        engine, pid = int(logged["engine"]), int(logged["pid"])
    how = "its process ended"
    named = _HYDRA_NAMES.search(text)
    if named is not None and int(named["pid"]) == pid:
        # Hydra's report is about this process: its signal if the job's exit string gives one.
        how = f"exit code {named['code']}"
        for m in ENGINE_EXIT.finditer(text):
            if m["signal"] is not None:
                number = int(m["signal"])
                try:
                    how = _signal.Signals(number).name
                except ValueError:
                    how = f"signal {number}"
                break
    for said in _PRTERUN_NAMES.finditer(text):
        engines = set(re.findall(rf"\[IPEngine\.{said['rank']}\.(\d+)\]", text)) if said["pid"] == "0" else set()
        if int(said["pid"]) == pid or engines == {str(engine)}:
            number = int(said["signal"])
            how = _signal.Signals(number).name if number in set(_signal.Signals) else f"signal {number}"
    return [(engine, pid, how)]
