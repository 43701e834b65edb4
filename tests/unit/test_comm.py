"""The core collectives' local checks: a bad op, a non-numeric array, a bad thread count, each refused before communicating."""

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
