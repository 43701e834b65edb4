"""What every plot does: draw into the caller's Axes or a new figure, integer ticks, distinct colours. Client."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["axes", "distinct_colors", "integer_ticks"]


def distinct_colors(k: int) -> np.ndarray:
    """``k`` distinct RGBA colours (clusters, ranks): a qualitative colormap, evenly spaced hues past 20."""
    import matplotlib

    if k <= 10:
        return np.asarray(matplotlib.colormaps["tab10"].colors)  # type: ignore[attr-defined]  # a ListedColormap[:k]
    if k <= 20:
        # tab20 pairs a dark and a light shade of each hue: take all dark shades first, so that
        # neighbouring cluster numbers differ in hue, not only in lightness.
        colors = np.asarray(matplotlib.colormaps["tab20"].colors)  # type: ignore[attr-defined]  # listed
        return np.concatenate([colors[0::2], colors[1::2]])[:k]
    return matplotlib.colormaps["turbo"](np.linspace(0.0, 1.0, k))


def axes(ax: Any) -> Any:
    """``ax`` checked to be an Axes, or a new figure's when ``None``."""
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots()
        return ax
    if not hasattr(ax, "plot") or not hasattr(ax, "scatter"):
        raise TypeError(f"ax must be a matplotlib Axes (e.g. from plt.subplots()); got {type(ax).__name__}.")
    return ax


def integer_ticks(ax: Any) -> None:
    """Whole numbers on the x axis (epochs, iterations)."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
