"""Averaging and summing NumPy arrays over ranks: model state, metric states and epoch logs.

Collective. A framework's glue turns its variables into NumPy arrays, calls these, and writes the
results back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from mpinb._training.packing import Packer, divide_by_rows, sum_over_ranks
from mpinb.agreement import check_same
from mpinb.comm import allreduce, gather_rows

__all__ = ["ArrayAverager", "gather_logs", "sum_arrays"]


def sum_arrays(arrays: Sequence[np.ndarray], *, comm: Any) -> list[np.ndarray]:
    """Sum over ranks of each array, floats accumulated in float64 and cast back.

    Collective: one fused Allreduce per wire dtype.
    """
    wide = [np.asarray(a, dtype=np.float64) if np.asarray(a).dtype.kind == "f" else np.asarray(a) for a in arrays]
    reduced = allreduce(wide, op="sum", comm=comm)
    return [np.asarray(r).astype(np.asarray(a).dtype) for r, a in zip(reduced, arrays, strict=True)]


def gather_logs(logs: Mapping[str, Any], *, comm: Any,
                weights: Sequence[float] | None = None) -> tuple[dict[str, float], list[dict[str, float]]]:
    """Every rank's numeric scalar logs, and their mean over ranks (weighted by ``weights``, one
    per rank, when given: each rank's rows, so a rank with more rows counts more and a rank of
    weight 0 not at all).

    Collective. The key sets are checked first, so a rank whose logs differ makes every rank raise
    :class:`~mpinb.CollectiveMismatchError` naming each rank's keys instead of mixing up values.
    The values then travel in one buffer gather; the mean is the same arithmetic on the same
    numbers in rank order, so it is identical on every rank. Returns ``(means, per_rank)``.
    """
    keys = sorted(k for k, v in logs.items() if _is_scalar(v))
    check_same(keys, "the names of the logged metrics", comm=comm)
    values = gather_rows(np.array([[float(logs[k]) for k in keys]], dtype=np.float64), root=None, comm=comm)
    assert values is not None  # root=None: on every rank
    if not keys:
        means = np.zeros(0)
    elif weights is None:
        means = values.mean(axis=0)
    else:
        w = np.asarray(weights, dtype=np.float64)[:, None]
        means = np.where(w > 0, values * w, 0.0).sum(axis=0) / w.sum()
    per_rank = [dict(zip(keys, (float(v) for v in row), strict=True)) for row in values]
    return dict(zip(keys, (float(m) for m in means), strict=True)), per_rank


def _is_scalar(value: Any) -> bool:
    try:
        return np.ndim(value) == 0 and np.asarray(value).dtype.kind in "biuf"
    except Exception:  # noqa: BLE001 - anything odd is simply not averaged
        return False


class ArrayAverager:
    """Averages arrays of one fixed layout over ranks again and again (the weight strategy's
    average every few steps), through one reused packed buffer per dtype.

    The one averager of mpinb (the weight strategy's averages, the non-trainable variables at an
    epoch's end): the layout is checked once per layout, and arrays are scaled by ``1/size`` (or by
    this rank's rows) while they are packed, so no scratch copy and no division pass follow.
    """

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self._packer: Packer | None = None
        self._layout: list[tuple[tuple[int, ...], str]] | None = None

    def average(self, arrays: Sequence[np.ndarray], rows: float | None = None) -> tuple[list[np.ndarray], float]:
        """Collective. Returns the means (views of the buffer, valid until the next call) and the
        seconds spent waiting for the slowest rank to arrive.

        With ``rows`` (this rank's rows since the last average), the mean weighted by every rank's
        rows: each rank scales by its rows and adds them to one extra slot of the same message, and
        the sum is divided by the slot's total. A rank of 0 rows takes no part, whatever it holds
        (the NaN statistics of a step without rows included). Where no rank had rows, the plain mean.
        """
        arrays = tuple(np.asarray(a, order="C") for a in arrays)  # (ascontiguousarray makes 0-d 1-d)
        if rows is not None:
            arrays = (*arrays, np.ones(1, dtype=arrays[0].dtype))  # after scaling: this rank's rows
        layout = [(a.shape, a.dtype.str) for a in arrays]
        if layout != self._layout:
            check_same(layout, "the shapes and dtypes of the averaged weights and optimizer state", comm=self.comm)
            self._packer, self._layout = Packer(arrays), layout
        assert self._packer is not None
        bufs, out, _ = self._packer.fill(arrays, 1.0 / self.comm.Get_size() if rows is None else float(rows))
        op = sum_over_ranks(bufs, self.comm, "fit's weight average")
        if rows is None:
            return out, op.waited
        if divide_by_rows(out, bufs) == 0:  # the same on every rank: the sum of every rank's rows
            again, waited = self.average(arrays[:-1])
            return again, op.waited + waited
        return out, op.waited
