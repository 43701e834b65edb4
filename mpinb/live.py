"""Live progress: rank 0 publishes from the engines, the notebook redraws a figure while the cell runs.

Engine side, :class:`Progress` (or :func:`publish`) sends small messages through ipyparallel's data
publication; under plain ``mpiexec`` it does nothing, so the same script runs in a batch job.
Client side, :func:`watch` polls a non-blocking ``%%px`` result and updates one figure in place.

Each message carries the whole series so far (a few floats per step), so the client never depends on
seeing every message: it may poll slower than the ranks publish and still draws every point.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any

from mpinb import _progress

__all__ = ["KEY", "Progress", "Watch", "publish", "watch"]

KEY = "mpinb_progress"


def publish(**data: Any) -> bool:
    """Publish ``data`` to the notebook client if this process is an ipyparallel engine.

    Local: no MPI communication; call it on the rank that should speak (rank 0 by convention).
    Under plain ``mpiexec`` or in a plain Python process it does nothing.

    Returns
    -------
    bool
        Whether a message was sent.
    """
    publisher = _data_publisher()
    if publisher is None:
        return False
    publisher.publish_data(data)
    return True


class Progress:
    """Per-step metrics of a long collective loop, published live by rank 0.

    Local: only rank 0 of ``comm`` publishes and no communication happens, so every rank may call
    :meth:`update` unconditionally. Messages are rate-limited to one per ``min_interval`` seconds;
    :meth:`close` always sends the last state.

    Parameters
    ----------
    kind : str
        What is being tracked, e.g. ``"loss"`` (per epoch) or ``"inertia"`` (per iteration); the
        client uses it for labels and scales.
    total : int, optional
        Expected number of steps (epochs, max iterations), for the progress bar.
    comm : mpi4py.MPI.Comm, optional
        Defaults to ``MPI.COMM_WORLD``; only its rank 0 publishes.
    min_interval : float, default 0.1
        Seconds between messages.

    Examples
    --------
    >>> progress = Progress("loss", total=epochs)
    >>> for epoch in range(epochs):
    ...     progress.update(epoch + 1, loss=loss, val_loss=val_loss)
    >>> progress.close()
    """

    def __init__(self, kind: str, total: int | None = None, *, comm: Any = None, min_interval: float = 0.1) -> None:
        self.kind = kind
        self.total = total
        self.min_interval = min_interval
        self.step = 0
        self.series: dict[str, list[float]] = {}
        self.steps: list[int] = []
        self._last_sent = 0.0
        self._enabled = _data_publisher() is not None and _rank(comm) == 0
        self._run = f"{kind}-{time.time_ns()}"
        _progress.fit_begin(kind, total, self._run)  # every rank's own state, for the rank panel

    def update(self, step: int, **metrics: float) -> None:
        """Record ``metrics`` at ``step`` and publish if the rate limit allows."""
        self.step = int(step)
        self.steps.append(self.step)
        for name, value in metrics.items():
            self.series.setdefault(name, []).append(float(value))
        _progress.fit_update(self.kind, self.step, self.total, self._run, metrics)
        if self._enabled and time.monotonic() - self._last_sent >= self.min_interval:
            self._send(done=False)

    def batch(self, done: int, steps: int | None = None, logs: Any = None) -> None:
        """A train step ended: ``done`` steps of ``steps`` in this epoch, ``logs`` the step's metrics
        (read only when the rank panel publishes). Local; every rank calls it, nothing is sent here:
        the rank panel (:meth:`mpinb.MPICluster.monitor`) measures each step's compute, exchange and wait."""
        _progress.batch(self._run, self.kind, self.total, done, steps, logs)

    def close(self) -> None:
        """Publish the final state."""
        _progress.fit_done(self._run)
        if self._enabled:
            self._send(done=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, done: bool) -> None:
        self._last_sent = time.monotonic()
        publish(
            **{
                KEY: {
                    "run": self._run,
                    "kind": self.kind,
                    "step": self.step,
                    "total": self.total,
                    "steps": list(self.steps),
                    "series": {k: list(v) for k, v in self.series.items()},
                    "done": done,
                }
            }
        )


@dataclass
class Watch:
    """What :func:`watch` saw: the final result, the last progress message and each redraw."""

    result: Any = None
    progress: dict[str, Any] | None = None
    redraws: list[tuple[float, int]] = field(default_factory=list)
    figure: Any = None


def watch(
    ar: Any,
    *,
    interval: float = 0.1,
    timeout: float | None = None,
    ax: Any = None,
    display: bool | None = None,
) -> Watch:
    """Draw live progress published by the engines while a non-blocking ``%%px`` cell runs.

    Client. Polls ``ar`` (an ipyparallel ``AsyncResult``, e.g. from ``%%px --noblock``) every
    ``interval`` seconds; whenever rank 0 published a new step, the figure is redrawn in place
    (one output, updated, not a new image per step) with a progress bar when ipywidgets is
    available. When nothing is published it simply waits for the result. Errors on the engines are
    raised here, as ``ar.get()`` would.

    Parameters
    ----------
    ar : ipyparallel.AsyncResult
        The running cell or ``apply_async`` result: ``_`` right after a ``%%px --noblock`` cell, the
        name given by ``%%px --noblock --out name`` (ipyparallel's ``-o``/``--out``), or
        what ``view.execute``, ``view.apply_async`` or ``view.map_async`` returned.
    interval : float, default 0.1
        Seconds between polls.
    timeout : float, optional
        Give up waiting after this many seconds (``TimeoutError``); the cell keeps running.
    ax : matplotlib.axes.Axes, optional
        Draw here instead of a new figure.
    display : bool, optional
        Show the figure in the notebook; default: when running inside IPython.

    Returns
    -------
    Watch
        ``result`` (what ``ar.get()`` returned), ``progress`` (the last message), ``redraws``
        (time and step of each redraw) and ``figure``.

    Raises
    ------
    TypeError
        At once, before drawing anything, when ``ar`` is not such a result.
    """
    _check_async_result(ar)
    import matplotlib.pyplot as plt

    shown = _in_ipython() if display is None else display
    if ax is None:
        fig, ax = plt.subplots(figsize=(6, 3.5))
    else:
        fig = ax.figure
    handle = bar = bar_handle = None
    if shown:
        from IPython.display import display as ipy_display

        bar = _progress_bar()
        if bar is not None:
            bar_handle = ipy_display(bar, display_id=True)
        handle = ipy_display(fig, display_id=True)
    seen = Watch(figure=fig)
    last_key: tuple[Any, ...] | None = None
    t0 = time.monotonic()
    try:
        while True:
            finished = ar.ready()
            message = _latest(ar)
            if message is not None:
                key = (message["run"], message["step"], message["done"])
                if key != last_key:
                    last_key = key
                    seen.progress = message
                    _draw(ax, message)
                    _update_bar(bar, message)
                    if handle is not None:
                        handle.update(fig)
                    seen.redraws.append((time.monotonic() - t0, int(message["step"])))
            if finished:
                break
            if timeout is not None and time.monotonic() - t0 > timeout:
                raise TimeoutError(f"the cell is still running after {timeout} s; it keeps running on the engines.")
            time.sleep(interval)
        seen.result = ar.get()
    finally:
        if shown:
            plt.close(fig)  # the display handle holds the image; avoid a second copy at cell end
        if bar_handle is not None:
            _finish_bar(bar, bar_handle, seen.progress)
    return seen


def _check_async_result(ar: Any) -> None:
    # Duck-typed rather than an isinstance check: every ipyparallel result (AsyncResult,
    # AsyncMapResult, AsyncHubResult; ``%%px --out`` stores the same AsyncResult) has these, and
    # so does any wrapper of one. ``_`` is easily something else: ``init, _ = kmeans_plusplus(...)``
    # in a later cell rebinds it, and then the first poll failed with an AttributeError on ``ready``.
    if callable(getattr(ar, "ready", None)) and callable(getattr(ar, "get", None)):
        return
    kind = type(ar)
    package = kind.__module__.split(".")[0]
    name = kind.__qualname__ if package == "builtins" else f"{package}.{kind.__qualname__}"
    raise TypeError(
        "watch() takes the AsyncResult of a `%%px --noblock` cell (`_` right after it, or "
        f"`%%px --noblock --out name` and then watch(name)); got {name}."
    )


def _latest(ar: Any) -> dict[str, Any] | None:
    try:
        data = ar.data
    except Exception:  # noqa: BLE001 - metadata not there yet
        return None
    entries = data if isinstance(data, list) else [data]
    for entry in entries:
        if isinstance(entry, dict) and KEY in entry:
            return entry[KEY]
    return None


def _draw(ax: Any, message: dict[str, Any]) -> None:
    ax.clear()
    steps = message["steps"]
    kind = message["kind"]
    for name, values in sorted(message["series"].items()):
        ax.plot(steps[: len(values)], values, marker="o" if len(values) < 30 else None, ms=3, label=name)
    unit = "epoch" if kind == "loss" else "iteration"
    ax.set_xlabel(unit)
    ax.set_ylabel(kind)
    if kind == "inertia" and all(v > 0 for vs in message["series"].values() for v in vs):
        ax.set_yscale("log")
    total = f"/{message['total']}" if message.get("total") else ""
    state = "done" if message["done"] else "running"
    ax.set_title(f"{kind}: {unit} {message['step']}{total} ({state})")
    if message["series"]:
        ax.legend(loc="best", fontsize="small")
    ax.grid(True, alpha=0.3)


def _finish_bar(bar: Any, handle: Any, message: dict[str, Any] | None) -> None:
    """Replace the bar by one line of text once the watch ends. A saved notebook keeps a widget
    without its state, so its text stand-in showed the bar's first frame ("IntProgress(value=0,
    max=1)") under a finished cell; the line says where the run ended, in a live notebook too."""
    from IPython.display import Pretty

    if message is None:
        text = "progress: nothing was published"
    else:
        unit = "epoch" if message["kind"] == "loss" else "iteration"
        total = f" of {message['total']}" if message.get("total") else ""
        text = f"progress: {unit} {message['step']}{total}, {'done' if message['done'] else 'stopped'}"
    handle.update(Pretty(text))
    bar.close()


def _progress_bar() -> Any:
    try:
        import ipywidgets
    except ImportError:
        return None
    return ipywidgets.IntProgress(value=0, min=0, max=1, description="progress")


def _update_bar(bar: Any, message: dict[str, Any]) -> None:
    if bar is None:
        return
    total = message.get("total") or max(message["step"], 1)
    bar.max = int(total)
    bar.value = min(int(message["step"]), int(total))
    if message["done"]:
        bar.bar_style = "success"


def _data_publisher() -> Any:
    # Only an ipyparallel engine has a shell with a data publisher; never import IPython for this.
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return None
    shell = ipython.get_ipython()
    return getattr(shell, "data_pub", None) if shell is not None else None


def _in_ipython() -> bool:
    ipython = sys.modules.get("IPython")
    return ipython is not None and ipython.get_ipython() is not None


def _rank(comm: Any) -> int:
    if comm is None:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    return comm.Get_rank()
