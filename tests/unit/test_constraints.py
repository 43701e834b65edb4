"""mpinb._constraints: declared parameter checks convert what they accept and state the rule and
the value received otherwise."""

from __future__ import annotations

import numpy as np
import pytest

from mpinb._constraints import Accepts, Exactly, Flag, Integer, Options, Real, check_parameters


class Estimator:
    def __init__(self, **params) -> None:
        vars(self).update(params)


TABLE = {
    "steps": Accepts(Options("auto"), Integer(minimum=1)),
    "patience": Accepts(Exactly(None), Integer(minimum=0)),
    "ratio": Accepts(Real(minimum=0), wrong_type=ValueError),
    "labels": Accepts(Flag()),
}


def test_constraints_convert_what_they_accept() -> None:
    got = check_parameters(Estimator(steps=np.int64(3), patience=None, ratio=1, labels=np.bool_(False)), TABLE)
    assert got == {"steps": 3, "patience": None, "ratio": 1.0, "labels": False}
    assert type(got["steps"]) is int and type(got["ratio"]) is float and type(got["labels"]) is bool


@pytest.mark.parametrize(
    "params, exc, message",
    [
        ({"steps": 0}, ValueError, "steps must be 'auto' or a positive integer; got 0."),
        ({"steps": "all"}, TypeError, "steps must be 'auto' or a positive integer; got 'all'."),
        ({"patience": -1}, ValueError, "patience must be None or a non-negative integer; got -1."),
        ({"ratio": float("nan")}, ValueError, "ratio must be a finite number >= 0; got nan."),
        ({"ratio": "x"}, ValueError, "ratio must be a finite number >= 0; got 'x'."),
        ({"labels": 1}, TypeError, "labels must be True or False; got 1."),
    ],
)
def test_constraints_state_the_rule_and_the_value(params, exc, message) -> None:
    good = {"steps": "auto", "patience": 2, "ratio": 0.5, "labels": True}
    with pytest.raises(exc) as raised:
        check_parameters(Estimator(**{**good, **params}), TABLE)
    assert str(raised.value) == message
