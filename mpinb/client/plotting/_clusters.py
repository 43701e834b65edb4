"""Samples coloured by cluster, with the centres marked: :func:`plot_clusters`. Client."""

from __future__ import annotations

from typing import Any

import numpy as np

from mpinb._checks import check_int
from mpinb.client.plotting._common import axes, distinct_colors

__all__ = ["plot_clusters"]


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
    check_int(max_points, "max_points")
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

    ax = axes(ax)
    colors = distinct_colors(k)
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
        ax.legend(handles=_legend_handles(colors, ids, present, centers is not None), fontsize="small")
    return ax


def _legend_handles(colors: Any, ids: np.ndarray, present: np.ndarray, with_centres: bool) -> list[Any]:
    """Legend entries drawn for reading, not copied from the plot: the points may be 2-pixel dots,
    too small to tell colours apart in a legend, and the centres' marker takes the first cluster's
    colour there; so one full-size dot per cluster shown, and the centres as a neutral ``X``."""
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], linestyle="none", marker="o", markersize=8, markerfacecolor=colors[c],
                      markeredgewidth=0, label=f"cluster {ids[c]}") for c in present]
    if with_centres:
        handles.append(Line2D([], [], linestyle="none", marker="X", markersize=11, markerfacecolor="white",
                              markeredgecolor="black", markeredgewidth=1.5, label="centres"))
    return handles


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
