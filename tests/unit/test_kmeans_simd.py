"""The compiled executor's assignment in SIMD vectors (mpinb.kmeans._simd): the same labels as the
GEMM path and as exact arithmetic, the lowest index on exact ties, whatever the lanes, the padding,
the row count, the layout or the rows beside a row."""

from __future__ import annotations

import numpy as np
import pytest

from mpinb.kmeans import _kernels
from mpinb.kmeans._distances import Fold, assign
from mpinb.kmeans._kernels import COMPILE_FROM, FOLD_INERTIA, FOLD_SUMS, SIMD_MAX_WORK, kernels

COMPILED = kernels(COMPILE_FROM)


def integer_case(n, d, k, dtype, seed=0):
    """Small integers, so every product and sum is exact in float32 and float64 alike: both paths
    compute the same values and every tie is exact. Duplicated centres sit in different lanes of
    both widths (8 and 16): 17 = 4 (lanes 1 and 4 of a float32 vector) and 13 = 2 (lanes 5 and 2
    of a float64 vector), so the fold across lanes must choose the lower index, not the lower lane."""
    rng = np.random.default_rng(seed)
    X = rng.integers(-3, 4, size=(n, d)).astype(dtype)
    centres = rng.integers(-3, 4, size=(k, d)).astype(np.float64)
    centres[17] = centres[4]
    centres[13] = centres[2]
    return X, centres


def exact_labels(X, centres):
    """argmin of -2 x.c + |c|^2 in integers: lowest index on ties."""
    x = X.astype(np.int64)
    c = centres.astype(np.int64)
    return (-2 * x @ c.T + (c * c).sum(axis=1)).argmin(axis=1)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("n", [8, 1003])
def test_labels_equal_exact_arithmetic_and_the_gemm_path(dtype, n):
    d, k = 5, 21  # k padded to 24 (float64) or 32 (float32) columns; n % 8 == 3 leaves a tail
    X, centres = integer_case(n, d, k, dtype)
    assert COMPILED.simd_width(k, d, dtype) in (24, 32)
    zero = np.zeros(d)
    labels = {}
    for ex in (COMPILED, _kernels.NUMPY):
        out = np.full(n, -1, dtype=np.int32)
        assign(X, centres, zero, out, run_on=ex)
        labels[ex.name] = out
    expected = exact_labels(X, centres)
    np.testing.assert_array_equal(labels["compiled"], expected)
    np.testing.assert_array_equal(labels["numpy"], expected)
    assert not np.isin(labels["compiled"], [13, 17]).any()  # the duplicates' higher index never wins
    assert np.isin(labels["compiled"], [2, 4]).any()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_rows_label_does_not_depend_on_its_neighbours_or_layout(dtype):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(2000, 7)).astype(dtype)
    centres = rng.normal(size=(11, 7))
    mean = centres.mean(axis=0)
    whole = np.full(len(X), -1, dtype=np.int32)
    assign(X, centres - mean, mean, whole, run_on=COMPILED)
    for start in (1, 3, 7, 1995):  # every offset within a block of eight, and a tail alone
        part = np.full(len(X) - start, -1, dtype=np.int32)
        assign(X[start:], centres - mean, mean, part, run_on=COMPILED)
        np.testing.assert_array_equal(part, whole[start:])
    strided = np.full(len(X), -1, dtype=np.int32)
    assign(np.asfortranarray(X), centres - mean, mean, strided, run_on=COMPILED)
    np.testing.assert_array_equal(strided, whole)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_change_tracking_and_folds_match_the_gemm_path(dtype):
    X, centres = integer_case(3001, 6, 21, dtype, seed=2)
    zero = np.zeros(6)
    results = []
    for ex in (COMPILED, _kernels.NUMPY):
        labels = np.arange(len(X), dtype=np.int32) % 21
        rows, old = np.empty(len(X), np.int32), np.empty(len(X), np.int32)
        changes = assign(X, centres, zero, labels, track=(rows, old), run_on=ex)
        sums, weights, members = np.zeros((21, 6)), np.zeros(21), np.zeros(21)
        fresh = np.full(len(X), -1, dtype=np.int32)
        assign(X, centres, zero, fresh, run_on=ex,
               fold=Fold(FOLD_SUMS, np.empty(0), False, centres, sums, weights, members))
        counts = np.zeros(21)
        inertia = assign(X, centres, zero, fresh, run_on=ex,
                         fold=Fold(FOLD_INERTIA, np.empty(0), False, centres, sums, weights, counts)).inertia
        results.append((labels, changes.n_changed, changes.rows, changes.old, sums, weights, members, counts,
                        inertia))
    for a, b in zip(*results, strict=True):
        np.testing.assert_array_equal(a, b)


def test_beyond_the_limit_the_compiled_executor_takes_the_gemm():
    assert COMPILED.simd_width(256, SIMD_MAX_WORK // 256, np.float64) == 256
    assert COMPILED.simd_width(257, SIMD_MAX_WORK // 256, np.float64) == 0
    assert _kernels.NUMPY.simd_width(16, 16, np.float64) == 0
    rng = np.random.default_rng(3)
    X = rng.integers(-2, 3, size=(300, 300)).astype(np.float64)
    centres = rng.integers(-2, 3, size=(260, 300)).astype(np.float64)
    out = np.full(len(X), -1, dtype=np.int32)
    assign(X, centres, np.zeros(300), out, run_on=COMPILED)
    np.testing.assert_array_equal(out, exact_labels(X, centres))
