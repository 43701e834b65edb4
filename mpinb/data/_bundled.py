"""scikit-learn's bundled data sets (no network), split like ``train_test_split`` and sharded."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from mpinb._checks import check_int, default_comm, is_int
from mpinb._digest import digest
from mpinb.agreement import check_same, raise_together
from mpinb.data._synthetic import shared_seed
from mpinb.shards import shard_bounds

__all__ = ["Split", "load_breast_cancer", "load_digits", "load_iris", "load_wine"]


class Split(NamedTuple):
    """A train/test split, unpacked like scikit-learn's ``train_test_split``.

    ``X_train, X_test, y_train, y_test = mpinb.data.load_digits()``. With ``shard=True`` each field
    holds this rank's rows only.
    """

    X_train: np.ndarray
    X_test: np.ndarray
    y_train: np.ndarray
    y_test: np.ndarray


def load_digits(
    *, shard: bool = True, test_size: float | int = 0.25, random_state: int | None = 0, comm: Any = None
) -> Split:
    """The 8×8 handwritten digits (1,797 samples, 64 features, 10 classes), split and sharded.

    Collective when ``shard=True``: every rank of ``comm`` calls it with the same arguments. Each
    rank reads the file that ships with scikit-learn (no network), makes the same stratified split
    as ``train_test_split(X, y, test_size=test_size, random_state=random_state, stratify=y)``, and
    keeps its :func:`~mpinb.shard_bounds` slice of the training and of the test set. A rank that
    cannot load the data, or whose data differ from the others' (different scikit-learn versions
    across nodes), makes every rank raise the same error. With ``shard=False`` it is local: nothing
    is communicated and the whole split is returned, so it is safe in the notebook client too.

    Parameters
    ----------
    shard : bool, default True
        Keep only this rank's rows of each part; ``False`` returns all rows.
    test_size : float or int, default 0.25
        Fraction (``0 < test_size < 1``) or number of samples held out for testing, as in
        scikit-learn.
    random_state : int or None, default 0
        Seed of the split. ``None`` draws a fresh seed on rank 0 and broadcasts it, so the ranks
        still agree.
    comm : mpi4py.MPI.Comm, optional
        Defaults to ``MPI.COMM_WORLD``; unused when ``shard=False``.

    Returns
    -------
    Split
        ``(X_train, X_test, y_train, y_test)``: float64 features of shape ``(n, 64)`` with pixel
        values 0–16, int64 labels 0–9.

    Examples
    --------
    >>> X_train, X_test, y_train, y_test = mpinb.data.load_digits()   # this rank's rows
    >>> km = mpinb.KMeans(n_clusters=10).fit(X_train)
    """
    return _bundled("load_digits", shard, test_size, random_state, comm)


def _loader(name: str, title: str, labels: str) -> Callable[..., Split]:
    """A loader like :func:`load_digits` for another bundled data set, with its own docstring."""

    def load(
        *, shard: bool = True, test_size: float | int = 0.25, random_state: int | None = 0, comm: Any = None
    ) -> Split:
        return _bundled(name, shard, test_size, random_state, comm)

    load.__name__ = load.__qualname__ = name
    load.__doc__ = f"""{title}, split and sharded.

    Collective when ``shard=True``; local with ``shard=False``. See :func:`load_digits` for the
    split, the sharding and the parameters.

    Returns
    -------
    Split
        ``(X_train, X_test, y_train, y_test)``; float64 features, int64 labels {labels}.
    """
    return load


load_iris = _loader("load_iris", "The iris flowers (150 samples, 4 features, 3 classes)", "0–2")
load_wine = _loader("load_wine", "The wine recognition data (178 samples, 13 features, 3 classes)", "0–2")
load_breast_cancer = _loader(
    "load_breast_cancer", "The Wisconsin breast cancer data (569 samples, 30 features, 2 classes)", "0–1"
)


def _bundled(name: str, shard: bool, test_size: float | int, random_state: int | None, comm: Any) -> Split:
    _check_test_size(test_size)
    if random_state is not None and check_int(random_state, "random_state", minimum=0) >= 1 << 32:
        raise ValueError(f"random_state must be < 2**32 (scikit-learn's limit); got {random_state}.")
    if not shard:
        return Split(*_load_and_split(name, test_size, random_state))
    comm = default_comm(comm)
    seed = shared_seed(random_state, True, comm)
    parts: tuple[np.ndarray, ...] = ()
    with raise_together(comm=comm):
        parts = _load_and_split(name, test_size, seed)
    if comm.Get_size() > 1:
        # The split is made independently on each rank; a different scikit-learn on another node
        # could ship different data or split differently, which would silently duplicate rows.
        check_same(digest(*parts), f"the {name} data and split (check scikit-learn versions)", comm=comm)
    rank, size = comm.Get_rank(), comm.Get_size()
    out = []
    for part in parts:
        start, stop = shard_bounds(len(part), rank=rank, size=size)
        out.append(part[start:stop].copy())
    return Split(*out)


def _load_and_split(name: str, test_size: float | int, seed: int | None) -> tuple[np.ndarray, ...]:
    import sklearn.datasets
    from sklearn.model_selection import train_test_split

    bunch = getattr(sklearn.datasets, name)()
    X = np.ascontiguousarray(bunch.data, dtype=np.float64)
    y = np.ascontiguousarray(bunch.target, dtype=np.int64)
    X_train, X_test, y_train, y_test = train_test_split(
        X, y, test_size=test_size, random_state=seed, stratify=y
    )
    return tuple(np.ascontiguousarray(a) for a in (X_train, X_test, y_train, y_test))


def _check_test_size(test_size: Any) -> None:
    if isinstance(test_size, bool):
        ok = False
    elif is_int(test_size):
        ok = bool(test_size >= 1)
    elif isinstance(test_size, (float, np.floating)):
        ok = bool(0.0 < test_size < 1.0)
    else:
        ok = False
    if not ok:
        raise ValueError(
            "test_size must be a fraction between 0 and 1 (exclusive) or a number of samples >= 1; "
            f"got {test_size!r}."
        )
