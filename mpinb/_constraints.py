"""Declared parameter constraints: what each estimator parameter accepts, checked by one function.

An estimator lists, per parameter, the kinds of value it accepts (scikit-learn's
``_constraints`` idea, written for mpinb's messages)::

    _constraints = {
        "n_init": Accepts(Options("auto"), Integer(minimum=1)),
        "tol": Accepts(Real(minimum=0), wrong_type=ValueError),
    }

and :func:`check_parameters` returns each value converted by the first rule that takes it, or
raises the error that states the rule and the value received: "n_init must be 'auto' or a
positive integer; got 0." Local and deterministic, so every rank fails alike.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np

from mpinb._checks import integer_bound, is_int
from mpinb._digest import digest

__all__ = [
    "NOT_MINE", "Accepts", "Callables", "Exactly", "Flag", "Fraction", "Instance", "Integer", "Invalid",
    "Options", "Real", "Rule", "Seed", "check_parameters", "describe",
]

NOT_MINE = object()  # what a rule returns for a value of another kind


class Invalid(Exception):
    """Raised by a rule for a value of its kind that it refuses: ``message`` (formatted with
    ``name``) replaces the parameter's message, ``got`` only what it says was received."""

    def __init__(self, message: str | None = None, *, got: str | None = None) -> None:
        super().__init__(message)
        self.message, self.got = message, got


class Rule:
    """One kind of value a parameter accepts: ``take`` returns the value converted, or
    ``NOT_MINE``, or raises :class:`Invalid`."""

    description = ""

    def take(self, value: Any) -> Any:
        raise NotImplementedError


class Integer(Rule):
    """An integer (not a bool) of at least ``minimum``, converted to ``int``."""

    def __init__(self, minimum: int | None = None, *, unit: str = "") -> None:
        self.minimum = minimum
        self.description = integer_bound(minimum) + (f" {unit}" if unit else "")

    def take(self, value: Any) -> Any:
        if not is_int(value):
            return NOT_MINE
        if self.minimum is not None and value < self.minimum:
            raise Invalid()
        return int(value)


class Seed(Rule):
    """An integer seed of NumPy's legacy generator, ``0 <= seed < 2**32``, kept as given."""

    description = "an int"

    def take(self, value: Any) -> Any:
        if not is_int(value):
            return NOT_MINE
        if not 0 <= value < 2**32:
            raise Invalid("{name} must be between 0 and 2**32 - 1; got {value!r}.")
        return value


class Real(Rule):
    """A finite real number (not a bool) of at least ``minimum``, converted to ``float``."""

    def __init__(self, minimum: float) -> None:
        self.minimum = minimum
        self.description = f"a finite number >= {minimum:g}"

    def take(self, value: Any) -> Any:
        if not isinstance(value, numbers.Real) or isinstance(value, bool):
            return NOT_MINE
        number = float(value)
        if not (number >= self.minimum and not math.isinf(number)):  # NaN fails the first test
            raise Invalid()
        return number


class Fraction(Rule):
    """A real number that is not an integer, strictly between 0 and 1 (a share, such as a
    fraction of the variance), converted to ``float``."""

    description = "a number strictly between 0 and 1"

    def take(self, value: Any) -> Any:
        if not isinstance(value, numbers.Real) or isinstance(value, (bool, numbers.Integral)):
            return NOT_MINE
        if not 0 < float(value) < 1:  # NaN fails too
            raise Invalid()
        return float(value)


class Flag(Rule):
    """``True`` or ``False`` (NumPy's bools too), converted to ``bool``."""

    description = "True or False"

    def take(self, value: Any) -> Any:
        return bool(value) if isinstance(value, (bool, np.bool_)) else NOT_MINE


class Options(Rule):
    """One of a few strings."""

    def __init__(self, *options: str) -> None:
        self.options = options
        self.description = ", ".join(repr(o) for o in options)

    def take(self, value: Any) -> Any:
        return value if isinstance(value, str) and value in self.options else NOT_MINE


class Exactly(Rule):
    """One value, such as ``None``."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.description = repr(value)

    def take(self, value: Any) -> Any:
        return value if value is self.value else NOT_MINE


class Instance(Rule):
    """An instance of ``kind``, as given."""

    def __init__(self, kind: type, description: str) -> None:
        self.kind, self.description = kind, description

    def take(self, value: Any) -> Any:
        return value if isinstance(value, self.kind) else NOT_MINE


class Callables(Rule):
    """A callable, as given (what it returns is checked where it is called)."""

    description = "a callable"

    def take(self, value: Any) -> Any:
        return value if callable(value) else NOT_MINE


class Accepts:
    """What one parameter accepts: the first of ``rules`` that takes a value converts it. A value
    no rule takes raises ``wrong_type`` (``TypeError`` unless the parameter has always said
    ``ValueError``); one that a rule refuses, ``ValueError``."""

    def __init__(self, *rules: Rule, wrong_type: type[Exception] = TypeError) -> None:
        self.rules, self.wrong_type = rules, wrong_type

    def check(self, name: str, value: Any) -> Any:
        for rule in self.rules:
            try:
                taken = rule.take(value)
            except Invalid as refused:
                raise ValueError(self._message(name, value, refused)) from None
            if taken is not NOT_MINE:
                return taken
        raise self.wrong_type(self._message(name, value, None))

    def _message(self, name: str, value: Any, refused: Invalid | None) -> str:
        if refused is not None and refused.message is not None:
            return refused.message.format(name=name, value=value)
        parts = [rule.description for rule in self.rules]
        accepted = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " or " + parts[-1]
        got = refused.got if refused is not None and refused.got is not None else repr(value)
        return f"{name} must be {accepted}; got {got}."


def check_parameters(est: Any, constraints: Mapping[str, Accepts]) -> dict[str, Any]:
    """Each constrained parameter of ``est`` checked and converted, in the table's order. Local."""
    return {name: accepts.check(name, getattr(est, name)) for name, accepts in constraints.items()}


def describe(value: Any) -> Any:
    """A description of a checked parameter value that is equal on two ranks exactly when the
    values are (for :func:`mpinb.check_same`): arrays and generators by digest, functions by
    name, everything else as it is. Local."""
    if isinstance(value, np.random.RandomState):
        return ("RandomState", digest(value))
    if callable(value):
        # Functions cannot be compared across processes; their names can.
        name = getattr(value, "__qualname__", type(value).__qualname__)
        return ("callable", getattr(value, "__module__", None), name)
    if isinstance(value, np.ndarray):
        return ("array", value.shape, digest(value))
    return value
