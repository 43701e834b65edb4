"""The fused reduction: many arrays of any shapes and dtypes reduced with one message per dtype.

``mpinb.allreduce`` and the estimators' sums go through here, so wire dtypes, reused wire buffers
and the mean are written once. Small arrays of one dtype share a packed buffer; large ones, and a
small one alone of its dtype, travel on their own, straight from the input into the result, with no
packing copy. The gradient exchange and the weight averages do not: they fill their own aligned
buffers (:class:`mpinb._training.packing.Packer`, scaling and checking finiteness in the same pass,
buffers TensorFlow wraps without a copy) and reduce them in place. Both lay arrays out with
:class:`mpinb._layout.Layout` and reuse buffers through :class:`mpinb._layout.BufferPool`.
"""

from __future__ import annotations

import operator
from collections import Counter, deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from mpinb._layout import BufferPool, Layout

__all__ = ["OPS", "Fused", "plan"]

OPS = ("sum", "mean", "min", "max")
_ALONE = 1 << 16  # arrays this large (bytes) are reduced on their own, without a packing copy


class Fused:
    """How one layout of arrays (shapes, dtypes, op) is reduced; made once per layout and reused.
    Local: :meth:`run` sends its messages inside the caller's operation.

    Its ``repr`` is the layout, identical on every rank, so the arrival message checks it; the
    object itself keys the digest cache, so a repeated layout costs a dictionary lookup.
    """

    def __init__(self, shapes: tuple, dtypes: tuple, op: str) -> None:
        for i, dtype in enumerate(dtypes):
            if dtype.kind not in "biufc":
                raise TypeError(f"allreduce reduces numbers and booleans; item {i} has dtype {dtype}.")
            if dtype.kind == "c" and op in ("min", "max"):
                raise TypeError(f"op={op!r} is undefined for complex numbers (item {i}).")
        self.text = repr((op, tuple((shape, dtype.str) for shape, dtype in zip(shapes, dtypes, strict=True))))
        self.op, self.wire_op, self.n = op, "sum" if op == "mean" else op, len(shapes)
        wires: tuple[Any, ...]
        self.results: tuple[Any, ...]
        wires, self.results = zip(*[_wire(dtype, op) for dtype in dtypes], strict=True) if dtypes else ((), ())
        sizes = [int(np.prod(shape, dtype=np.int64)) for shape in shapes]
        # Large arrays travel on their own, straight from the input into the result: no packing.
        # So does the only small array of its wire dtype: its message is the same either way, and
        # without the packing and unpacking copies (in place when ``out`` is the input itself).
        large = [sizes[i] * dtypes[i].itemsize >= _ALONE for i in range(self.n)]
        sharing = Counter(wires[i] for i in range(self.n) if not large[i])
        # "same": the input is its wire and its result (no cast, no integer mean): it travels as it is.
        same = [dtypes[i] == wires[i] == self.results[i] for i in range(self.n)]
        self.alone = [(i, wires[i], shapes[i], same[i], large[i]) for i in range(self.n)
                      if large[i] or sharing[wires[i]] == 1]
        self.small = [i for i in range(self.n) if not large[i] and sharing[wires[i]] > 1]
        self.packing = Layout([shapes[i] for i in self.small], [wires[i] for i in self.small])
        # A buffer is "plain" when its slices are the results as they are: no cast, no integer mean.
        self.plain = [all(self.results[self.small[j]] == wire for j in self.packing.members(b))
                      and (op != "mean" or wire.kind in "fc") for b, wire in enumerate(self.packing.dtypes)]
        self.shapes = shapes
        self.keeps_dtypes = all(result == dtype for result, dtype in zip(self.results, dtypes, strict=True))
        # Per packed buffer, its arrays in order: one concatenate fills it (a copy per array cost
        # microseconds of Python each, the larger part of a fused call of fifty small arrays).
        self.members = [[self.small[j] for j in self.packing.members(b)] for b in range(len(self.packing.dtypes))]
        # A plain buffer's mean is divided in place, whole; its results are then views of it as it is.
        self.divide = [b for b, plain in enumerate(self.plain) if plain and op == "mean"]
        # Each small array's result: (index, buffer, start, stop, shape, a view of the wire as it is).
        self.unpack = [(i, b, start, stop, shapes[i], self.plain[b])
                       for (b, start, stop), i in zip(self.packing.slots, self.small, strict=True)]
        self.views_only = all(as_is and shape for *_, shape, as_is in self.unpack)
        # The wire: the packed buffers, then one buffer per array that travels alone. The views
        # handed out as results are made once per set of buffers.
        self.pool = BufferPool([*self.packing.lengths, *[sizes[i] for i, *_ in self.alone]],
                               [*self.packing.dtypes, *[wire for _, wire, _, _, _ in self.alone]],
                               views=self._result_views)

    def __repr__(self) -> str:
        return self.text

    def _result_views(self, wire: list[np.ndarray]) -> list[np.ndarray | None]:
        """Per small array, its result as a view of the packed wire (``None``: a scalar, or a result
        that needs a cast or an integer mean)."""
        return [wire[b][start:stop].reshape(shape) if as_is and shape else None
                for _, b, start, stop, shape, as_is in self.unpack]

    def check_out(self, out: Sequence[np.ndarray], values: Sequence[np.ndarray] = ()) -> list[np.ndarray]:
        """``out`` as a list, or an error saying which array does not fit. Local.

        ``out`` made of the inputs ``values`` themselves (in place) fits when no result changes
        dtype and every input is writeable: a few checks instead of one per array and attribute."""
        out = list(out)
        if len(out) != self.n:
            raise ValueError(f"out must hold one array per input ({self.n}); got {len(out)}.")
        if self.keeps_dtypes and len(values) == self.n and all(map(operator.is_, out, values)):
            if all(o.flags.writeable for o in out):
                return out
        for i, (o, shape, result) in enumerate(zip(out, self.shapes, self.results, strict=True)):
            if not isinstance(o, np.ndarray) or o.shape != shape or o.dtype != result or not o.flags.writeable:
                got = f"{type(o).__name__}" if not isinstance(o, np.ndarray) else f"shape {o.shape}, dtype {o.dtype}"
                raise ValueError(f"out[{i}] must be a writeable array of shape {shape} and dtype {result}; got {got}.")
        return out

    def run(self, values: Sequence[np.ndarray], call: Any, out: list[np.ndarray] | None) -> list[Any]:
        wire, views = self.pool.take_with_views()
        packed = wire[: len(self.members)]
        for buf, members in zip(packed, self.members, strict=True):
            np.concatenate([values[i] for i in members], axis=None, out=buf, casting="unsafe")
        reduce_in_place: list[np.ndarray] = list(packed)
        pairs: list[tuple[np.ndarray, np.ndarray]] = []
        alone: list[tuple[int, np.ndarray]] = []
        for (i, _, shape, same, large), buf in zip(self.alone, wire[len(packed):], strict=False):
            target = out[i] if out is not None and same and out[i].flags.c_contiguous else None
            recv = buf.reshape(shape) if target is None else target
            if not same:
                np.copyto(recv, values[i], casting="unsafe")
                reduce_in_place.append(recv.reshape(-1))
            elif recv is values[i]:
                reduce_in_place.append(recv.reshape(-1))
            elif np.shares_memory(recv, values[i]):
                if large:
                    raise ValueError("an out array overlaps its input without being it; pass the input itself.")
                # A small one goes through its wire buffer, as if packed: the overlap does no harm.
                recv = buf.reshape(shape)
                pairs.append((np.ascontiguousarray(values[i]).reshape(-1), recv.reshape(-1)))
            else:
                pairs.append((np.ascontiguousarray(values[i]).reshape(-1), recv.reshape(-1)))
            alone.append((i, recv))
        call.allreduce(reduce_in_place, self.wire_op, pairs=pairs)
        size = call.size
        results: list[Any] = [None] * self.n
        for b in self.divide:
            packed[b] /= size
        if self.views_only:  # the usual case, fifty small arrays: no per-array Python but a store
            if out is None:
                for i, view in zip(self.small, views, strict=False):
                    results[i] = view
            else:
                # One C-level loop of copies into ``out`` (the wire buffer is the pool's, never
                # memory of ``out``; the same dtype): a Python loop cost as much as the message.
                deque(map(np.copyto, [out[i] for i in self.small], views), maxlen=0)  # type: ignore[arg-type]
                for i in self.small:
                    results[i] = out[i]
            views = []
        # A plain buffer's results are views of it: no unpacking copy (the pool keeps the buffer
        # until they are dropped).
        for (i, b, start, stop, _shape, as_is), view in zip(self.unpack, views, strict=False):
            if view is not None:
                if out is None:
                    results[i] = view
                else:
                    np.copyto(out[i], view)
                    results[i] = out[i]
            elif not as_is:
                results[i] = self._finish(packed[b][start:stop], i, size)
            else:  # a scalar
                results[i] = packed[b][start]
                if out is not None:
                    out[i][...] = results[i]
                    results[i] = out[i]
        plain_sum = self.op != "mean"
        for i, recv in alone:
            # Reduced where it lies, in ``out`` (in place, say): nothing to finish.
            results[i] = recv if plain_sum and out is not None and recv is out[i] else self._finish(recv, i, size)
        if out is not None:
            for i, value in enumerate(results):
                if value is not out[i]:
                    if not np.may_share_memory(value, out[i]):
                        np.copyto(out[i], value, casting="unsafe")
                    results[i] = out[i]
        return results

    def _finish(self, flat: np.ndarray, i: int, size: int) -> Any:
        """Reduced wire values as the result: divided for a mean, cast, shaped (0-d: a scalar)."""
        result = self.results[i]
        if self.op == "mean":
            if flat.dtype == result and flat.dtype.kind in "fc":
                flat /= size
            else:
                flat = flat / size
        shape = self.shapes[i]
        value = (flat if flat.dtype == result else flat.astype(result)).reshape(shape)
        return value[()] if not shape else value


_plans: dict[tuple, Fused] = {}


def plan(values: Sequence[np.ndarray], op: str, plans: dict[tuple, Fused] = _plans) -> Fused:
    """The plan for ``values`` and ``op``, made once and kept in ``plans`` (a process's: its
    runtime's, :attr:`~mpinb._collective.runtime.Runtime.plans`)."""
    key = (op, tuple([v.shape for v in values]), tuple([v.dtype for v in values]))
    plan = plans.get(key)
    if plan is None:
        if len(plans) > 256:
            plans.clear()
        plan = plans[key] = Fused(key[1], key[2], op)
    return plan


def _wire(dtype: np.dtype, op: str) -> tuple[np.dtype, np.dtype]:
    """(dtype reduced on the wire, dtype returned) for one input dtype and op."""
    if dtype.kind == "b":
        return (np.dtype(np.int64), np.dtype(np.int64)) if op in ("sum", "mean") else (np.dtype(np.uint8), dtype)
    if dtype == np.float16:
        # MPI has no half type; reducing in float32 is also more accurate.
        return np.dtype(np.float32), dtype
    if op == "mean" and dtype.kind in "iu":
        return np.dtype(np.int64) if dtype.kind == "i" else np.dtype(np.uint64), np.dtype(np.float64)
    return dtype.newbyteorder("="), dtype.newbyteorder("=")
