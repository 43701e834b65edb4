"""Packing many arrays into one buffer per dtype for a collective: a step's gradients into reused,
aligned buffers (scaled and checked in one pass), or a model's state into tight buffers to broadcast."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from mpinb import _collective, _numba
from mpinb._layout import BufferPool, Layout
from mpinb.comm import bcast

__all__ = ["Packer", "bcast_arrays", "divide_by_rows", "scale_in_place", "sum_over_ranks"]


class Packer:
    """Lays gradients of one fixed set of shapes out in one buffer per dtype, and reuses buffers.

    Each gradient starts on a 64-byte boundary, so TensorFlow wraps the returned views without
    copying them. A set of buffers is refilled only once TensorFlow has dropped every view of it
    (:class:`~mpinb._layout.BufferPool` tells): with ``steps_per_execution > 1`` TensorFlow holds one
    step's views into the next, so a few sets take turns, and a new set is made only when all of
    them are still in use.
    """

    _ALIGN = 64
    _KEEP = 4  # sets of buffers kept for reuse

    def __init__(self, grads: tuple[np.ndarray, ...]) -> None:
        self.plan = Layout([g.shape for g in grads], [g.dtype for g in grads], align=self._ALIGN)
        # Zeroed when made: the padding between gradients is summed with the other ranks' zeros.
        # Each set's views (the gradients, shaped, then their flat slots) are made once with it.
        self._pool = BufferPool(self.plan.lengths, self.plan.dtypes, align=self._ALIGN, keep=self._KEEP,
                                views=self._views)

    def _views(self, bufs: list[np.ndarray]) -> list[np.ndarray]:
        return [*self.plan.views(bufs), *[bufs[b][start:stop] for b, start, stop in self.plan.slots]]

    def fill(self, grads: tuple[np.ndarray, ...], scale: float) -> tuple[list[np.ndarray], list[np.ndarray], bool]:
        """Copy ``grads * scale`` into an idle set of buffers; returns them, each gradient's place
        in them as a view shaped like it (the set stays in use while any of those views lives), and
        whether every gradient is finite (checked in the same pass: this rank's non-finite vote).

        Scaling before the sum is exact for a power-of-two number of ranks, and otherwise differs
        from dividing afterwards only by round-off, identically on every rank. Voting on the local
        gradients (rather than scanning the sum) costs no extra pass; a sum of finite values that
        overflows is caught one step later, by the gradients of the loss it makes infinite. A scale
        of 0 (a rank with no rows in this step) writes zeros: its gradients, of an empty batch, take
        no part, and nothing non-finite in them votes.
        """
        bufs, made = self._pool.take_with_views()
        views = cast(list[np.ndarray], made)  # _views makes no None
        n = len(grads)
        shaped, slots = views[:n], views[n:]
        if scale == 0:
            for buf in bufs:
                buf.fill(0)
            return bufs, shaped, True
        finite = True
        for g, dst in zip(grads, slots, strict=True):
            finite &= _scale_into(g.reshape(-1), dst.dtype.type(scale), dst)
        return bufs, shaped, finite


def sum_over_ranks(bufs: list[np.ndarray], comm: Any, name: str, votes: tuple[int, ...] = ()) -> Any:
    """Sum each buffer of ``bufs`` over the ranks, in place; returns the finished operation, whose
    ``waited`` is the seconds spent waiting and ``votes`` the maxima of ``votes`` over the ranks.

    Collective, through mpinb's collective layer: the arrival message (which also checks that
    every rank packed the same buffers, and carries the votes) splits the time into waiting for the
    slowest rank (load imbalance or noise) and moving the data, and runs under mpinb's collective
    deadline when one is set, so a rank that does not come is named in a
    :class:`~mpinb.CollectiveTimeout` instead of a hang.
    """
    return _collective.reduce_in_place(bufs, "sum", comm=comm, name=name, votes=votes)


def bcast_arrays(values: Sequence[np.ndarray], *, root: int, comm: Any) -> list[np.ndarray]:
    """Root's ``values`` on every rank, with one buffer broadcast per dtype.

    Collective. The layouts must already be known to be identical on every rank (the caller checks
    the shapes and dtypes first): the other ranks receive into empty buffers of root's layout.
    """
    plan = Layout([v.shape for v in values], [v.dtype for v in values])
    is_root = comm.Get_rank() == root
    buffers = (plan.pack(values) if is_root
               else [np.empty(n, dtype) for n, dtype in zip(plan.lengths, plan.dtypes, strict=True)])
    return plan.views([bcast(buf, root=root, comm=comm) for buf in buffers])


def scale_in_place(buf: np.ndarray, scale: float) -> bool:
    """Multiply a flat buffer by ``scale`` in place (``0`` writes zeros, whatever it held); returns
    whether every value is finite, checked in the same pass (always true at ``0``)."""
    if scale == 0:
        buf.fill(0)
        return True
    return _scale_into(buf, buf.dtype.type(scale), buf)


def _scale_into(src: np.ndarray, scale: Any, dst: np.ndarray) -> bool:
    """``dst[:] = src * scale``; returns whether every value is finite."""
    kernel = _scale_kernel()
    if kernel is not None:
        return bool(kernel(src, scale, dst))
    np.multiply(src, scale, out=dst)
    # min and max propagate NaN, and an infinity is one of them; no temporary, no overflow.
    return dst.size == 0 or bool(np.isfinite(dst.min()) and np.isfinite(dst.max()))


@functools.cache
def _scale_kernel() -> Any:
    numba = _numba.load()
    if numba is None:
        return None

    # "reassoc" lets the accumulation vectorise; without "nnan"/"ninf", v - v is not folded to 0.
    @numba.njit(cache=True, nogil=True, boundscheck=False, fastmath={"reassoc", "contract"})
    def scale_into(src, scale, dst):  # pragma: no cover - compiled
        acc = scale - scale
        for i in range(src.size):
            v = src[i] * scale
            dst[i] = v
            acc += v - v
        return acc == 0

    return scale_into


def divide_by_rows(out: list[np.ndarray], bufs: list[np.ndarray]) -> float:
    """A row-weighted sum's last result is its rows slot (each rank scaled its arrays by its rows
    and put them in one extra slot of the same message): take it off ``out`` and divide the summed
    ``bufs`` by it in place. Returns the total rows; at 0 (no rank had rows) nothing is divided."""
    total = float(out.pop()[0])
    if total > 0:
        for buf in bufs:
            np.multiply(buf, buf.dtype.type(1.0 / total), out=buf)
    return total
