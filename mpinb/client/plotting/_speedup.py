"""Measured speed-up against the number of ranks, with the ideal line: :func:`plot_speedup`. Client."""

from __future__ import annotations

from typing import Any

import numpy as np

from mpinb.client.plotting._common import axes

__all__ = ["plot_speedup"]

_IDEAL_GID = "mpinb-speedup-ideal"
_SERIES_GID = "mpinb-speedup"


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

    ax = axes(ax)
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
