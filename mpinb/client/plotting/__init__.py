"""Plots for the notebook: training curves, clusters, k-means inertia, timing and scaling.

Every function here is a client helper: it runs in the notebook kernel on results gathered from the
ranks, never imports ``mpi4py.MPI``, imports matplotlib only when called (so ``import mpinb`` stays
fast), draws into ``ax`` when given or a new figure otherwise, and returns the Axes.
"""

from __future__ import annotations

from mpinb.client.plotting._clusters import plot_clusters
from mpinb.client.plotting._inertia import plot_inertia
from mpinb.client.plotting._speedup import plot_speedup
from mpinb.client.plotting._training import plot_loss, plot_timing

__all__ = ["plot_clusters", "plot_inertia", "plot_loss", "plot_speedup", "plot_timing"]
