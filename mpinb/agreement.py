"""Collective decisions on errors: the same exception, with the same message, on every rank.

Each of these is one small collective whose verdicts ride in the arrival message, so the common
case (nothing wrong anywhere) moves no data, and a failure on one rank fails every rank instead of
leaving the healthy ones waiting in the next collective.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from mpinb import _collective
from mpinb import deadline as _deadline
from mpinb._words import on_ranks

__all__ = ["agree_on_exception", "check_all", "check_same", "raise_together", "record"]


def check_all(
    ok: bool, message: str, *, comm: Any = None, exc: type[Exception] = ValueError, timeout: Any = _deadline.DEFAULT
) -> None:
    """Raise the same exception on every rank if ``ok`` is false on any rank.

    Collective: every rank of ``comm`` calls it. The verdicts ride in the arrival message of one
    small collective, so a data-dependent check (an empty shard, a NaN on one rank) fails everywhere
    instead of leaving the healthy ranks waiting in the next collective; only a failure moves the
    messages.

    Parameters
    ----------
    ok : bool
        This rank's verdict.
    message : str
        What went wrong, as seen by this rank. Failing ranks' messages are combined so the text is
        identical on every rank and names the ranks that failed.
    comm : mpi4py.MPI.Comm, optional
        Defaults to ``MPI.COMM_WORLD``.
    exc : type of Exception, default ValueError
        The exception type raised on every rank.
    timeout : float or None, optional
        Seconds to wait for the other ranks before raising :class:`CollectiveTimeout`; by default
        :func:`mpinb.get_collective_timeout`, and ``None`` waits forever.

    Raises
    ------
    exc
        On every rank, when any rank passed ``ok=False``.

    Examples
    --------
    >>> mpinb.check_all(len(X_local) > 0, f"this shard is empty ({len(X_local)} rows)")
    """
    with _collective.collective(comm, "check_all", timeout=timeout, votes=(0 if ok else 1, 0)) as op:
        if not op.votes[0]:
            return
        verdicts = op.allgather(None if ok else str(message))
        failed = {rank: msg for rank, msg in enumerate(verdicts) if msg is not None}
        op.fail(exc(compose(failed, op.size)))


def check_same(value: Any, what: str, *, comm: Any = None, timeout: Any = _deadline.DEFAULT) -> None:
    """Raise :class:`CollectiveMismatchError` on every rank unless ``value`` is equal on all ranks.

    Collective. ``value`` is compared by its ``repr``, so pass hashable descriptions such as
    shapes, dtype strings and hyper-parameters, not bulk data. A digest of it rides in the arrival
    message of one small collective; only a mismatch gathers the values to write the message.

    Parameters
    ----------
    value : object
        This rank's value; its ``repr`` must be deterministic across processes.
    what : str
        A noun phrase naming the value in the error, e.g. ``"n_clusters"``.
    comm : mpi4py.MPI.Comm, optional
        Defaults to ``MPI.COMM_WORLD``.
    timeout : float or None, optional
        Seconds to wait for the other ranks before raising :class:`CollectiveTimeout`; by default
        :func:`mpinb.get_collective_timeout`, and ``None`` waits forever.
    """
    with _collective.collective(comm, "check_same", repr(value), timeout=timeout, what=what):
        pass


@contextmanager
def raise_together(*, comm: Any = None, timeout: Any = _deadline.DEFAULT) -> Iterator[None]:
    """Run a block of local checks; if it raises on any rank, raise on every rank.

    Collective: every rank enters and leaves the block. The exception type of the lowest failing
    rank is raised everywhere with a message naming the failing ranks, so validation written as
    ordinary ``raise`` statements becomes a collective decision. Exceptions cross ranks as module,
    name and message, never pickled: a type that some rank cannot import by that name (one defined
    inside a function, say) becomes ``RuntimeError`` on every rank, its message naming the type.
    ``timeout`` (seconds, default :func:`mpinb.get_collective_timeout`, ``None`` waits forever)
    bounds the wait at the block's end for the other ranks; past it, :class:`CollectiveTimeout` is
    raised.

    Examples
    --------
    >>> with mpinb.raise_together():
    ...     X = np.asarray(X_local, dtype=float)
    ...     if not np.isfinite(X).all():
    ...         raise ValueError("X contains NaN or infinity")
    """
    error: BaseException | None = None
    try:
        yield
    except Exception as err:  # noqa: BLE001 - re-raised below, on every rank
        error = err
    with _collective.collective(comm, "raise_together", timeout=timeout, votes=(int(error is not None), 0)) as op:
        if not op.votes[0]:
            return
        reports = op.allgather(None if error is None else record(error))
        failed = {rank: rep for rank, rep in enumerate(reports) if rep is not None}
        first = failed[min(failed)]
        message = compose({rank: text for rank, (_, _, text) in failed.items()}, op.size)
        raised = agree_on_exception(op, first[0], first[1], message)
        if error is not None and record(error)[:2] == first[:2]:
            raised.__cause__ = error
        op.fail(raised)


def agree_on_exception(op: Any, module: str, qualname: str, message: str) -> BaseException:
    """The exception every rank raises for a type known by ``module`` and ``qualname``.

    Collective, inside operation ``op``: the type is used only if every rank can import it by that
    name and build it from a message, else every rank gets ``RuntimeError`` naming the type.
    """
    kind = _find_type(module, qualname)
    if not all(op.allgather(kind is not None)):
        kind = None
    return _instantiate(kind, module, qualname, message)


def compose(failed: dict[int, str], size: int) -> str:
    """One message, identical on every rank, naming the ranks that failed."""
    ranks = sorted(failed)
    distinct = {failed[r] for r in ranks}
    if len(distinct) == 1:
        return f"{failed[ranks[0]]} [{on_ranks(ranks, size)}]"
    parts = "; ".join(f"rank {r}: {failed[r]}" for r in ranks)
    return f"{parts} [{on_ranks(ranks, size)}]"


def record(error: BaseException) -> tuple[str, str, str]:
    """How an exception crosses ranks: its type's module and qualified name, and its message."""
    kind = type(error)
    return kind.__module__, kind.__qualname__, str(error)


def _find_type(module: str, qualname: str) -> type[BaseException] | None:
    if "<" in qualname:  # defined inside a function: no name reaches it
        return None
    import importlib

    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except Exception:  # noqa: BLE001 - any failure means: not importable by name
        return None
    return found if isinstance(found, type) and issubclass(found, BaseException) else None


def _instantiate(kind: type[BaseException] | None, module: str, qualname: str, message: str) -> BaseException:
    # A type that cannot be rebuilt from a message alone (rare) degrades to RuntimeError too.
    if kind is not None:
        try:
            return kind(message)
        except Exception:  # noqa: BLE001
            pass
    name = qualname if module == "builtins" else f"{module}.{qualname}"
    return RuntimeError(f"{name}: {message}")
