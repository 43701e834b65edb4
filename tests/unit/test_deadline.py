"""One-process tests of collective deadlines: the global default, its validation, the error type."""

from __future__ import annotations

import inspect
import pickle

import numpy as np
import pytest

import mpinb
from mpinb import deadline
from mpinb.errors import CollectiveTimeout


@pytest.fixture(autouse=True)
def _no_default_deadline(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(deadline.ENV_VAR, raising=False)
    monkeypatch.setattr(deadline, "_setting", deadline._UNSET)


def test_no_deadline_unless_configured() -> None:
    assert deadline.get_collective_timeout() is None


@pytest.mark.parametrize("raw, expect",
                         [("2.5", 2.5), ("60", 60.0), ("", None), ("none", None), (" OFF ", None), ("inf", None)])
def test_environment_variable_is_read_at_call_time(raw: str, expect, monkeypatch) -> None:
    monkeypatch.setenv("MPINB_COLLECTIVE_TIMEOUT", raw)
    assert deadline.get_collective_timeout() == expect


@pytest.mark.parametrize("raw", ["abc", "0", "-3", "nan"])
def test_bad_environment_variable_says_what_is_expected(raw: str, monkeypatch) -> None:
    monkeypatch.setenv("MPINB_COLLECTIVE_TIMEOUT", raw)
    with pytest.raises(ValueError,
                       match=rf"MPINB_COLLECTIVE_TIMEOUT must be a positive number of seconds .*; got '{raw}'"):
        deadline.get_collective_timeout()


def test_setter_overrides_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("MPINB_COLLECTIVE_TIMEOUT", "5")
    deadline.set_collective_timeout(1.5)
    assert deadline.get_collective_timeout() == 1.5
    deadline.set_collective_timeout(None)
    assert deadline.get_collective_timeout() is None


@pytest.mark.parametrize("bad", [0, -1, "5", True, float("nan"), [1]])
def test_setter_refuses_nonsense(bad) -> None:
    with pytest.raises(ValueError, match=r"seconds must be a positive number of seconds or None \(no deadline\); got"):
        deadline.set_collective_timeout(bad)


def test_one_rank_needs_no_waiting_and_no_set_up() -> None:
    from mpi4py import MPI

    from mpinb import _collective

    deadline.set_collective_timeout(0.001)
    comm = MPI.COMM_SELF
    for _ in range(3):
        (out,) = mpinb.allreduce([np.ones(3)], comm=comm)
        assert np.array_equal(out, np.ones(3))
    assert mpinb.bcast({"k": 1}, comm=comm) == {"k": 1}
    chan = _collective.channel(comm)
    assert chan.ready and chan.gens == [] and chan.board is None and chan.ctrl is None


def test_collective_timeout_is_a_timeout_error_with_details() -> None:
    err = CollectiveTimeout("allreduce #3 timed out", operation="allreduce", number=3, timeout=2.0, rank=0,
                            missing={2: "its last mpinb collective: bcast #2"}, arrived=(0, 1))
    assert isinstance(err, TimeoutError) and str(err) == "allreduce #3 timed out"
    assert (err.operation, err.number, err.timeout, err.rank, err.arrived) == ("allreduce", 3, 2.0, 0, (0, 1))
    assert err.missing == {2: "its last mpinb collective: bcast #2"}
    assert str(pickle.loads(pickle.dumps(err))) == "allreduce #3 timed out"
    assert str(CollectiveTimeout("plain")) == "plain"  # how raise_together re-creates exceptions


@pytest.mark.parametrize(
    "fn", [mpinb.allreduce, mpinb.bcast, mpinb.gather_rows, mpinb.on_root, mpinb.rprint, mpinb.world,
           mpinb.limit_threads, mpinb.check_all, mpinb.check_same, mpinb.raise_together],
)
def test_every_collective_takes_a_keyword_timeout(fn) -> None:
    param = inspect.signature(fn).parameters["timeout"]
    assert param.kind is inspect.Parameter.KEYWORD_ONLY and param.default is deadline.DEFAULT
