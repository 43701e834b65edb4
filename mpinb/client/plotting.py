"""Plots for the notebook: training curves, clusters, k-means inertia, timing and scaling.

Every function here is a client helper: it runs in the notebook kernel on results gathered from the
ranks, never imports ``mpi4py.MPI``, imports matplotlib only when called (so ``import mpinb`` stays
fast), draws into ``ax`` when given or a new figure otherwise, and returns the Axes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from mpinb.errors import _check_int

__all__ = ["plot_clusters", "plot_inertia", "plot_loss", "plot_speedup", "plot_timing"]

_IDEAL_GID = "mpinb-speedup-ideal"
_SERIES_GID = "mpinb-speedup"
_GLOBAL_WIDTH = 2.5
_RANK_WIDTH = 1.2
_RANK_ALPHA = 0.8
# Past this many ranks the legend gets one entry for all rank lines instead of one per rank.
_MAX_RANK_ENTRIES = 10


# --------------------------------------------------------------------------------------------------
# Training


def plot_loss(history: Any, metric: str = "loss", *, ax: Any = None, per_rank: bool = True) -> Any:
    """Plot the global training and validation curves, with each rank's own curve as a thinner line.

    Client. The global curves (``history[metric]`` and ``history["val_" + metric]``) are drawn in
    black, thick and on top (validation dashed), with epochs on the x axis starting at 1; each rank's
    per-epoch value (``history["rank_" + metric]``, epochs x ranks, as ``mpinb.keras.fit`` records
    ``"rank_loss"``, ``"rank_accuracy"``, ... for every metric) is drawn as a thinner line in a colour of its own, labelled ``"rank r"`` (past
    10 ranks the legend has one entry for all of them). A rank whose line strays from the others
    has a data shard that differs (harder examples, a different class balance) — with gradient
    averaging the model is the same on every rank, so only the data can make the per-rank losses
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
    n_epochs = len(train if train is not None else val)
    if table is not None and len(table) != n_epochs:
        raise ValueError(
            f"history[{rank_key!r}] must have one row per epoch ({n_epochs}) and one column per rank, as "
            f"mpinb.keras.fit records it; got shape {table.shape}."
        )
    ax = _axes(ax)
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
        colors = _distinct_colors(table.shape[1])
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
    _integer_ticks(ax)
    ax.set_xlabel("epoch")
    ax.set_ylabel(metric)
    if len(rank_lines) > _MAX_RANK_ENTRIES:
        from matplotlib.lines import Line2D

        handles, labels = ax.get_legend_handles_labels()
        kept = [(hd, lb) for hd, lb in zip(handles, labels) if hd not in rank_lines]
        proxy = Line2D([], [], color="0.5", linewidth=_RANK_WIDTH, alpha=_RANK_ALPHA)
        entries = [*kept, (proxy, f"ranks 0-{len(rank_lines) - 1} (one colour each)")]
        ax.legend(*zip(*entries), fontsize="small")
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
        instead of one bar of the mean over ranks.

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
    ax = _axes(ax)
    if per_rank and ranks > 1:
        width = 0.8 / ranks
        for r in range(ranks):
            x = epochs - 0.4 + width * (r + 0.5)
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
    _integer_ticks(ax)
    ax.set_xlabel("epoch")
    return ax


# --------------------------------------------------------------------------------------------------
# Clustering


def plot_clusters(
    X: Any,
    labels: Any,
    centers: Any = None,
    *,
    ax: Any = None,
    max_points: int = 20_000,
    random_state: int | None = 0,
) -> Any:
    """Scatter the samples coloured by cluster, with the cluster centres marked.

    Client. Each cluster gets one colour from a qualitative colormap, used for its points and for
    its centre (a large black-edged ``X``). With more than two features the points and centres are
    projected on the first two principal components (one transform for both), and the axes say how
    much variance each component explains. With more than ``max_points`` samples a uniform random
    subsample is drawn, topped up so that every cluster keeps at least one point; the title gives
    the full ``N`` and ``k``.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
        The samples, e.g. ``cluster.gather("X")``.
    labels : array-like of shape (n_samples,)
        Cluster of each sample, e.g. ``cluster.gather("labels")``. With ``centers``, integers
        ``0 .. k-1`` indexing its rows.
    centers : array-like of shape (k, n_features), optional
        Cluster centres, e.g. ``km.cluster_centers_``.
    ax : matplotlib.axes.Axes, optional
        Axes to draw into; a new figure is made when omitted.
    max_points : int, default 20_000
        Most points to draw. Must be at least the number of clusters.
    random_state : int or None, default 0
        Seed of the subsample (and of the PCA's solver), so the same call draws the same picture.

    Returns
    -------
    matplotlib.axes.Axes
        One scatter collection per cluster (in cluster order, labelled ``"cluster c"``), then one
        for the centres (labelled ``"centres"``).

    Raises
    ------
    ValueError
        If ``X`` is not 2-D with at least two features and finite values, ``labels`` does not have
        one entry per row, ``centers`` has a different number of columns, a label does not index a
        centre, or ``max_points`` is smaller than the number of clusters.

    Notes
    -----
    The principal components (``sklearn.decomposition.PCA(n_components=2)``, seeded with
    ``random_state`` for its randomized solver on large data) are fitted on the points that are
    drawn, so the cost is bounded by ``max_points`` whatever ``N``; on a uniform subsample of
    thousands of points the components are those of the full data to within sampling error.
    """
    X = np.asarray(X)
    if X.ndim != 2:
        raise ValueError(
            f"X must be 2-D (n_samples, n_features); got shape {X.shape}. "
            "Reshape a single feature with X[:, None]."
        )
    if X.shape[1] < 2:
        raise ValueError(f"X must have at least 2 features to scatter; got shape {X.shape}.")
    if not np.issubdtype(X.dtype, np.number):
        raise TypeError(f"X must hold numbers; got dtype {X.dtype}.")
    X = X.astype(np.float64, copy=False)
    labels = np.asarray(labels)
    if labels.ndim != 1 or len(labels) != len(X):
        raise ValueError(
            f"labels must have one entry per row of X: len(X) == {len(X)}; "
            f"got labels of shape {labels.shape}."
        )
    if len(X) == 0:
        raise ValueError(f"X must have at least one row; got shape {X.shape}. Gather the samples first.")
    finite = np.isfinite(X).all(axis=1)
    if not finite.all():
        raise ValueError(
            f"X must be finite; {int((~finite).sum())} of {len(X)} rows hold NaN or inf. "
            "Drop or impute them first."
        )
    if centers is not None:
        centers = np.asarray(centers, dtype=np.float64)
        if centers.ndim != 2 or centers.shape[1] != X.shape[1]:
            raise ValueError(
                f"centers must have shape (k, {X.shape[1]}) to match X's {X.shape[1]} columns; "
                f"got {centers.shape}."
            )
        k = len(centers)
        if not np.issubdtype(labels.dtype, np.integer):
            if (
                labels.size
                and np.issubdtype(labels.dtype, np.floating)
                and np.all(labels == np.round(labels))
            ):
                labels = labels.astype(np.int64)
            else:
                raise ValueError(
                    f"With centers, labels must be integers 0..{k - 1}; got dtype {labels.dtype}."
                )
        bad = (labels < 0) | (labels >= k)
        if bad.any():
            raise ValueError(
                f"With {k} centers, labels must be in 0..{k - 1} (row of centers); "
                f"got label {labels[bad][0]}."
            )
        ids = np.arange(k)
        codes = labels
    else:
        ids, codes = np.unique(labels, return_inverse=True)
        codes = codes.reshape(-1)
        k = len(ids)
    _check_int(max_points, "max_points")
    present = np.unique(codes)
    if max_points < max(len(present), 1):
        raise ValueError(
            f"max_points must be >= the number of clusters ({len(present)}) so each can be shown; "
            f"got {max_points}."
        )

    n = len(X)
    keep = _subsample(codes, max_points, random_state) if n > max_points else np.arange(n)
    points = X[keep]
    shown = codes[keep]

    if X.shape[1] > 2:
        pca, ratio = _pca2(points, random_state)
        points = pca.transform(points)
        if centers is not None:
            centers = pca.transform(centers)  # the same fit, so the centres sit among their points
        xlabel, ylabel = (f"PC{i + 1} ({100 * ratio[i]:.1f}% var)" for i in range(2))
    else:
        xlabel, ylabel = "feature 0", "feature 1"

    ax = _axes(ax)
    colors = _distinct_colors(k)
    size = float(np.clip(2e4 / max(len(points), 1), 2.0, 30.0))
    for c in range(k):
        mask = shown == c
        ax.scatter(
            points[mask, 0],
            points[mask, 1],
            s=size,
            color=colors[c],
            alpha=0.7,
            linewidths=0,
            label=f"cluster {ids[c]}",
        )
    if centers is not None:
        ax.scatter(
            centers[:, 0],
            centers[:, 1],
            s=220,
            marker="X",
            c=colors[:k],
            edgecolors="black",
            linewidths=1.5,
            label="centres",
            zorder=3,
        )
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    title = f"N = {n:,}, k = {k}"
    if len(keep) < n:
        title += f" ({len(keep):,} points shown)"
    ax.set_title(title)
    if k <= 10:
        ax.legend(fontsize="small")
    return ax


def plot_inertia(inertia_history: Any, *, ax: Any = None, log: bool = True) -> Any:
    """Plot k-means inertia against iteration, for one run or several side by side.

    Client. Iterations are numbered from 1. Inertia falls monotonically for Lloyd's algorithm, so a
    curve that rises points at a bug or at relocated empty clusters.

    Parameters
    ----------
    inertia_history : array-like, fitted estimator or dict
        One run's inertia per iteration (a list or 1-D array), a fitted estimator with an
        ``inertia_history_`` attribute (``mpinb.KMeans``), or a dict ``{name: history}`` whose values
        are either of those, drawn as one labelled line each.
    ax : matplotlib.axes.Axes, optional
        Axes to draw into; a new figure is made when omitted.
    log : bool, default True
        Logarithmic y axis; needs every inertia > 0.

    Returns
    -------
    matplotlib.axes.Axes

    Raises
    ------
    TypeError
        If a history is neither a sequence of numbers nor an estimator with ``inertia_history_``.
    ValueError
        If a history is empty or not 1-D, or ``log=True`` meets an inertia <= 0.
    """
    if isinstance(inertia_history, Mapping):
        if not inertia_history:
            raise ValueError("inertia_history is an empty dict; give {name: history} for at least one run.")
        runs = [(str(name), _inertia_values(value, name)) for name, value in inertia_history.items()]
    else:
        runs = [(None, _inertia_values(inertia_history, None))]
    if log:
        for name, values in runs:
            if np.any(values <= 0):
                where = "" if name is None else f" of {name!r}"
                raise ValueError(
                    f"log=True needs inertia > 0; the history{where} holds {values[values <= 0][0]:g}. "
                    "Pass log=False."
                )
    ax = _axes(ax)
    for name, values in runs:
        ax.plot(np.arange(1, len(values) + 1), values, marker="o", markersize=3, label=name)
    if log:
        ax.set_yscale("log")
    _integer_ticks(ax)
    ax.set_xlabel("iteration")
    ax.set_ylabel("inertia")
    if runs[0][0] is not None:
        ax.legend(fontsize="small")
    return ax


# --------------------------------------------------------------------------------------------------
# Scaling


def plot_speedup(ranks: Any, seconds: Any, *, ax: Any = None, label: str | None = None) -> Any:
    """Plot measured speed-up against the number of ranks, with the ideal (linear) line.

    Client. Speed-up is relative to the smallest rank count measured:
    ``S(p) = seconds[p0] / seconds[p]``, and the ideal is ``p / p0``. Calling it again on the same
    Axes adds another series (give each a ``label``) and extends the ideal line when needed.

    Parameters
    ----------
    ranks : sequence of int
        Numbers of ranks measured, each >= 1 and distinct (any order).
    seconds : sequence of float
        Wall-clock seconds of the same work at each rank count, > 0.
    ax : matplotlib.axes.Axes, optional
        Axes to draw into; a new figure is made when omitted.
    label : str, optional
        Legend label of this series (default ``"measured"``).

    Returns
    -------
    matplotlib.axes.Axes

    Raises
    ------
    ValueError
        If the lengths differ, a rank count is not a positive integer or repeats, or a time is not > 0.
    """
    p = np.asarray(ranks)
    t = np.asarray(seconds, dtype=np.float64)
    if p.ndim != 1 or t.ndim != 1 or len(p) != len(t) or len(p) == 0:
        raise ValueError(
            f"ranks and seconds must be 1-D with one time per rank count; got shapes {p.shape} and {t.shape}."
        )
    if not np.issubdtype(p.dtype, np.number) or np.any(p < 1) or np.any(p != np.round(p)):
        raise ValueError(f"ranks must be integers >= 1; got {list(ranks)}.")
    p = p.astype(np.int64)
    if len(np.unique(p)) != len(p):
        raise ValueError(
            f"ranks must be distinct (one time per rank count; average repeats first); got {p.tolist()}."
        )
    if not np.all(np.isfinite(t)) or np.any(t <= 0):
        raise ValueError(f"seconds must be finite and > 0; got {t.tolist()}.")
    order = np.argsort(p)
    p, t = p[order], t[order]
    speedup = t[0] / t

    ax = _axes(ax)
    ideal = next((line for line in ax.get_lines() if line.get_gid() == _IDEAL_GID), None)
    measured = [np.asarray(line.get_xdata()) for line in ax.get_lines() if line.get_gid() == _SERIES_GID]
    xs = np.unique(np.concatenate([p, *measured]))
    lo, hi = float(xs[0]), float(xs[-1])
    if ideal is None:
        ideal = ax.plot([], [], color="0.5", linestyle="--", label="ideal", gid=_IDEAL_GID)[0]
    # The ideal line starts at 1x at the smallest rank count of the first series drawn.
    base, base_speedup = (
        (p[0], 1.0) if not len(ideal.get_xdata()) else (ideal.get_xdata()[0], ideal.get_ydata()[0])
    )
    ideal.set_data([lo, hi], [base_speedup * lo / base, base_speedup * hi / base])
    ax.plot(p, speedup, marker="o", label=label or "measured", gid=_SERIES_GID)
    ax.set_xticks(xs.tolist())
    pad = 0.05 * (hi - lo) if hi > lo else 0.5
    ax.set_xlim(lo - pad, hi + pad)
    ax.relim()  # the ideal line's data changed after it was drawn
    ax.autoscale_view(scalex=False)
    ax.set_xlabel("ranks")
    ax.set_ylabel("speed-up")
    ax.legend(fontsize="small")
    return ax


# --------------------------------------------------------------------------------------------------
# Private helpers


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


def _inertia_values(value: Any, name: Any) -> np.ndarray:
    where = "inertia_history" if name is None else f"inertia_history[{name!r}]"
    if hasattr(value, "inertia_history_"):
        value = value.inertia_history_
    elif hasattr(value, "fit") and hasattr(value, "get_params"):
        raise TypeError(
            f"{where} is an estimator without inertia_history_ ({type(value).__name__}); fit an "
            "mpinb.KMeans, or pass the list of inertias per iteration."
        )
    if isinstance(value, (str, bytes, Mapping)):
        raise TypeError(
            f"{where} must be a sequence of inertias, one per iteration; got {type(value).__name__}."
        )
    try:
        values = np.asarray(value, dtype=np.float64)
    except (ValueError, TypeError):
        raise TypeError(
            f"{where} must be a sequence of inertias, one per iteration; got {value!r:.80}."
        ) from None
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"{where} must be a non-empty 1-D sequence of inertias; got shape {values.shape}.")
    return values


def _subsample(codes: np.ndarray, max_points: int, random_state: int | None) -> np.ndarray:
    """Sorted indices of ``max_points`` rows: one random row of every cluster, the rest uniform."""
    rng = np.random.default_rng(random_state)
    n = len(codes)
    # One row per cluster first: a random permutation's first occurrence of each code is a uniformly
    # chosen member of that cluster.
    perm = rng.permutation(n)
    _, first = np.unique(codes[perm], return_index=True)
    chosen = perm[first]
    rest = np.setdiff1d(np.arange(n), chosen, assume_unique=True)
    extra = rng.choice(rest, size=max_points - len(chosen), replace=False)
    return np.sort(np.concatenate([chosen, extra]))


def _pca2(points: np.ndarray, random_state: int | None) -> tuple[Any, np.ndarray]:
    """scikit-learn's PCA with two components fitted on ``points``, and its explained-variance ratios."""
    from sklearn.decomposition import PCA

    # PCA needs two samples for two components; a lone point (no spread) is fitted as a pair.
    fitted = points if len(points) > 1 else np.repeat(points, 2, axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):  # identical points: 0 / 0 total variance
        pca = PCA(n_components=2, random_state=random_state).fit(fitted)
    return pca, np.nan_to_num(np.asarray(pca.explained_variance_ratio_, dtype=np.float64))


def _distinct_colors(k: int) -> np.ndarray:
    """``k`` distinct RGBA colours (clusters, ranks): a qualitative colormap, evenly spaced hues past 20."""
    import matplotlib

    if k <= 10:
        return np.asarray(matplotlib.colormaps["tab10"].colors)[:k]
    if k <= 20:
        # tab20 pairs a dark and a light shade of each hue: take all dark shades first, so that
        # neighbouring cluster numbers differ in hue, not only in lightness.
        colors = np.asarray(matplotlib.colormaps["tab20"].colors)
        return np.concatenate([colors[0::2], colors[1::2]])[:k]
    return matplotlib.colormaps["turbo"](np.linspace(0.0, 1.0, k))


def _axes(ax: Any) -> Any:
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots()
        return ax
    if not hasattr(ax, "plot") or not hasattr(ax, "scatter"):
        raise TypeError(f"ax must be a matplotlib Axes (e.g. from plt.subplots()); got {type(ax).__name__}.")
    return ax


def _integer_ticks(ax: Any) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
