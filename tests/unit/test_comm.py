"""The core collectives' local checks: a bad op, a non-numeric array, a bad thread count, each
refused before communicating."""

from __future__ import annotations

import numpy as np
import pytest

import mpinb


def test_allreduce_rejects_unknown_op_before_communicating() -> None:
    with pytest.raises(ValueError, match="op must be one of 'sum', 'mean', 'min', 'max'; got 'avg'"):
        mpinb.allreduce([np.ones(3)], op="avg")


def test_allreduce_rejects_non_numeric() -> None:
    with pytest.raises(TypeError, match="item 1 has dtype <U1"):
        mpinb.allreduce([np.ones(2), np.array(["a"])])


def test_limit_threads_rejects_bad_n() -> None:
    with pytest.raises(ValueError, match="positive integer"):
        mpinb.limit_threads(0)


@pytest.mark.parametrize("value", [np.float64(1), np.array(2.0), 3])
def test_gather_rows_refuses_a_0d_value_instead_of_taking_it_as_one_row(value) -> None:
    # np.ascontiguousarray turns a 0-d value into one row; the refusal must come first.
    with pytest.raises(ValueError, match=r"gather_rows needs rows along axis 0; got a 0-d value \(a scalar\) "
                                         r"on the only rank\. Pass a 1-D array .*np\.atleast_1d"):
        mpinb.gather_rows(value)
    with pytest.raises(ValueError, match="0-d value"):
        mpinb.gather_rows(value, root=None)


def test_gather_rows_still_takes_1d_and_non_contiguous_rows() -> None:
    assert mpinb.gather_rows(np.atleast_1d(np.float64(1))).tolist() == [1.0]
    strided = np.arange(12.0).reshape(3, 4)[:, ::2]
    np.testing.assert_array_equal(mpinb.gather_rows(strided), strided)
