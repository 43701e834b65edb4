"""`evaluate`: exact global metrics over test shards of any sizes, by summing metric states."""

from __future__ import annotations

from typing import Any

import numpy as np

from mpinb._checks import check_int, default_comm
from mpinb._training.averaging import sum_arrays
from mpinb.agreement import raise_together
from mpinb.comm import allreduce
from mpinb.keras._arrays import check_xy, dummy_row

__all__ = ["evaluate", "global_evaluate"]


def evaluate(model: Any, x: Any, y: Any, *, batch_size: int = 32, comm: Any = None) -> dict[str, float]:
    """Exact global metrics of a compiled model over test shards of any sizes.

    Collective. Each rank evaluates its own rows; then every metric's state variables (totals and
    counts, confusion counts, ...) are summed over ranks before the results are read, so the numbers
    equal one process evaluating all rows, even when shards are uneven or some are empty. (Averaging
    per-rank results would weight small shards too much.) Metrics whose state does not add up
    across rows, such as a running maximum, are not supported.

    Parameters
    ----------
    model : keras.Model
        Compiled; the same on every rank.
    x, y : array_like
        This rank's rows; zero rows are fine as long as some rank has rows.
    batch_size : int, default 32
        Rows per evaluation batch on each rank (affects speed, not the result).
    comm : mpi4py.MPI.Comm, optional
        Defaults to ``MPI.COMM_WORLD``.

    Returns
    -------
    dict
        Metric name → value (``"loss"`` first among sorted keys), identical on every rank.

    Examples
    --------
    >>> scores = mpinb.keras.evaluate(model, X_test_local, y_test_local)
    >>> scores["accuracy"]
    """
    comm = default_comm(comm)
    with raise_together(comm=comm):
        check_int(batch_size, "batch_size", minimum=1)
        n_local = check_xy(x, y, "x", "y")
        if not getattr(model, "compiled", False):
            raise ValueError("evaluate needs a compiled model: call model.compile(loss=..., metrics=...) first.")
    (total,) = allreduce([np.int64(n_local)], comm=comm)
    if total == 0:
        raise ValueError("evaluate got no rows on any rank; pass each rank's test shard.")
    return global_evaluate(model, x, y, n_local, batch_size, comm)


def global_evaluate(model: Any, x: Any, y: Any, n_local: int, batch_size: int, comm: Any) -> dict[str, float]:
    """Collective: every metric's state summed over ranks, read, then this rank's own put back."""
    if n_local > 0:
        model.evaluate(x, y, batch_size=batch_size, verbose=0, return_dict=True)
    else:
        # Metric variables are created on the first update; an empty shard evaluates one dummy row
        # so its metrics have the same layout as everyone else's, then zeroes their state.
        model.evaluate(dummy_row(x), dummy_row(y), verbose=0, return_dict=True)
        for m in model.metrics:
            m.reset_state()
    variables = list(model.metrics_variables)
    local = [np.array(v.numpy(), copy=True) for v in variables]
    for v, s in zip(variables, sum_arrays(local, comm=comm)):
        v.assign(s)
    results = model.get_metrics_result()
    for v, mine in zip(variables, local):
        v.assign(mine)  # leave this rank's own state as Keras left it
    return {k: float(np.asarray(results[k])) for k in sorted(results)}
