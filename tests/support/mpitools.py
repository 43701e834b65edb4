"""Helpers for tests that run under ``mpiexec``: assert together, raise together, same everywhere."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest


def world():
    from mpi4py import MPI

    return MPI.COMM_WORLD


# Rank-aware reporting, shared by the conftests of tests run under mpiexec (they import these two
# hooks): rank 0 reports progress for the whole world; the other ranks stay quiet except for
# failures, which they print themselves, so a failure seen only on rank 3 is still explained.


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    if world().Get_rank() > 0:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            session.config.pluginmanager.unregister(reporter)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    rank, size = world().Get_rank(), world().Get_size()
    if rank > 0 and report.failed:
        import sys

        sys.stderr.write(f"\n[rank {rank}/{size}] FAILED {report.nodeid} ({report.when})\n")
        sys.stderr.write(f"{report.longreprtext}\n")
        sys.stderr.flush()


def all_true(ok: bool, comm: Any = None) -> bool:
    """Whether ``ok`` holds on every rank; every rank gets the same answer, so tests pass or fail
    together instead of leaving one rank in a collective."""
    comm = comm or world()
    return all(comm.allgather(bool(ok)))


def assert_everywhere(ok: bool, what: str = "", comm: Any = None) -> None:
    comm = comm or world()
    verdicts = comm.allgather(bool(ok))
    bad = [r for r, v in enumerate(verdicts) if not v]
    assert not bad, f"{what} failed on ranks {bad}"


def assert_same_everywhere(value: Any, comm: Any = None, *, rtol: float = 0.0) -> None:
    """``value`` (array or scalar) is equal on every rank (exactly, unless ``rtol``)."""
    comm = comm or world()
    values = comm.allgather(np.asarray(value))
    for r, v in enumerate(values):
        if rtol:
            np.testing.assert_allclose(v, values[0], rtol=rtol, err_msg=f"rank {r} differs from rank 0")
        else:
            np.testing.assert_array_equal(v, values[0], err_msg=f"rank {r} differs from rank 0")


@contextmanager
def raises_everywhere(exc: type[BaseException], match: str | None = None, comm: Any = None) -> Iterator[Any]:
    """Like ``pytest.raises``, and also: every rank raised the same type with the same message, and
    the communicator still works afterwards (a follow-up collective completes)."""
    comm = comm or world()
    with pytest.raises(exc, match=match) as info:
        yield info
    seen = comm.allgather((type(info.value).__name__, str(info.value)))
    assert len(set(seen)) == 1, f"ranks raised different errors: {seen}"
    # The communicator must still be usable: a buffer collective after the error completes.
    probe = np.array([1.0])
    from mpi4py import MPI

    comm.Allreduce(MPI.IN_PLACE, probe, op=MPI.SUM)
    assert probe[0] == comm.Get_size()


def assert_interrupt_stops_together(estimator: Any, X_local: Any, counter: str, how: str, match: str) -> None:
    """Ctrl-C on the last rank at the third ``counter`` (``"iteration"``, ``"step"``) of
    ``estimator.fit`` -- a real SIGINT (``how="sigint"``) or a stop request -- stops every rank
    at the same point with ``KeyboardInterrupt`` matching ``match``; nothing is fitted, the SIGINT
    handler is restored, and the estimator fits normally afterwards."""
    import signal

    comm = world()
    previous = signal.getsignal(signal.SIGINT)

    def hook(info: dict[str, Any]) -> None:
        if info[counter] == 3 and comm.Get_rank() == comm.Get_size() - 1:
            if how == "sigint":
                signal.raise_signal(signal.SIGINT)
            else:
                info["stop"].request()

    estimator._on_iteration = hook
    with raises_everywhere(KeyboardInterrupt, match=match):
        estimator.fit(X_local)
    assert_everywhere(not hasattr(estimator, "cluster_centers_"), "no fitted attributes after an interrupt")
    assert_everywhere(signal.getsignal(signal.SIGINT) is previous, "SIGINT handler restored")
    estimator._on_iteration = None
    estimator.fit(X_local)
    assert_same_everywhere(estimator.cluster_centers_)


def local(*arrays: Any) -> Any:
    """This rank's slice of arrays that every rank generated identically: ``mpinb.shard``
    without its length check, so a test that counts collectives sees none from here."""
    import mpinb

    comm = world()
    lo, hi = mpinb.shard_bounds(len(arrays[0]), rank=comm.Get_rank(), size=comm.Get_size())
    pieces = tuple(a[lo:hi] for a in arrays)
    return pieces[0] if len(pieces) == 1 else pieces


def uneven(*arrays: Any, shares: Any = (1, 3, 2, 5, 4)) -> Any:
    """This rank's slice of arrays that every rank generated identically, with rank ``r`` holding
    a part proportional to ``shares[r % len(shares)]`` (a share of 0: an empty shard)."""
    comm = world()
    rank, size = comm.Get_rank(), comm.Get_size()
    weights = np.array([shares[r % len(shares)] for r in range(size)], dtype=np.float64)
    ends = np.round(np.cumsum(weights) / weights.sum() * len(arrays[0])).astype(int)
    lo, hi = (0 if rank == 0 else int(ends[rank - 1])), int(ends[rank])
    pieces = tuple(a[lo:hi] for a in arrays)
    return pieces[0] if len(pieces) == 1 else pieces
