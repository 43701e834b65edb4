"""Collective decisions on errors: the same exception, with the same message, on every rank.

Each of these is one small collective whose verdicts ride in the arrival message, so the common
case (nothing wrong anywhere) moves no data, and a failure on one rank fails every rank instead of
leaving the healthy ones waiting in the next collective.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from mpinb import _collective
from mpinb import deadline as _deadline
from mpinb._collective.exceptions import record
from mpinb._words import Listed, on_ranks

__all__ = ["check_all", "check_same", "raise_together"]

_LISTED = 80  # characters of a list's repr beyond which a mismatch names its first differing entry


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
    failed = _collective.failures(None if ok else str(message), comm=comm, name="check_all", timeout=timeout)
    if failed:
        raise exc(compose(failed, _collective.channel(comm).size))


def check_same(value: Any, what: str, *, comm: Any = None, timeout: Any = _deadline.DEFAULT,
               labels: Sequence[str] | None = None) -> None:
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
    labels : sequence of str, optional
        For a list ``value``, a name for each entry (a weight's path), shown beside the first entry
        that differs; not compared.

    Notes
    -----
    A long list or tuple (or one with ``labels``) is described entry by entry when the ranks
    differ: the message names the first entry that differs, in full, on each rank.
    """
    text = repr(value)
    listed = isinstance(value, (list, tuple)) and (labels is not None or len(text) > _LISTED)
    _collective.barrier(comm=comm, name="check_same", layout=Listed(value, labels) if listed else text,
                        what=what, timeout=timeout)


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
    failed = _collective.failures(None if error is None else record(error), comm=comm, name="raise_together",
                                  timeout=timeout)
    if not failed:
        return
    module, qualname, _ = failed[min(failed)]
    message = compose({rank: text for rank, (_, _, text) in failed.items()}, _collective.channel(comm).size)
    raised = _collective.common_exception(module, qualname, message, comm=comm, name="raise_together's exception",
                                          timeout=timeout)
    raise raised from (error if error is not None and record(error)[:2] == (module, qualname) else None)


def compose(failed: dict[int, str], size: int) -> str:
    """One message, identical on every rank, naming the ranks that failed."""
    ranks = sorted(failed)
    distinct = {failed[r] for r in ranks}
    if len(distinct) == 1:
        return f"{failed[ranks[0]]} [{on_ranks(ranks, size)}]"
    parts = "; ".join(f"rank {r}: {failed[r]}" for r in ranks)
    return f"{parts} [{on_ranks(ranks, size)}]"


