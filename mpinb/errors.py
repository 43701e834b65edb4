"""mpinb's error types. The decisions that raise them on every rank live in :mod:`mpinb.agreement`."""

from __future__ import annotations

__all__ = ["CollectiveAbandoned", "CollectiveMismatchError", "CollectiveTimeout"]


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
