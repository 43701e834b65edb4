"""Laying many arrays out in one flat buffer per dtype: the packing plan of every fused collective.

Local. A fused collective (``mpinb.allreduce``, the gradient exchange, a model's broadcast) sends
one message per dtype instead of one per array. :class:`Layout` decides where each array lives:
buffers in the order their dtypes first appear, so the same arrays give the same layout on every
rank, and each array at an offset of the buffer that can be aligned (TensorFlow wraps 64-byte
aligned views without copying them).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

import numpy as np

__all__ = ["BufferPool", "Layout"]


class Layout:
    """Where each of a list of arrays lives in one flat buffer per dtype.

    Parameters
    ----------
    shapes, dtypes : sequences of equal length
        Each array's shape and the dtype of the buffer it goes into.
    align : int, default 0
        Start every array on a multiple of this many bytes of its buffer; 0 packs them tightly.

    Attributes
    ----------
    dtypes, lengths : tuple
        One entry per buffer: its dtype and its length in elements.
    slots : tuple of (buffer, start, stop)
        One entry per array: the buffer it lives in and its element range there.
    shapes : tuple
        The arrays' shapes.
    """

    def __init__(self, shapes: Sequence[tuple[int, ...]], dtypes: Sequence[np.dtype], *, align: int = 0) -> None:
        buffer_dtypes: list[np.dtype] = []
        lengths: list[int] = []
        slots: list[tuple[int, int, int]] = []
        for shape, dtype in zip(shapes, dtypes, strict=True):
            dtype = np.dtype(dtype)
            if dtype not in buffer_dtypes:
                buffer_dtypes.append(dtype)
                lengths.append(0)
            b = buffer_dtypes.index(dtype)
            step = max(1, align // dtype.itemsize)
            start = -(-lengths[b] // step) * step
            stop = start + int(np.prod(shape, dtype=np.int64))
            slots.append((b, start, stop))
            lengths[b] = stop
        self.shapes = tuple(tuple(s) for s in shapes)
        self.dtypes = tuple(buffer_dtypes)
        self.lengths = tuple(lengths)
        self.slots = tuple(slots)
        self._members = [[i for i, slot in enumerate(slots) if slot[0] == b] for b in range(len(buffer_dtypes))]
        self._tight = align <= 1

    def members(self, b: int) -> list[int]:
        """The indices of the arrays living in buffer ``b``, in order."""
        return self._members[b]

    def pack(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Fresh, tightly packed buffers holding ``arrays`` (cast to each buffer's dtype)."""
        if not self._tight:
            raise ValueError("pack() makes tight buffers; this layout is aligned.")
        return [np.concatenate([arrays[i] for i in members], axis=None, dtype=dtype, casting="unsafe")
                for members, dtype in zip(self._members, self.dtypes, strict=True)]

    def views(self, buffers: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Each array as a view of ``buffers``, shaped as it was (0-d arrays stay 0-d)."""
        return [buffers[b][start:stop].reshape(shape)
                for (b, start, stop), shape in zip(self.slots, self.shapes, strict=True)]


class BufferPool:
    """Reused sets of flat buffers (one per ``(length, dtype)``), aligned, zero-initialised.

    MPI works much faster on memory it has touched before (registration, page faults: reducing into
    a fresh 16 MiB array took 3x as long as into a reused one), so a fused collective takes its wire
    buffers from here. A set is reused only once nothing outside the pool holds a view of it -- a
    result handed to the caller, an array TensorFlow wraps, the buffers of an abandoned collective
    that MPI may still write -- which the reference count of the set's memory tells (NumPy points
    every view, and every view of a view, at that memory's owner). When every kept set is in use, a
    new one is made, and kept if fewer than ``keep`` are.
    """

    def __init__(self, lengths: Sequence[int], dtypes: Sequence[np.dtype], *, align: int = 64, keep: int = 4,
                 views: Callable[[list[np.ndarray]], Sequence[np.ndarray | None]] | None = None) -> None:
        self.specs = [(int(n), np.dtype(d)) for n, d in zip(lengths, dtypes, strict=True)]
        self.align, self.keep = max(int(align), 1), keep
        self._views = views
        self._sets: list[_BufferSet] = []

    def take(self) -> list[np.ndarray]:
        """An idle set of buffers (its padding between arrays is still zero; the rest is stale)."""
        return self.take_with_views()[0]

    def take_with_views(self) -> tuple[list[np.ndarray], Sequence[np.ndarray | None]]:
        """An idle set of buffers, and the views of it that the pool's ``views`` made once for the
        set (slicing and reshaping fifty small arrays on every call cost more than their message).
        A view handed out keeps the set in use until it is dropped, like any other."""
        for bufs in self._sets:
            if bufs.idle():
                return bufs.buffers, bufs.views
        bufs = _BufferSet(self.specs, self.align, self._views)
        if len(self._sets) < self.keep:
            self._sets.append(bufs)
        return bufs.buffers, bufs.views

    @property
    def made(self) -> int:
        """How many sets the pool has made (and kept)."""
        return len(self._sets)


class _BufferSet:
    """One allocation carved into aligned buffers, and views of them made once; idle when only the
    set refers to its memory and to each of those views."""

    def __init__(self, specs: list[tuple[int, np.dtype]], align: int,
                 views: Callable[[list[np.ndarray]], Sequence[np.ndarray | None]] | None) -> None:
        starts, end = [], 0
        for n, dtype in specs:
            end = -(-end // align) * align
            starts.append(end)
            end += n * dtype.itemsize
        raw = np.zeros(end + align, np.uint8)
        offset = -raw.ctypes.data % align
        self.buffers = [raw[offset + s : offset + s + n * d.itemsize].view(d)
                        for s, (n, d) in zip(starts, specs, strict=True)]
        self.views = [] if views is None else views(self.buffers)
        # A caller may hold a made view itself (its count grows) or a view of one (the memory's does).
        self._made = [v for v in self.views if v is not None]
        self._raw = raw
        del raw  # the baselines count the set's own references only
        self._baseline = self._count()

    def _count(self) -> tuple[int, int]:
        return sys.getrefcount(self._raw), sum(map(sys.getrefcount, self._made))

    def idle(self) -> bool:
        memory, views = self._count()
        return memory <= self._baseline[0] and views <= self._baseline[1]
