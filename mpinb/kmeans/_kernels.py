"""The per-row passes of mpinb's k-means, in two executors with one interface. Local.

Lloyd's loop (:mod:`._lloyd`) is written once against six passes -- the assignment (per chunk,
each row's nearest centre, with change tracking), full and incremental per-cluster sums, the
column sums and the centring statistics, and the final inertia -- and :func:`kernels` hands it an executor for
them. :mod:`._init`'s k-means++ uses one more, its distances to the candidates and the chosen centre (written in
:mod:`._seed_pass`). :mod:`._minibatch` uses one more, the whole local work of a mini-batch (nearest centre,
sums and inertia of the drawn rows, read in place), whose squared distances are sums of squared differences: no
GEMM cancellation, so the executors' labels can differ only where two centres are equally near within the
round-off of adding ``d`` squares in another order.

- **compiled** (numba, ``cache=True`` so later processes load the machine code from disk):
  each pass reads its rows once, fused, while the chunk is in cache, and the assignment runs in
  explicit SIMD vectors (:mod:`._simd`). It is what makes an iteration faster than
  scikit-learn's on large data.
- **NumPy**: the same passes as whole-array operations in bounded chunks. It needs no compiler
  and no numba import, so a small fit in a fresh process costs milliseconds instead of the
  ~0.3 s that numba's first use costs even with a warm disk cache.

Which one runs is decided from the size of the work (rows x clusters), so every rank of a fit
takes the same one. The NumPy executor takes the assignment's products from BLAS's GEMM; the
compiled one computes them in explicit SIMD vectors (:mod:`._simd`: 0.3-0.9x the time of GEMM
and argmin at every k x d up to 256 x 256 measured) and keeps the GEMM (SciPy's BLAS, which numba
calls) beyond ``SIMD_MAX_WORK``. Both compare ``-2 x.c' + q`` with the same rule, lowest index on
exact ties, so their labels can differ only where two centres are equally near within the
products' round-off; sums differ only in summation order. ``MPINB_NUMBA`` overrides the choice:
``0`` (off) always NumPy, ``1`` (on) always compiled; unset or ``auto`` decides by size.
"""

from __future__ import annotations

import functools
import warnings
from types import SimpleNamespace
from typing import Any

import numpy as np

from mpinb import _numba
from mpinb._chunks import chunk_rows, chunks
from mpinb.kmeans import _seed_pass

__all__ = [
    "COMPILE_FROM", "FOLD_INERTIA", "FOLD_MOVES", "FOLD_NONE", "FOLD_SUMS", "SIMD_MAX_WORK", "chunk_rows", "chunks",
    "kernels",
]

# Rows x clusters from which the compiled passes are used: at 2**20 (about 65k rows at k=16)
# an iteration of the NumPy passes costs about 5 ms, so a fit of a few dozen iterations pays
# back loading the compiled code (measured 0.25-0.4 s in a fresh process with a warm cache).
COMPILE_FROM = 1 << 20
# Clusters x features up to which the compiled executor's assignment runs in SIMD vectors instead
# of a GEMM: the largest measured (256 x 256) was still 0.69-0.91x the GEMM path's time, but beyond
# it the centres' matrix outgrows the L2 cache that each block of eight rows reads it from.
SIMD_MAX_WORK = 1 << 16
# Rows per block of the compiled mini-batch pass: its buffers, (d + k) x this many float64,
# stay in L1 for the usual widths.
_BATCH_BLOCK = 64
# What compiled passes call, set by _compile: module globals, not closure variables, because
# numba hashes a pass's closure into its disk-cache key and a dispatcher or intrinsic never
# pickles the same twice, so a closure would recompile (1-2 s) in every process.
_prefetch: Any = None
_argmin_compiled: Any = None
_record_compiled: Any = None
_log_compiled: Any = None
_nearest_compiled: Any = None
_moves_compiled: Any = None
_sums_compiled: Any = None
_inertia_compiled: Any = None
# What the assignment step folds into its pass over each chunk: nothing, the full cluster sums
# (the first iteration, where every label changes), the inertia and counts (the final labels) or
# the moves of the chunk's changed rows between clusters' sums (the other iterations: the rows are
# in cache then; a separate pass over the changed rows afterwards read each from memory again).
FOLD_NONE, FOLD_SUMS, FOLD_INERTIA, FOLD_MOVES = 0, 1, 2, 3


def kernels(work: int) -> SimpleNamespace:
    """The executor for a pass over ``work`` = rows x clusters (decide on global values in a
    collective fit, so every rank takes the same one)."""
    mode = _numba.mode()
    if mode == "off" or (mode == "auto" and work < COMPILE_FROM):
        return NUMPY
    compiled = _compiled()
    if compiled is None or _broken:
        if mode == "on" and not _broken:
            _numba.unavailable_on_demand()  # asked for by name: say why it cannot be had
        return NUMPY
    return compiled


# ----------------------------------------------------------------------------------------------
# NumPy executor


def _argmin_rows(dist, q, labels, start, track_rows, track_old, recorded):
    v = dist + q  # in the block's precision (q has it), as the compiled pass adds
    new = v.argmin(axis=1).astype(labels.dtype, copy=False)  # first minimum: lowest index on ties
    differ = np.flatnonzero(new != labels)
    changed = int(differ.size)
    if changed and recorded >= 0:
        if recorded + changed <= track_rows.size:
            np.add(differ, start, out=track_rows[recorded : recorded + changed], casting="unsafe")
            track_old[recorded : recorded + changed] = labels[differ]
            recorded += changed
        else:
            recorded = -1
    labels[:] = new
    return changed, recorded


def _assign_rows(X, c2t, q, labels, track_rows, track_old, recorded, block, fold, w, weighted, centers, sums,
                 weights, members, simd):
    # simd is never true here: this executor's simd_width is 0 (the products come from GEMM).
    n, k = X.shape[0], c2t.shape[1]
    buf = np.empty((min(block, max(n, 1)), k), dtype=c2t.dtype)
    changed = 0
    for s, e in chunks(n, block):
        out = buf[: e - s]
        np.dot(X[s:e], c2t, out=out)
        before = recorded
        found, recorded = _argmin_rows(out, q, labels[s:e], s, track_rows, track_old, recorded)
        changed += found
        if fold == FOLD_MOVES and recorded > before:
            _sums_delta(X, w, weighted, track_rows[before:recorded], track_old[before:recorded], labels, sums,
                        weights, members)
    inertia = 0.0
    if fold == FOLD_SUMS:
        _sums_full(X, w, weighted, labels, sums, weights, members)
    elif fold == FOLD_INERTIA:
        inertia = _inertia_counts(X, w, weighted, centers, labels, members)
    return changed, recorded, inertia


def _add_rows(X, w, labels, sign, sums, weights, members):
    """Add ``sign`` times each row (times its weight) to its cluster; ``w`` is None for ones."""
    k = sums.shape[0]
    for s, e in chunks(X.shape[0], chunk_rows(X.shape[1], minimum=1024)):
        lab = labels[s:e]
        rows = X[s:e].astype(np.float64, copy=False)
        ws = None if w is None else w[s:e]
        weighted = rows if ws is None else rows * ws[:, None]
        # One bincount per column: 3-5 times faster than np.add.at(sums, lab, rows) at the k x d
        # measured (4-32 x 5-16); a chunk's rows are added in order, then its total to the sums.
        for j in range(sums.shape[1]):
            sums[:, j] += sign * np.bincount(lab, weights=weighted[:, j], minlength=k)
        weights += sign * np.bincount(lab, weights=ws, minlength=k)
        members += sign * np.bincount(lab if ws is None else lab[ws > 0], minlength=k)


def _sums_full(X, w, weighted, labels, sums, weights, members):
    _add_rows(X, w if weighted else None, labels, 1.0, sums, weights, members)


def _sums_delta(X, w, weighted, rows, old, labels, sums, weights, members):
    ws = w[rows] if weighted else None
    moved = X[rows]
    _add_rows(moved, ws, labels[rows], 1.0, sums, weights, members)
    _add_rows(moved, ws, old, -1.0, sums, weights, members)


def _column_sums(X, out):
    for s, e in chunks(X.shape[0], chunk_rows(X.shape[1])):
        out += X[s:e].sum(axis=0, dtype=np.float64)


def _centred_stats(X, mean, w, weighted, stats):
    d = X.shape[1]
    biggest = 0.0
    for s, e in chunks(X.shape[0], chunk_rows(d)):
        xc = np.subtract(X[s:e], mean, dtype=np.float64)
        sq = np.einsum("ij,ij->i", xc, xc)
        stats[:d] += np.einsum("ij,ij->j", xc, xc)
        stats[d] += sq @ w[s:e] if weighted else sq.sum()
        biggest = max(biggest, float(sq.max(initial=0.0)))
    return biggest


def _inertia_counts(X, w, weighted, centers, labels, counts):
    k = centers.shape[0]
    total = 0.0
    for s, e in chunks(X.shape[0], chunk_rows(X.shape[1])):
        lab = labels[s:e]
        diff = np.subtract(X[s:e], centers[lab], dtype=np.float64)
        sq = np.einsum("ij,ij->i", diff, diff)
        total += float(sq @ w[s:e] if weighted else sq.sum())
        counts += np.bincount(lab, minlength=k)
    return total


def _batch_sums(X, rows, w, weighted, centers, sums, wsum):
    k, d = centers.shape
    # Candidates from one GEMM (centred on the centres' mean), then the exact rule: where another
    # centre's GEMM distance is within the GEMM's error bound of the row's least (plus the
    # round-off of the exact sums and of the centring), the row's distances are recomputed from
    # differences, added in order as the compiled pass adds them (at ties, then, both executors
    # choose the same centre). The window, (d + 5) 2**-48 (|x'|^2 + max |c'|^2) on centred
    # coordinates, is at least 4 times a worst-case bound on the difference of two entries, about
    # (8 d + 24) 2**-53 times the same; a wider one only recomputes more rows.
    mean = centers.mean(axis=0)
    cc = centers - mean
    c2t = -2.0 * cc.T
    c_sq = np.einsum("ij,ij->i", cc, cc)
    slack = (d + 5) * 2.0**-48
    total = 0.0
    for s, e in chunks(rows.size, chunk_rows(k)):
        idx = rows[s:e]
        m = e - s
        x = X[idx].astype(np.float64, copy=False)
        xc = x - mean
        dist = xc @ c2t
        dist += c_sq
        labels = dist.argmin(axis=1)  # first minimum: lowest index on ties
        window = np.einsum("ij,ij->i", xc, xc)
        window += c_sq.max()
        window *= slack
        window += dist[np.arange(m), labels]
        close = np.flatnonzero(np.count_nonzero(dist <= window[:, None], axis=1) > 1)
        if close.size:
            labels[close] = _exact_argmin(x[close], centers)
        diff = x - centers[labels]
        best = np.einsum("ij,ij->i", diff, diff)
        ws = w[idx] if weighted else None
        # A one-hot (k, rows) block carrying the weights: the sums are one small GEMM.
        onehot = np.zeros((k, m))
        onehot[labels, np.arange(m)] = 1.0 if ws is None else ws
        sums += onehot @ x
        wsum += onehot.sum(axis=1)
        total += float(best.sum() if ws is None else best @ ws)
    return total


def _exact_argmin(x, centers):
    """Nearest of ``centers`` to each row of ``x`` (float64) by squared distances added feature
    by feature in order, lowest index on ties: the compiled pass's rule."""
    sq = np.zeros((centers.shape[0], x.shape[0]))
    v = np.empty_like(sq)
    for t in range(x.shape[1]):
        np.subtract(centers[:, t, None], x[:, t], out=v)
        v *= v
        sq += v
    return sq.argmin(axis=0)


# The interface both executors implement, with the same signatures.
PASSES = (
    "assign_rows", "argmin_rows", "sums_full", "sums_delta", "column_sums", "centred_stats", "inertia_counts",
    "batch_sums", "seed_distances",
)


def _executor(name: str, namespace: dict[str, Any], simd_width: Any) -> SimpleNamespace:
    """The passes named in PASSES, found in ``namespace`` under their names (``_`` + name for
    the NumPy ones), and ``simd_width(k, d, dtype)``: the columns of the assignment's centre
    matrix when it runs in SIMD vectors (``k`` padded to whole vectors), 0 when by GEMM."""
    passes = {p: namespace.get(p) or namespace[f"_{p}"] for p in PASSES}
    return SimpleNamespace(name=name, simd_width=simd_width, **passes)


NUMPY = _executor("numpy", {**globals(), "seed_distances": _seed_pass.numpy_pass}, lambda k, d, dtype: 0)


# ----------------------------------------------------------------------------------------------
# Compiled executor


@functools.cache
def _compiled() -> SimpleNamespace | None:
    numba = _numba.load()
    if numba is None:
        return None
    try:
        compiled = _compile(numba)
    except Exception as exc:  # numba or llvmlite older or newer than _simd's use of their internals
        _give_up("building the compiled passes", exc)
        return None
    return _guarded(compiled, numba)


# Set when a compiled pass could not be compiled or linked for this process's CPU: every later
# choice of executor is NumPy's, which gives the same labels (local: the collectives are the same).
_broken: list[str] = []


def _give_up(what: str, exc: BaseException) -> None:
    """Warn once that the compiled k-means passes failed at ``what`` and NumPy runs instead."""
    if not _broken:
        warnings.warn(
            f"mpinb's compiled k-means passes failed at {what} ({type(exc).__name__}: "
            f"{str(exc).strip().splitlines()[0] if str(exc).strip() else 'no message'}); this process runs the "
            "NumPy passes instead: the same labels, slower on large data. MPINB_NUMBA=0 chooses them "
            "without trying numba.", RuntimeWarning, stacklevel=3)
    _broken.append(what)


def _guarded(compiled: SimpleNamespace, numba: Any) -> SimpleNamespace:
    """``compiled`` whose passes fall back to NumPy's when numba fails to compile or link them.

    numba compiles a pass at its first call with new argument types, so a failure surfaces inside
    a fit. A call that raises is a compile failure exactly when its argument types have no
    compiled version afterwards; then this call and every later one run on NumPy's pass (both
    take the same arguments; the SIMD assignment's padded centre columns have offset +inf, which
    NumPy's argmin never chooses). The successful call costs one Python frame."""

    def guard(name: str, dispatcher: Any) -> Any:
        fallback = getattr(NUMPY, name)

        def call(*args: Any) -> Any:
            if _broken:
                return fallback(*args)
            try:
                return dispatcher(*args)
            except Exception as exc:
                try:
                    types = tuple(dispatcher.typeof_pyval(a) for a in args)
                except Exception:
                    raise exc from None
                if types in dispatcher.overloads:
                    raise  # compiled code ran and raised: not ours to hide
                _give_up(f"compiling its {name} pass", exc)
                return fallback(*args)

        call.__name__ = call.__qualname__ = name
        return call

    passes = {p: guard(p, getattr(compiled, p)) for p in PASSES}
    return SimpleNamespace(name=compiled.name, simd_width=compiled.simd_width, **passes)


def _compile(numba: Any) -> SimpleNamespace:
    from mpinb.kmeans import _simd  # imports numba: only here

    jit = numba.njit(cache=True, nogil=True, boundscheck=False)

    @jit
    def log_change(track_rows, track_old, recorded, row, old):
        """Append a changed row and its old label to the track buffers at ``recorded`` while they
        have room (then -1, for good); returns the new ``recorded``."""
        if recorded < 0:
            return recorded
        if recorded >= track_rows.size:
            return -1
        track_rows[recorded] = row
        track_old[recorded] = old
        return recorded + 1

    global _log_compiled  # see the module's globals for why not a closure variable
    _log_compiled = log_change

    @jit
    def record_changes(new, labels, start, track_rows, track_old, recorded):
        """Write ``new`` labels over ``labels``; changed rows (global index ``start + i``) and their
        old labels are appended to the track buffers as :func:`argmin_rows` appends them.
        Returns (number of changed labels, new ``recorded``)."""
        changed = 0
        for i in range(new.size):
            old = labels[i]
            if new[i] != old:
                changed += 1
                recorded = _log_compiled(track_rows, track_old, recorded, start + i, old)
                labels[i] = new[i]
        return changed, recorded

    @jit
    def argmin_rows(dist, q, labels, start, track_rows, track_old, recorded):
        """Nearest centre of each row of ``dist + q`` (lowest index on ties), written to
        ``labels``; changed rows (global index ``start + i``) and their old labels are appended
        to the track buffers from position ``recorded`` until they are full (then -1).
        Returns (number of changed labels, new ``recorded``)."""
        m, k = dist.shape
        changed = 0
        for i in range(m):
            best = dist[i, 0] + q[0]
            arg = 0
            for j in range(1, k):
                # Branch-free selects: the winner is data dependent, so a branch mispredicts.
                v = dist[i, j] + q[j]
                lower = v < best
                best = v if lower else best
                arg = j if lower else arg
            old = labels[i]
            if arg != old:
                changed += 1
                recorded = _log_compiled(track_rows, track_old, recorded, start + i, old)
                labels[i] = arg
        return changed, recorded

    global _argmin_compiled, _record_compiled, _nearest_compiled  # see the module's globals: not closure variables
    _argmin_compiled, _record_compiled, _nearest_compiled = argmin_rows, record_changes, _simd.nearest

    @jit
    def assign_rows(X, c2t, q, labels, track_rows, track_old, recorded, block, fold, w, weighted, centers, sums,
                    weights, members, simd):
        """The assignment step: per chunk of ``block`` rows, each row's nearest centre -- with
        ``simd``, by :func:`mpinb.kmeans._simd.nearest` (``c2t`` and ``q`` padded to whole
        vectors); else the GEMM ``X[s:e] @ c2t`` (BLAS, called from compiled code: a Python loop
        over the chunks cost 15% of the step in call overhead) and :func:`argmin_rows` over it
        while it is in cache -- then, by ``fold``, the chunk's rows added to the cluster sums
        (:func:`sums_full`), to the inertia and counts (:func:`inertia_counts`, counts into
        ``members``) or its changed rows moved between clusters (:func:`sums_delta`) while they
        are in cache too, in the order those passes add them.
        Returns (changed labels, ``recorded``, inertia)."""
        n, k = X.shape[0], c2t.shape[1]
        rows_per = min(block, max(n, 1))
        buf = np.empty((0 if simd else rows_per, k), dtype=c2t.dtype)
        new = np.empty(rows_per if simd else 0, dtype=np.int32)
        changed = 0
        inertia = 0.0
        for s in range(0, n, block):
            e = min(n, s + block)
            before = recorded
            if simd:
                chunk = new[: e - s]
                _nearest_compiled(X[s:e], c2t, q, chunk)
                found, recorded = _record_compiled(chunk, labels[s:e], s, track_rows, track_old, recorded)
            else:
                # A copy only for rows that are not C-contiguous (BLAS wants contiguous operands).
                rows = np.ascontiguousarray(X[s:e])
                out = buf[: e - s]
                if e - s == buf.shape[0]:
                    np.dot(rows, c2t, out)
                else:
                    out = np.dot(rows, c2t)
                found, recorded = _argmin_compiled(out, q, labels[s:e], s, track_rows, track_old, recorded)
            changed += found
            if fold == 3 and recorded > before:  # FOLD_MOVES: the chunk's changed rows, still in cache
                _moves_compiled(X, w, weighted, track_rows[before:recorded], track_old[before:recorded], labels, sums,
                                weights, members)
            ws = w[s:e] if weighted else w
            if fold == 1:  # FOLD_SUMS
                _sums_compiled(X[s:e], ws, weighted, labels[s:e], sums, weights, members)
            elif fold == 2:  # FOLD_INERTIA
                inertia += _inertia_compiled(X[s:e], ws, weighted, centers, labels[s:e], members)
        return changed, recorded, inertia

    @jit
    def sums_full(X, w, weighted, labels, sums, weights, members):
        """Add every row (times its weight) to its cluster's sums, weights and member count."""
        n, d = X.shape
        for i in range(n):
            c = labels[i]
            wi = w[i] if weighted else 1.0
            for t in range(d):
                sums[c, t] += wi * X[i, t]
            weights[c] += wi
            if wi > 0:
                members[c] += 1.0

    @jit
    def sums_delta(X, w, weighted, rows, old, labels, sums, weights, members):
        """Move each changed row's contribution from its old cluster to its new one."""
        d = X.shape[1]
        for r in range(rows.size):
            i = rows[r]
            a = labels[i]
            b = old[r]
            wi = w[i] if weighted else 1.0
            for t in range(d):
                x = wi * X[i, t]
                sums[a, t] += x
                sums[b, t] -= x
            weights[a] += wi
            weights[b] -= wi
            if wi > 0:
                members[a] += 1.0
                members[b] -= 1.0

    @jit
    def column_sums(X, out):
        """Add the column sums of ``X`` to ``out`` (float64): one pass, row by row, where
        NumPy's ``sum(axis=0)`` over a C-ordered array costs three times as long."""
        n, d = X.shape
        for i in range(n):
            for t in range(d):
                out[t] += X[i, t]

    @jit
    def centred_stats(X, mean, w, weighted, stats):
        """Accumulate per-feature sums of squares of ``x - mean`` into ``stats[:d]``, the
        weighted sum of squared norms into ``stats[d]``; return the largest squared norm."""
        n, d = X.shape
        biggest = 0.0
        for i in range(n):
            sq = 0.0
            for t in range(d):
                v = X[i, t] - mean[t]
                stats[t] += v * v
                sq += v * v
            stats[d] += w[i] * sq if weighted else sq
            if sq > biggest:
                biggest = sq
        return biggest

    @jit
    def inertia_counts(X, w, weighted, centers, labels, counts):
        """Weighted sum of squared distances to the assigned (raw) centres; rows per label are
        added to ``counts``."""
        n, d = X.shape
        total = 0.0
        for i in range(n):
            c = labels[i]
            sq = 0.0
            for t in range(d):
                v = X[i, t] - centers[c, t]
                sq += v * v
            total += w[i] * sq if weighted else sq
            counts[c] += 1.0
        return total

    global _sums_compiled, _inertia_compiled, _moves_compiled  # see the module's globals: not closure variables
    _sums_compiled, _inertia_compiled, _moves_compiled = sums_full, inertia_counts, sums_delta

    global _prefetch  # see the module's globals for why not a closure variable
    _prefetch = _simd.prefetch

    @jit
    def batch_sums(X, rows, w, weighted, centers, sums, wsum):
        """The local work of a mini-batch over the rows ``X[rows]``, read where they are: each
        row's nearest centre by squared distance from differences (no cancellation; lowest index
        on ties), its weighted row added to that centre's ``sums`` and its weight to ``wsum``.
        Returns the weighted sum of the squared distances to the nearest centres.

        Per block of rows: copy them (float64, by column) into a buffer that stays in L1, then the
        distances with the rows innermost (vectorised; each distance adds its ``d`` squares in
        order), the argmin and the sums. The drawn rows are scattered over the whole shard, so
        each costs a cache and TLB miss: the next block's rows are prefetched while this one
        computes, which hides much of that latency (1,024 random rows of 16 from 2,000,000:
        about 90-110 us with the prefetch, 120-180 us without, and 300 us row by row in place).
        """
        k, d = centers.shape
        n = rows.size
        line = max(1, 64 // X.itemsize)  # values per 64-byte cache line
        xb = np.empty((d, _BATCH_BLOCK))
        dist = np.empty((k, _BATCH_BLOCK))
        best = np.empty(_BATCH_BLOCK)
        arg = np.empty(_BATCH_BLOCK, np.int64)
        total = 0.0
        for r in range(min(n, _BATCH_BLOCK)):
            for t in range(0, d, line):
                _prefetch(X, rows[r], t)
            _prefetch(X, rows[r], d - 1)
        for s in range(0, n, _BATCH_BLOCK):
            m = min(_BATCH_BLOCK, n - s)
            for r in range(m):
                i = rows[s + r]
                for t in range(d):
                    xb[t, r] = X[i, t]
            ahead = min(_BATCH_BLOCK, n - s - m)  # the next block's rows, prefetched in k slices
            per = (ahead + k - 1) // k
            for j in range(k):
                for q in range(j * per, min(ahead, (j + 1) * per)):
                    i = rows[s + m + q]
                    for t in range(0, d, line):
                        _prefetch(X, i, t)
                    _prefetch(X, i, d - 1)
                for r in range(m):
                    dist[j, r] = 0.0
                for t in range(d):
                    c = centers[j, t]
                    for r in range(m):
                        v = xb[t, r] - c
                        dist[j, r] += v * v
            for r in range(m):
                best[r] = dist[0, r]
                arg[r] = 0
            for j in range(1, k):
                for r in range(m):
                    v = dist[j, r]
                    lower = v < best[r]
                    best[r] = v if lower else best[r]
                    arg[r] = j if lower else arg[r]
            for r in range(m):
                c = arg[r]
                wi = w[rows[s + r]] if weighted else 1.0
                for t in range(d):
                    sums[c, t] += wi * xb[t, r]
                wsum[c] += wi
                total += wi * best[r]
        return total

    seed_distances = _seed_pass.compiled_pass(numba)  # noqa: F841 - collected by _executor

    def simd_width(k: int, d: int, dtype: Any) -> int:
        return _simd.padded_width(k, dtype) if k * d <= SIMD_MAX_WORK else 0

    return _executor("compiled", locals(), simd_width)
