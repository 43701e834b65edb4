"""Error types and collective error decisions: the same exception on every rank."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from mpinb import deadline as _deadline

__all__ = [
    "CollectiveMismatchError",
    "CollectiveTimeout",
    "check_all",
    "check_same",
    "raise_together",
]


class CollectiveMismatchError(ValueError):
    """Ranks passed arguments to a collective that must agree but do not.

    Raised on every rank of the communicator, with the same message, before any data moves; the
    communicator stays usable.
    """


class CollectiveTimeout(TimeoutError):
    """A collective did not complete within its deadline because some ranks never arrived.

    Raised on each rank that waited, naming the operation (``allreduce #12``: the 12th mpinb
    collective on this communicator), the missing ranks and the last mpinb collective each of them
    entered. Also raised by a late rank's next mpinb collective on that communicator. The
    communicator is unusable afterwards: the abandoned operation can no longer be matched across
    ranks, so continue on a fresh communicator (one made before the failure, e.g. ``comm.Dup()``).

    Attributes
    ----------
    operation : str or None
        The collective, e.g. ``"allreduce"``.
    number : int or None
        Its position among the mpinb collectives on the communicator.
    timeout : float or None
        The deadline in seconds.
    rank : int or None
        The rank that raised it.
    missing : dict of int to str
        The ranks waited for, each with what it was doing instead.
    arrived : tuple of int
        The ranks that entered the operation.
    """

    def __init__(
        self,
        message: str,
        *,
        operation: str | None = None,
        number: int | None = None,
        timeout: float | None = None,
        rank: int | None = None,
        missing: dict[int, str] | None = None,
        arrived: tuple[int, ...] = (),
    ) -> None:
        super().__init__(message)
        self.operation, self.number, self.timeout, self.rank = operation, number, timeout, rank
        self.missing = dict(missing or {})
        self.arrived = tuple(arrived)

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def check_all(
    ok: bool, message: str, *, comm: Any = None, exc: type[Exception] = ValueError, timeout: Any = _deadline.DEFAULT
) -> None:
    """Raise the same exception on every rank if ``ok`` is false on any rank.

    Collective: every rank of ``comm`` calls it. One small allgather decides for all ranks, so a
    data-dependent check (an empty shard, a NaN on one rank) fails everywhere instead of leaving the
    healthy ranks waiting in the next collective.

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
    comm = _resolve(comm)
    with _deadline.begin(comm, "check_all", timeout) as call:
        verdicts = call.allgather((bool(ok), None if ok else str(message)))
    failed = {rank: msg for rank, (good, msg) in enumerate(verdicts) if not good}
    if failed:
        raise exc(_compose(failed, comm.Get_size()))


def check_same(value: Any, what: str, *, comm: Any = None, timeout: Any = _deadline.DEFAULT) -> None:
    """Raise :class:`CollectiveMismatchError` on every rank unless ``value`` is equal on all ranks.

    Collective. ``value`` is compared by its ``repr``, so pass hashable descriptions such as
    shapes, dtype strings and hyper-parameters, not bulk data. The common case costs one
    two-integer ``Allreduce``; only a mismatch gathers the values to write the message.

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
    comm = _resolve(comm)
    with _deadline.begin(comm, "check_same", timeout) as call:
        _check_same(value, what, call)


def _check_same(value: Any, what: str, call: Any) -> None:
    """check_same's worker, inside an mpinb collective already begun (allreduce uses it too)."""
    if call.state.size == 1:
        return
    import numpy as np
    from mpi4py import MPI

    text = repr(value)
    # Python's hash() of str is salted per process; a keyed digest is identical on every rank.
    digest = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=7).digest(), "little")
    buf = np.array([digest, -digest], dtype=np.int64)
    call.allreduce(buf, MPI.MIN)
    if buf[0] == -buf[1]:
        return
    texts = call.allgather(text)
    raise CollectiveMismatchError(_describe_mismatch(what, texts))


@contextmanager
def raise_together(*, comm: Any = None, timeout: Any = _deadline.DEFAULT) -> Iterator[None]:
    """Run a block of local checks; if it raises on any rank, raise on every rank.

    Collective: every rank enters and leaves the block. The exception type of the lowest failing
    rank is raised everywhere with a message naming the failing ranks, so validation written as
    ordinary ``raise`` statements becomes a collective decision. ``timeout`` (seconds, default
    :func:`mpinb.get_collective_timeout`, ``None`` waits forever) bounds the wait at the block's end
    for the other ranks; past it, :class:`CollectiveTimeout` is raised.

    Examples
    --------
    >>> with mpinb.raise_together():
    ...     X = np.asarray(X_local, dtype=float)
    ...     if not np.isfinite(X).all():
    ...         raise ValueError("X contains NaN or infinity")
    """
    comm = _resolve(comm)
    error: BaseException | None = None
    try:
        yield
    except Exception as err:  # noqa: BLE001 - re-raised below, on every rank
        error = err
    report = None if error is None else (type(error), str(error))
    with _deadline.begin(comm, "raise_together", timeout) as call:
        reports = call.allgather(report)
    failed = {rank: rep for rank, rep in enumerate(reports) if rep is not None}
    if not failed:
        return
    first_type = failed[min(failed)][0]
    message = _compose({rank: msg for rank, (_, msg) in failed.items()}, comm.Get_size())
    raised = _instantiate(first_type, message)
    if error is not None and type(error) is first_type:
        raise raised from error
    raise raised


def _is_int(value: Any) -> bool:
    """An integer argument (Python or NumPy), not a bool: the one rule every module checks with."""
    import numbers

    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _resolve(comm: Any) -> Any:
    if comm is None:
        from mpi4py import MPI

        return MPI.COMM_WORLD
    return comm


def _compose(failed: dict[int, str], size: int) -> str:
    """One message, identical on every rank, naming the ranks that failed."""
    ranks = sorted(failed)
    distinct = {failed[r] for r in ranks}
    if len(distinct) == 1:
        return f"{failed[ranks[0]]} [{_ranks_phrase(ranks, size)}]"
    parts = "; ".join(f"rank {r}: {failed[r]}" for r in ranks)
    return f"{parts} [{_ranks_phrase(ranks, size)}]"


def _ranks_phrase(ranks: list[int], size: int) -> str:
    if size == 1:
        return "on the only rank"
    if len(ranks) == size:
        return f"on all {size} ranks"
    label = "rank" if len(ranks) == 1 else "ranks"
    return f"on {label} {', '.join(map(str, ranks))} of {size}"


def _describe_mismatch(what: str, texts: list[str]) -> str:
    groups: dict[str, list[int]] = {}
    for rank, text in enumerate(texts):
        groups.setdefault(text, []).append(rank)
    shown = _clip_to_difference(list(groups))
    listing = "; ".join(
        f"{'rank' if len(r) == 1 else 'ranks'} {', '.join(map(str, r))}: {shown[t]}" for t, r in groups.items()
    )
    return f"{what} must be the same on every rank, but differs across {len(texts)} ranks ({listing})."


def _clip_to_difference(texts: list[str], width: int = 80) -> dict[str, str]:
    """Long descriptions (50 array shapes) are cut to a window around where they first differ."""
    if all(len(t) <= width for t in texts):
        return {t: t for t in texts}
    prefix = 0
    for chars in zip(*texts):
        if len(set(chars)) > 1:
            break
        prefix += 1
    start = max(0, prefix - width // 2)
    return {t: ("..." if start else "") + t[start : start + width] + ("..." if start + width < len(t) else "") for t in texts}


def _instantiate(kind: type[BaseException], message: str) -> BaseException:
    # Exception types whose constructor needs more than a message (rare) degrade to RuntimeError.
    try:
        return kind(message)
    except Exception:  # noqa: BLE001
        return RuntimeError(f"{kind.__name__}: {message}")
