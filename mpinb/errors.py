"""Error types and collective error decisions: the same exception on every rank."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from mpinb import deadline as _deadline

__all__ = [
    "CollectiveAbandoned",
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

    Raised on each rank whose deadline passed, naming the operation (``allreduce #12``: the 12th
    mpinb collective since mpinb last moved to a fresh communicator), the missing ranks and where
    each of them was (its last mpinb collective, or the one it is in). The ranks waiting with it
    raise :class:`CollectiveAbandoned`; every rank then moves to a fresh private communicator, so
    the next collective works once every rank calls it, with the engines' state intact.

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


class CollectiveAbandoned(RuntimeError):
    """Another rank gave up on the collective this rank was waiting in.

    Raised on each rank that was waiting when a rank's deadline passed or it was interrupted;
    names who gave up on which collective, and why. mpinb then moves every rank to a fresh
    communicator, so the next collective works once every rank calls it.

    Attributes
    ----------
    operation : str or None
        The collective this rank was waiting in.
    by : int or None
        The rank that gave up.
    reason : str
        Why it gave up ("timed out after 2 s", "was interrupted (KeyboardInterrupt)").
    rank : int or None
        The rank that raised it.
    """

    def __init__(self, message: str, *, operation: str | None = None, by: int | None = None, reason: str = "",
                 rank: int | None = None) -> None:
        super().__init__(message)
        self.operation, self.by, self.reason, self.rank = operation, by, reason, rank


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
    from mpinb import _collective

    with _collective.collective(comm, "check_all", timeout=timeout, votes=(0 if ok else 1, 0)) as op:
        if not op.votes[0]:
            return
        verdicts = op.allgather(None if ok else str(message))
        failed = {rank: msg for rank, msg in enumerate(verdicts) if msg is not None}
        op.fail(exc(_compose(failed, op.size)))


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
    from mpinb import _collective

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
    from mpinb import _collective

    error: BaseException | None = None
    try:
        yield
    except Exception as err:  # noqa: BLE001 - re-raised below, on every rank
        error = err
    with _collective.collective(comm, "raise_together", timeout=timeout, votes=(int(error is not None), 0)) as op:
        if not op.votes[0]:
            return
        reports = op.allgather(None if error is None else _record(error))
        failed = {rank: rep for rank, rep in enumerate(reports) if rep is not None}
        first = failed[min(failed)]
        message = _compose({rank: text for rank, (_, _, text) in failed.items()}, op.size)
        raised = agree_on_exception(op, first[0], first[1], message)
        if error is not None and _record(error)[:2] == first[:2]:
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


def _is_int(value: Any) -> bool:
    """An integer argument (Python or NumPy), not a bool: the one rule every module checks with."""
    import numbers

    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


_BOUNDS = {None: "an integer", 0: "a non-negative integer", 1: "a positive integer"}


def _check_int(value: Any, name: str, *, minimum: int | None = None, unit: str = "", alternative: str = "") -> int:
    """The one integer-argument check: ``value`` as an ``int``, or an error naming the argument.

    Local and deterministic, so it fails the same way on every rank. Not an integer (bools are
    not) is a ``TypeError``; one below ``minimum`` a ``ValueError``; both say what was expected,
    e.g. "every must be a positive integer number of epochs; got 0."; ``alternative`` names what
    else the argument accepts ("'auto'").
    """
    bound = _BOUNDS.get(minimum, f"an integer >= {minimum}")
    message = f"{name} must be {alternative + ' or ' if alternative else ''}{bound}{' ' + unit if unit else ''}; got {value!r}."
    if not _is_int(value):
        raise TypeError(message)
    if minimum is not None and value < minimum:
        raise ValueError(message)
    return int(value)


def _digest(value: Any) -> str:
    """The digest of an array or a ``RandomState``'s state, for agreement checks (one rule:
    :func:`mpinb._digest.digest`). Local."""
    from mpinb._digest import digest

    return digest(value)


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


def _record(error: BaseException) -> tuple[str, str, str]:
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
