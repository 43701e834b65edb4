"""Training curves and timings from what ``mpinb.keras.fit`` records: :func:`plot_loss`, :func:`plot_timing`. Client."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from mpinb.client.plotting._common import axes, distinct_colors, integer_ticks

__all__ = ["plot_loss", "plot_timing"]

_GLOBAL_WIDTH = 2.5
_RANK_WIDTH = 1.2
_RANK_ALPHA = 0.8
# Past this many ranks the legend gets one entry for all rank lines instead of one per rank.
_MAX_RANK_ENTRIES = 10


def plot_loss(history: Any, metric: str = "loss", *, ax: Any = None, per_rank: bool = True) -> Any:
    """Plot the global training and validation curves, with each rank's own curve as a thinner line.

    Client. The global curves (``history[metric]`` and ``history["val_" + metric]``) are drawn in
    black, thick and on top (validation dashed), with epochs on the x axis starting at 1; each rank's
    per-epoch value (``history["rank_" + metric]``, epochs x ranks, as ``mpinb.keras.fit`` records
    ``"rank_loss"``, ``"rank_accuracy"``, ... for every metric) is drawn as a thinner line in a colour of its
    own, labelled ``"rank r"`` (past 10 ranks the legend has one entry for all of them). A rank whose line
    strays from the others has a data shard that differs (harder examples, a different class balance) — with
    gradient averaging the model is the same on every rank, so only the data can make the per-rank losses
    differ.

    Parameters
    ----------
    history : dict or keras.callbacks.History
        What ``mpinb.keras.fit`` returns (a dict ``{"epoch": [...], "loss": [...], "val_loss": [...],
        "rank_loss": [[...], ...], ...}``, also as pulled from rank 0), or the ``History`` that
        Keras's ``model.fit`` returns (its ``.history`` dict, which has no per-rank values).
    ax : matplotlib.axes.Axes, optional
        Axes to draw into; a new figure is made when omitted.
    metric : str, default "loss"
        Which metric to plot, e.g. ``"accuracy"``.
    per_rank : bool, default True
        Draw each rank's line when the history has per-rank values (silently skipped otherwise).

    Returns
    -------
    matplotlib.axes.Axes
        Lines labelled ``"train"`` and ``"validation"`` (those the history has), then ``"rank r"``.

    Raises
    ------
    TypeError
        If ``history`` is neither a dict nor an object with a ``.history`` dict.
    ValueError
        If the history has neither ``metric`` nor ``"val_" + metric``, a global series is not one
        number per epoch, or the per-rank values are not an epochs x ranks table with one row per
        epoch.

    Examples
    --------
    >>> history = cluster.pull_root("history")           # doctest: +SKIP
    >>> mpinb.plot_loss(history)                          # doctest: +SKIP
    """
    if not isinstance(metric, str):
        raise TypeError(f"metric must be a string such as 'loss' or 'accuracy'; got {metric!r}.")
    h = _history_dict(history)
    val_key, rank_key = "val_" + metric, "rank_" + metric
    if metric not in h and val_key not in h:
        logged = sorted({k[4:] if k.startswith("val_") else k for k in h if _is_metric(h, k)})
        raise ValueError(
            f"The history has no {metric!r} or {val_key!r} values; its keys are {sorted(h)}. {metric!r} was "
            f"not logged; the metrics logged are {logged}: pass metric= one of those, or compile the model "
            f"with metrics=[{metric!r}] to log it."
        )
    # Read and check every series before drawing, so bad input leaves no half-drawn figure behind.
    train = _series(h, metric, ndim=1) if metric in h else None
    val = _series(h, val_key, ndim=1) if val_key in h else None
    table = _series(h, rank_key, ndim=2) if per_rank and _nonempty(h, rank_key) else None
    series = train if train is not None else val
    assert series is not None  # the caller checked that h holds one of them
    n_epochs = len(series)
    if table is not None and len(table) != n_epochs:
        raise ValueError(
            f"history[{rank_key!r}] must have one row per epoch ({n_epochs}) and one column per rank, as "
            f"mpinb.keras.fit records it; got shape {table.shape}."
        )
    ax = axes(ax)
    epochs = _epoch_numbers(h, n_epochs)
    # Global lines first, so they lead the legend; zorder keeps them drawn over the rank lines.
    if train is not None:
        ax.plot(epochs, train, color="black", linewidth=_GLOBAL_WIDTH, label="train", zorder=3)
    if val is not None:
        ax.plot(
            _epoch_numbers(h, len(val)),
            val,
            color="black",
            linewidth=_GLOBAL_WIDTH,
            linestyle="--",
            label="validation",
            zorder=3,
        )
    rank_lines = []
    if table is not None:
        colors = distinct_colors(table.shape[1])
        for r in range(table.shape[1]):
            (line,) = ax.plot(
                epochs,
                table[:, r],
                color=colors[r],
                linewidth=_RANK_WIDTH,
                alpha=_RANK_ALPHA,
                label=f"rank {r}",
                zorder=2,
            )
            rank_lines.append(line)
    integer_ticks(ax)
    ax.set_xlabel("epoch")
    ax.set_ylabel(metric)
    if len(rank_lines) > _MAX_RANK_ENTRIES:
        from matplotlib.lines import Line2D

        handles, labels = ax.get_legend_handles_labels()
        kept = [(hd, lb) for hd, lb in zip(handles, labels, strict=True) if hd not in rank_lines]
        proxy = Line2D([], [], color="0.5", linewidth=_RANK_WIDTH, alpha=_RANK_ALPHA)
        entries = [*kept, (proxy, f"ranks 0-{len(rank_lines) - 1} (one colour each)")]
        ax.legend(*zip(*entries, strict=True), fontsize="small")
    else:
        ax.legend(fontsize="small")
    return ax


def plot_timing(history: Any, *, ax: Any = None, per_rank: bool = False) -> Any:
    """Plot compute and communication seconds per epoch as stacked bars.

    Client. The lower (blue) part of each bar is compute, the upper (orange) part is the time spent
    in gradient or weight averaging (the Allreduce), so the whole bar is the epoch's time and the
    orange share is what adding ranks costs. A rank that computes faster than the others waits
    longer in the Allreduce, so per-rank bars (``per_rank=True``) show load imbalance as a
    difference in how the same epoch time is split.

    Parameters
    ----------
    history : dict
        What ``mpinb.keras.fit`` returns (also as pulled from rank 0): its ``"compute_seconds"`` and
        ``"comm_seconds"``, each epochs x ranks, are read. Epochs are numbered
        ``history["epoch"] + 1`` (a resumed run starts later). A Keras ``History`` records no
        timings.
    ax : matplotlib.axes.Axes, optional
        Axes to draw into; a new figure is made when omitted.
    per_rank : bool, default False
        With more than one rank, draw one thin stacked bar per rank side by side in each epoch
        instead of one bar of the mean over ranks; beyond 12 epochs, consecutive epochs are
        averaged in groups so that at most 12 groups of bars are drawn (the title says how many
        epochs a group holds).

    Returns
    -------
    matplotlib.axes.Axes
        Bar containers labelled ``"compute"`` and ``"communication"`` (``"... rank r"`` with
        ``per_rank=True``).

    Raises
    ------
    TypeError
        If ``history`` is neither a dict nor an object with a ``.history`` dict.
    ValueError
        If the timing keys are missing, are not epochs x ranks tables of the same shape, or hold a
        negative time.
    """
    h = _history_dict(history)
    if "compute_seconds" not in h or "comm_seconds" not in h:
        raise ValueError(
            "plot_timing needs 'compute_seconds' and 'comm_seconds' (epochs x ranks) in the history; its "
            f"keys are {sorted(h)}. Train with mpinb.keras.fit, which records them."
        )
    compute = _timing(h, "compute_seconds")
    comm = _timing(h, "comm_seconds")
    if compute.shape != comm.shape:
        raise ValueError(
            "history['compute_seconds'] and history['comm_seconds'] must have the same shape "
            f"(epochs x ranks); got {compute.shape} and {comm.shape}."
        )
    epochs = _epoch_numbers(h, len(comm))
    ranks = comm.shape[1]
    ax = axes(ax)
    title = "Time per epoch: compute and communication"
    if per_rank and ranks > 1:
        # Beyond a dozen epochs, bars one rank wide each become hairlines: consecutive epochs are
        # averaged in groups, so there are at most a dozen groups of bars whatever the run's length.
        group = -(-len(epochs) // _MAX_GROUPS)
        if group > 1:
            starts = np.arange(0, len(epochs), group)
            sizes = np.diff(np.append(starts, len(epochs)))[:, None]
            compute = np.add.reduceat(compute, starts, axis=0) / sizes
            comm = np.add.reduceat(comm, starts, axis=0) / sizes
            epochs = np.add.reduceat(epochs.astype(np.float64), starts) / sizes[:, 0]
            title += f"\n(mean of each {group} epochs)"
        width = 0.8 * group / ranks
        for r in range(ranks):
            x = epochs - 0.4 * group + width * (r + 0.5)
            # Only rank 0's pair goes in the legend; the colours already say compute/communication.
            ax.bar(
                x,
                compute[:, r],
                width=width,
                color="C0",
                edgecolor="white",
                linewidth=0.3,
                label=f"compute rank {r}",
            )
            ax.bar(
                x,
                comm[:, r],
                width=width,
                bottom=compute[:, r],
                color="C1",
                edgecolor="white",
                linewidth=0.3,
                label=f"communication rank {r}",
            )
        handles = ax.containers[-2 * ranks :][:2]
        ax.legend(
            handles, ["compute", "communication"], fontsize="small", title=f"{ranks} ranks, left to right"
        )
        ax.set_ylabel("seconds")
    else:
        compute, comm = compute.mean(axis=1), comm.mean(axis=1)
        ax.bar(epochs, compute, color="C0", label="compute")
        ax.bar(epochs, comm, bottom=compute, color="C1", label="communication")
        ax.legend(fontsize="small")
        ax.set_ylabel("seconds" if ranks == 1 else f"seconds (mean over {ranks} ranks)")
    integer_ticks(ax)
    ax.set_xlabel("epoch")
    ax.set_title(title)
    return ax


_MAX_GROUPS = 12  # groups of per-rank bars plot_timing draws at most


def _history_dict(history: Any) -> dict[str, Any]:
    """The history as a dict: what ``mpinb.keras.fit`` returns, or a Keras ``History``'s ``.history``."""
    if isinstance(history, Mapping):
        return dict(history)
    # Duck-typed, so that keras is not imported here (and an exception raised by mpinb.keras.fit,
    # which carries the history up to the stop as its .history, plots too).
    if isinstance(getattr(history, "history", None), Mapping):
        return dict(history.history)
    raise TypeError(
        "history must be what mpinb.keras.fit returns (a dict {'loss': [...], 'rank_loss': [...], ...}) or a "
        f"keras.callbacks.History from model.fit (its .history dict); got {type(history).__name__}."
    )


def _timing(h: Mapping[str, Any], key: str) -> np.ndarray:
    """``h[key]`` as an epochs x ranks array of seconds, checked."""
    values = _series(h, key, ndim=2)
    bad = ~(values >= 0)  # also catches NaN
    if bad.any():
        raise ValueError(f"history[{key!r}] must hold seconds >= 0; got {values[bad][0]:g}.")
    return values


def _epoch_numbers(h: Mapping[str, Any], n: int) -> np.ndarray:
    """1-based epoch numbers for ``n`` epochs: ``history["epoch"] + 1`` when it fits, else 1..n."""
    try:
        epoch = np.asarray(h.get("epoch"), dtype=np.float64)
    except (ValueError, TypeError):
        epoch = None
    if epoch is not None and epoch.shape == (n,) and np.all(np.isfinite(epoch)):
        return epoch.astype(np.int64) + 1
    return np.arange(1, n + 1)


def _is_metric(h: Mapping[str, Any], key: str) -> bool:
    """Whether ``h[key]`` is a logged metric: one number per epoch, not a per-rank table or bookkeeping."""
    if key in ("epoch", "steps") or key.startswith("rank_") or not isinstance(key, str):
        return False
    try:
        return np.asarray(h[key], dtype=np.float64).ndim == 1
    except (ValueError, TypeError):
        return False


def _nonempty(h: Mapping[str, Any], key: str) -> bool:
    # mpinb.keras.fit leaves "rank_loss" as [] when no loss was logged: treat it as absent.
    value = h.get(key)
    return value is not None and (not hasattr(value, "__len__") or len(value) > 0)


def _series(h: Mapping[str, Any], key: str, *, ndim: int) -> np.ndarray:
    """``h[key]`` as a float array of the given rank, with a message naming the key when it is not."""
    what = (
        "one number per epoch" if ndim == 1 else "an epochs x ranks table (a list of lists of equal length)"
    )
    try:
        values = np.asarray(h[key], dtype=np.float64)
    except (ValueError, TypeError):
        raise ValueError(f"history[{key!r}] must be {what}; got {h[key]!r:.80}.") from None
    if values.ndim != ndim or values.size == 0:
        raise ValueError(f"history[{key!r}] must be {what}; got an array of shape {values.shape}.")
    return values
