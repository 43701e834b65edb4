"""What every k-means estimator of mpinb shares before it iterates: its declared parameters and
the fit prologue (checks of the parameters and rows on every rank, agreement across ranks, the
shard's summary and the generator).

Private to :mod:`mpinb.kmeans`. A new estimator is a subclass: it extends
``_constraints`` and ``_Params`` and calls :meth:`KMeansBase._prologue` first.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import numpy as np
from sklearn.base import BaseEstimator, ClusterMixin, TransformerMixin

from mpinb import _collective
from mpinb._checks import default_comm
from mpinb._constraints import (
    NOT_MINE,
    Accepts,
    Callables,
    Exactly,
    Instance,
    Integer,
    Invalid,
    Options,
    Real,
    Rule,
    Seed,
    check_parameters,
    describe,
)
from mpinb._estimator import agree
from mpinb._fit_callbacks import CallbackSupport
from mpinb._inputs import as_data, as_weights, check_feature_names, check_width, feature_names, raise_nonfinite
from mpinb._rows import RowMap
from mpinb.agreement import raise_together
from mpinb.kmeans._distances import column_sums
from mpinb.kmeans._fitted import FittedCentres
from mpinb.kmeans._init import resolve_random_state
from mpinb.kmeans._shard import KMeansShard, kmeans_shard

__all__ = ["KMeansBase", "KMeansParams", "Start"]


class Centres(Rule):
    """An array of initial centres, copied to float64 and required finite (its shape is checked
    against the data in :func:`checked_rows`)."""

    description = "an array of shape (n_clusters, n_features)"

    def take(self, value: Any) -> Any:
        if isinstance(value, str) or callable(value):
            return NOT_MINE
        try:
            init = np.array(value, dtype=np.float64, copy=True)
        except (TypeError, ValueError) as err:
            raise Invalid(got=f"{type(value).__name__} ({err})") from None
        if not np.isfinite(init).all():
            raise Invalid("init contains NaN or infinity; pass finite initial centres.")
        return init


@dataclass(frozen=True)
class KMeansParams:
    """The validated hyper-parameters every k-means estimator has (``n_init`` resolved)."""

    n_clusters: int
    init: str | Callable[..., Any] | np.ndarray
    n_init: int
    max_iter: int
    tol: float
    random_state: Any  # None, an int seed or a numpy.random.RandomState, as given

    def describe(self) -> tuple[Any, ...]:
        """A description that is equal on two ranks exactly when their parameters are (for
        ``check_same``): arrays and generators by digest, functions by name."""
        return tuple((f.name, describe(getattr(self, f.name))) for f in fields(self))


@dataclass
class Start:
    """What a fit begins with after the prologue, identical in meaning on every rank."""

    comm: Any
    params: Any  # the estimator's _Params
    X: np.ndarray
    weights: np.ndarray | None
    data: KMeansShard | None  # None when resuming a fitted model (partial_fit)
    layout: RowMap
    rng: np.random.RandomState
    names: np.ndarray | None = None  # the feature names of X_local (the same on every rank), or none

    @property
    def shard(self) -> KMeansShard:
        """The summarised shard of a fit that starts afresh (not a resumed ``partial_fit``)."""
        assert self.data is not None, "a resumed partial_fit has no summarised shard"
        return self.data


class KMeansBase(FittedCentres, CallbackSupport, ClusterMixin, TransformerMixin, BaseEstimator):
    """Base of mpinb's k-means estimators: declared parameters, the one fit prologue, (from
    :class:`FittedCentres`) ``predict``, ``transform``, ``score`` and pickling, and with
    scikit-learn 1.9 or later its callbacks' ``set_callbacks`` (see :mod:`mpinb._fit_callbacks`)."""

    # What each hyper-parameter accepts, checked in this order; subclasses extend it.
    _constraints: ClassVar[dict[str, Accepts]] = {
        "n_clusters": Accepts(Integer(minimum=1)),
        "init": Accepts(
            Options("k-means++", "k-means||", "random"), Centres(), Callables(), wrong_type=ValueError
        ),
        "n_init": Accepts(Options("auto"), Integer(minimum=1)),
        "max_iter": Accepts(Integer(minimum=1)),
        "tol": Accepts(Real(minimum=0), wrong_type=ValueError),
        "random_state": Accepts(
            Exactly(None), Seed(), Instance(np.random.RandomState, "a numpy.random.RandomState"),
            wrong_type=ValueError,
        ),
    }
    _Params: ClassVar[type[KMeansParams]] = KMeansParams
    # n_init="auto" for a random or callable init: scikit-learn's KMeans says 10, MiniBatchKMeans 3.
    _auto_runs: ClassVar[int] = 10

    # Hook point for tests and live progress: called on every rank after each iteration's (or
    # mini-batch's) reduction with a dict of its reduced values. Not a constructor parameter, so
    # sklearn's clone() drops it.
    _on_iteration: Callable[[dict[str, Any]], None] | None = None

    def __init__(
        self, n_clusters: int, *, init: Any, n_init: int | str, max_iter: int, tol: float, random_state: Any,
        comm: Any,
    ) -> None:
        # Only stores the parameters, as scikit-learn's contract asks: fit checks them.
        self.n_clusters = n_clusters
        self.init = init
        self.n_init = n_init
        self.max_iter = max_iter
        self.tol = tol
        self.random_state = random_state
        self.comm = comm

    def _prologue(self, X_local: Any, sample_weight: Any, method: str, *, resume: bool = False) -> Start:
        """The checks and set-up every fit begins with. Collective.

        Parameters and rows are checked locally and decided together (one error, on every rank),
        then the parameters and the number of features are checked to agree across ranks, and the
        shard is summarised (``Shard``) for a fit named ``method`` (``"KMeans.fit"``, which names
        its collectives). With ``resume`` (``partial_fit`` of a fitted model) the rows must have
        the fitted number of features, only their counts per rank are gathered, and the model's
        own generator carries on.
        """
        comm = default_comm(self.comm)
        name = type(self).__name__
        fitted = resume and hasattr(self, "cluster_centers_")
        with raise_together(comm=comm):
            params = self._validated_params()
            names = feature_names(X_local)
            if fitted:
                check_feature_names(self, X_local)
            X, weights, local_sum = checked_rows(X_local, sample_weight, None if fitted else params)
            if fitted:
                check_width(X, self.n_features_in_, self, "X_local")
        # A resumed fit has checked the width (and names) against the fitted model's on every rank.
        agree(params.describe(), None if fitted else X.shape[1], name, comm=comm, names=names)
        data = None
        if fitted:
            layout = RowMap(_rows_per_rank(X, comm, method), comm)
        else:
            data = kmeans_shard(
                X, weights, local_sum, n_clusters=params.n_clusters, init=params.init, comm=comm, name=method
            )
            layout = data.layout
        rng = getattr(self, "_random_state", None) if resume else None
        if rng is None:
            rng = resolve_random_state(self.random_state, comm, method)
        return Start(comm, params, X, weights, data, layout, rng, getattr(self, "feature_names_in_", None)
                     if fitted else names)

    def _validated_params(self) -> KMeansParams:
        """Local checks of the hyper-parameters, with the messages users see on every rank."""
        values = check_parameters(self, self._constraints)
        init = values["init"]
        if values["n_init"] == "auto":
            # As scikit-learn: several runs where each start is a fresh random draw.
            drawn = callable(init) or (isinstance(init, str) and init == "random")
            values["n_init"] = self._auto_runs if drawn else 1
        if isinstance(init, np.ndarray) and values["n_init"] != 1:
            warnings.warn(
                "Explicit initial center position passed: performing only one init in "
                f"{type(self).__name__} instead of n_init={values['n_init']}.",
                RuntimeWarning,
                stacklevel=4,  # the user's call of fit: here <- _prologue <- fit <- user
            )
            values["n_init"] = 1
        return self._Params(**values)


def checked_rows(
    X_local: Any, sample_weight: Any, params: KMeansParams | None
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """This rank's rows, weights and float64 column sums, or the local error (run it inside
    ``raise_together``); with ``params``, an array ``init`` is checked against the rows' width."""
    X = as_data(X_local, "k-means")
    weights = as_weights(sample_weight, X.shape[0])
    k, init = (1, None) if params is None else (params.n_clusters, params.init)
    if isinstance(init, np.ndarray) and init.shape != (k, X.shape[1]):
        raise ValueError(
            f"init has shape {init.shape}, but it must be (n_clusters, n_features) = ({k}, {X.shape[1]})."
        )
    # The column sums give the mean and, being non-finite exactly when some value is, the check.
    local_sum = column_sums(X, k)
    if not np.isfinite(local_sum).all():
        raise_nonfinite(X)
    return X, weights, local_sum


def _rows_per_rank(X: np.ndarray, comm: Any, method: str) -> np.ndarray:
    """Rows per rank of a ``partial_fit`` call (one small collective); an empty union raises."""
    counts = np.array(
        _collective.allgather(X.shape[0], comm=comm, name=f"{method}'s batch size"),
        dtype=np.int64,
    )
    if counts.sum() == 0:
        raise ValueError("partial_fit got 0 rows on every rank; pass at least one row on some rank.")
    return counts
