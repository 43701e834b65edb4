"""k-means inertia against iteration, for one run or several: :func:`plot_inertia`. Client."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from mpinb.client.plotting._common import axes, integer_ticks

__all__ = ["plot_inertia"]


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
        One line per run, in the order given, labelled with its name when ``inertia_history`` is a dict.

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
        runs: list[tuple[str | None, np.ndarray]] = [
            (str(name), _inertia_values(value, name)) for name, value in inertia_history.items()]
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
    ax = axes(ax)
    for name, values in runs:
        ax.plot(np.arange(1, len(values) + 1), values, marker="o", markersize=3, label=name)
    if log:
        ax.set_yscale("log")
    integer_ticks(ax)
    ax.set_xlabel("iteration")
    ax.set_ylabel("inertia")
    if runs[0][0] is not None:
        ax.legend(fontsize="small")
    return ax


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
