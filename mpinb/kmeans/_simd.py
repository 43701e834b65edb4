"""The nearest centre of every row, in explicit SIMD vectors: the compiled executor's assignment. Local.

At the sizes k-means meets (tens to hundreds of clusters and features), BLAS's GEMM of a chunk of
rows by the centres, then a scalar argmin over its output, spends more time packing the skinny
operands and walking the distance block than multiplying: measured on one core (AVX-512 Xeon,
100,000 rows), this kernel takes 0.32-0.86x the time of OpenBLAS's GEMM and the compiled argmin at
k x d from 8 x 2 to 256 x 256 in float64, 0.14-0.91x in float32, with the same labels.

How: rows go in blocks of eight and centres in vectors of 64 bytes (8 float64 or 16 float32 lanes;
the centres' matrix is padded with columns whose offset is +inf, never chosen). For one vector of
centres, the eight rows' accumulators stay in registers through the ``d`` steps of
``acc += x[t] * (-2 c[t])`` (one broadcast and one fused multiply-add per row and step); the offset
``q = |c'|^2 + 2 mean.c'`` is added after the products, as the GEMM path adds it, and each lane
keeps its least value and its centre's index (strict ``<``: the earlier centre keeps an exact tie).
The eight rows' lanes are then merged in a tree of shuffles shared by the rows, down to the lowest
index among those holding the least value: the same rule, lowest index on exact ties, as the GEMM
path and scikit-learn. (On one core at 400,000 x 16, k = 16: 8.3 ns a row in float32, 10.5 in
float64, of which the products take about a quarter and two thirds.)

Each row's distances are computed in its own lanes, in the same order, whatever rows share its
block: a row's label does not depend on the chunking or on the number of ranks, bit for bit.

numba has no vector type, so this module gives it one (:class:`Vector`, an LLVM ``<lanes x T>``
held in registers) and the handful of intrinsics the kernel needs. It imports numba, so only the
compiled executor imports it (:func:`mpinb.kmeans._kernels._compile`).
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

__all__ = ["ROWS", "lanes", "nearest", "padded_width", "prefetch"]

# Rows per block: eight accumulators of one vector each, plus the centres' vector and a broadcast,
# fit the 16 vector registers of AVX2 as well as AVX-512's 32. (Two vectors of centres per pass,
# 16 accumulators, measured no faster: the multiply-adds, not the loads, bound the kernel.)
ROWS = 8
# Rows ahead of the block computing that nearest() asks the memory for.
_AHEAD = 32
# Bytes per vector: one AVX-512 register. Where the target has narrower registers (AVX2, NEON),
# LLVM splits each operation into two or four, which changes the speed, not the result.
_VECTOR_BYTES = 64


def lanes(dtype: Any) -> int:
    """Lanes of one vector of ``dtype`` (8 float64 or 16 float32)."""
    return _VECTOR_BYTES // np.dtype(dtype).itemsize


def padded_width(k: int, dtype: Any) -> int:
    """Columns of the centres' matrix for ``k`` clusters: ``k`` rounded up to whole vectors."""
    width = lanes(dtype)
    return -(-k // width) * width


class Vector(types.Type):
    """``lanes`` values of ``dtype`` in one SIMD register (float64, float32 or int32)."""

    def __init__(self, dtype: types.Type, lanes: int) -> None:
        self.dtype, self.lanes = dtype, lanes
        super().__init__(name=f"Vector({dtype} x {lanes})")


@register_model(Vector)
class _VectorModel(models.PrimitiveModel):
    def __init__(self, dmm: Any, fe_type: Vector) -> None:
        element = {types.float64: ir.DoubleType(), types.float32: ir.FloatType(), types.int32: ir.IntType(32)}
        super().__init__(dmm, fe_type, ir.VectorType(element[fe_type.dtype], fe_type.lanes))


def _vector_of(dtype: Any) -> Vector:
    """The vector type of ``dtype`` (a numba scalar type): 64 bytes of it."""
    return Vector(dtype, _VECTOR_BYTES // (dtype.bitwidth // 8))


def _lane_indices(count: int, shift: int) -> ir.Constant:
    return ir.Constant(ir.VectorType(ir.IntType(32), count), [(lane + shift) % count for lane in range(count)])


def _splat(builder: Any, value: Any, vector_type: ir.VectorType) -> Any:
    one = builder.insert_element(ir.Constant(vector_type, ir.Undefined), value, ir.Constant(ir.IntType(32), 0))
    lane_zero = ir.Constant(ir.VectorType(ir.IntType(32), vector_type.count), [0] * vector_type.count)
    return builder.shuffle_vector(one, ir.Constant(vector_type, ir.Undefined), lane_zero)


def _pointer(context: Any, builder: Any, aryty: Any, array: Any, indices: list[Any]) -> Any:
    """The address of ``array[indices]`` (an array of numba type ``aryty``), in generated code."""
    ary = context.make_array(aryty)(context, builder, array)
    return cgutils.get_item_pointer(context, builder, aryty, ary, indices)


@intrinsic
def _load(typingctx: Any, array: Any, i: Any, j: Any) -> Any:
    """``array[i, j : j + lanes]`` (C-contiguous rows) as a vector; no alignment assumed."""
    vector = _vector_of(array.dtype)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        ptr = _pointer(context, builder, signature.args[0], args[0], [args[1], args[2]])
        return builder.load(builder.bitcast(ptr, context.get_value_type(vector).as_pointer()), align=1)

    return vector(array, i, j), codegen


@intrinsic
def _load_1d(typingctx: Any, array: Any, j: Any) -> Any:
    """``array[j : j + lanes]`` as a vector; no alignment assumed."""
    vector = _vector_of(array.dtype)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        ptr = _pointer(context, builder, signature.args[0], args[0], [args[1]])
        return builder.load(builder.bitcast(ptr, context.get_value_type(vector).as_pointer()), align=1)

    return vector(array, j), codegen


@intrinsic
def _broadcast(typingctx: Any, value: Any) -> Any:
    """``value`` in every lane."""
    vector = _vector_of(value)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return _splat(builder, args[0], context.get_value_type(vector))

    return vector(value), codegen


@intrinsic
def _infinities(typingctx: Any, like: Any) -> Any:
    """+inf in every lane of a vector of ``like``'s type."""
    vector = _vector_of(like)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return ir.Constant(context.get_value_type(vector), [float("inf")] * vector.lanes)

    return vector(like), codegen


@intrinsic
def _indices(typingctx: Any, first: Any, like: Any) -> Any:
    """int32 ``first + lane`` in each lane, as many lanes as a vector of ``like``'s type."""
    count = _vector_of(like).lanes
    vector = Vector(types.int32, count)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        i32 = ir.IntType(32)
        start = builder.trunc(args[0], i32) if args[0].type.width > 32 else args[0]
        spread = _splat(builder, start, ir.VectorType(i32, count))
        return builder.add(spread, ir.Constant(ir.VectorType(i32, count), list(range(count))))

    return vector(first, like), codegen


@intrinsic
def _lanes(typingctx: Any, like: Any) -> Any:
    """Lanes of a vector of ``like``'s type, a compile-time constant."""
    count = _vector_of(like).lanes

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return ir.Constant(ir.IntType(64), count)

    return types.int64(like), codegen


@intrinsic
def _multiply_add(typingctx: Any, acc: Any, x: Any, c: Any) -> Any:
    """``acc + x * c``, which LLVM may fuse into one FMA where the target has one (``contract``)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        product = builder.fmul(args[1], args[2], flags=("contract",))
        return builder.fadd(args[0], product, flags=("contract",))

    return acc(acc, x, c), codegen


@intrinsic
def _keep_least(typingctx: Any, best: Any, index: Any, acc: Any, offset: Any, candidate: Any) -> Any:
    """``v = acc + offset``, then lane by lane ``(best, index) = (v, candidate)`` where
    ``v < best``: strict, so an earlier centre keeps an exact tie."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        b, i, a, o, c = args
        v = builder.fadd(a, o)
        lower = builder.fcmp_ordered("<", v, b)
        pair = [builder.select(lower, v, b), builder.select(lower, c, i)]
        return context.make_tuple(builder, signature.return_type, pair)

    return types.Tuple((best, index))(best, index, acc, offset, candidate), codegen


@intrinsic
def _store_first_least(typingctx: Any, out: Any, o: Any, b0: Any, g0: Any, b1: Any, g1: Any, b2: Any, g2: Any,
                       b3: Any, g3: Any, b4: Any, g4: Any, b5: Any, g5: Any, b6: Any, g6: Any, b7: Any,
                       g7: Any) -> Any:
    """For each of eight rows, the lowest index ``g`` among the lanes whose ``b`` is the least
    (the first minimum), stored to ``out[o : o + 8]``.

    The eight rows' lanes are merged pairwise in a tree: each step pairs lane ``l`` of a row with
    lane ``l + s/2`` (``s`` the lanes a row still holds) and packs two vectors of rows into one,
    keeping the lesser value and, on an exact tie, the lower index; after log2(lanes) steps each
    row holds one lane. The shuffles serve eight rows at once: folding each row's vector alone cost
    about half of the kernel's time on 16 float32 lanes.
    """
    count = b0.lanes

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        i32 = ir.IntType(32)
        rows = [(args[2 + 2 * r], args[3 + 2 * r]) for r in range(ROWS)]

        def take(pv: Any, pg: Any, qv: Any, qg: Any) -> tuple[Any, Any]:
            lower = builder.fcmp_ordered("<", qv, pv)
            tie = builder.and_(builder.fcmp_ordered("==", qv, pv), builder.icmp_signed("<", qg, pg))
            choose = builder.or_(lower, tie)
            return builder.select(choose, qv, pv), builder.select(choose, qg, pg)

        def shuffle(x: Any, y: Any, lanes: list[int]) -> Any:
            return builder.shuffle_vector(x, y, ir.Constant(ir.VectorType(i32, len(lanes)), lanes))

        per_row = count  # lanes each row holds
        while len(rows) > 1:
            half = per_row // 2
            merged = []
            for (xv, xg), (yv, yg) in zip(rows[0::2], rows[1::2], strict=True):
                # In the concatenation (x, y), row r of the pair starts at lane r * per_row.
                held = 2 * count // per_row  # rows in the merged vector
                first = [r * per_row + p for r in range(held) for p in range(half)]
                second = [lane + half for lane in first]
                merged.append(take(shuffle(xv, yv, first), shuffle(xg, yg, first),
                                   shuffle(xv, yv, second), shuffle(xg, yg, second)))
            rows, per_row = merged, half
        (v, g), = rows
        while per_row > 1:  # one vector holds all eight rows, each still in per_row lanes
            half = per_row // 2
            first = [r * per_row + p for r in range(count // per_row) for p in range(half)]
            second = [lane + half for lane in first]
            v, g = take(shuffle(v, v, first), shuffle(g, g, first), shuffle(v, v, second), shuffle(g, g, second))
            per_row = half
        ptr = _pointer(context, builder, signature.args[0], args[0], [args[1]])
        builder.store(g, builder.bitcast(ptr, g.type.as_pointer()), align=1)
        return context.get_dummy_value()

    return types.void(out, o, b0, g0, b1, g1, b2, g2, b3, g3, b4, g4, b5, g5, b6, g6, b7, g7), codegen


@intrinsic
def prefetch(typingctx: Any, array: Any, i: Any, t: Any) -> Any:
    """``prefetch(array, i, t)`` for compiled code: a hint to bring the cache line of ``array[i, t]``
    in (LLVM's ``llvm.prefetch``: read, keep in all levels); it never faults or waits."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        ptr = _pointer(context, builder, signature.args[0], args[0], [args[1], args[2]])
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        # LLVM re-mangles the name for its pointer type (typed or opaque), so one name serves.
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]), "llvm.prefetch.p0"
        )
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return types.void(array, i, t), codegen


_jit = numba.njit(cache=True, nogil=True, boundscheck=False)


@numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _block(X, i, C, q, out, o):
    """Nearest centre (``C``, ``q``: see :func:`nearest`) of rows ``X[i : i + 8]``, written to
    ``out[o : o + 8]``."""
    d = X.shape[1]
    width = _lanes(q[0])
    zero = _broadcast(q[0] - q[0])
    b0 = b1 = b2 = b3 = b4 = b5 = b6 = b7 = _infinities(q[0])
    g0 = g1 = g2 = g3 = g4 = g5 = g6 = g7 = _indices(0, q[0])
    for j in range(0, C.shape[1], width):
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = zero
        for t in range(d):
            c = _load(C, t, j)
            a0 = _multiply_add(a0, _broadcast(X[i, t]), c)
            a1 = _multiply_add(a1, _broadcast(X[i + 1, t]), c)
            a2 = _multiply_add(a2, _broadcast(X[i + 2, t]), c)
            a3 = _multiply_add(a3, _broadcast(X[i + 3, t]), c)
            a4 = _multiply_add(a4, _broadcast(X[i + 4, t]), c)
            a5 = _multiply_add(a5, _broadcast(X[i + 5, t]), c)
            a6 = _multiply_add(a6, _broadcast(X[i + 6, t]), c)
            a7 = _multiply_add(a7, _broadcast(X[i + 7, t]), c)
        offset = _load_1d(q, j)
        candidate = _indices(j, q[0])
        b0, g0 = _keep_least(b0, g0, a0, offset, candidate)
        b1, g1 = _keep_least(b1, g1, a1, offset, candidate)
        b2, g2 = _keep_least(b2, g2, a2, offset, candidate)
        b3, g3 = _keep_least(b3, g3, a3, offset, candidate)
        b4, g4 = _keep_least(b4, g4, a4, offset, candidate)
        b5, g5 = _keep_least(b5, g5, a5, offset, candidate)
        b6, g6 = _keep_least(b6, g6, a6, offset, candidate)
        b7, g7 = _keep_least(b7, g7, a7, offset, candidate)
    _store_first_least(out, o, b0, g0, b1, g1, b2, g2, b3, g3, b4, g4, b5, g5, b6, g6, b7, g7)


@_jit
def nearest(X, C, q, out):
    """Nearest centre of each row of ``X`` (any layout), written to ``out`` (int32).

    ``C`` (d, :func:`padded_width`) holds ``-2 c'`` by column and ``q`` the offsets
    ``|c'|^2 + 2 mean.c'``, +inf in the padding, both C-contiguous in the dtype of ``X``: the
    row's values ``-2 x.c' + q`` are compared, as in the GEMM path.
    """
    n, d = X.shape
    full = n - n % ROWS
    line = max(1, 64 // X.itemsize)  # values per 64-byte cache line
    for i in range(0, full, ROWS):
        # The rows AHEAD on are requested while these compute: the hardware's own prefetch fell
        # behind on float64 rows (about 10% of the kernel's time at 400,000 x 16).
        if i + _AHEAD + ROWS <= n:
            for r in range(i + _AHEAD, i + _AHEAD + ROWS):
                for t in range(0, d, line):
                    prefetch(X, r, t)
        _block(X, i, C, q, out, i)
    if full < n:  # the last rows, computed in a zero-padded block: the same lanes, the same order
        pad = np.zeros((ROWS, d), dtype=X.dtype)
        pad[: n - full] = X[full:]
        labels = np.empty(ROWS, dtype=np.int32)
        _block(pad, 0, C, q, labels, 0)
        out[full:] = labels[: n - full]
