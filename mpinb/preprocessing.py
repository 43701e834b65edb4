"""Feature scaling of rows spread over MPI ranks: :class:`StandardScaler`, scikit-learn shaped.

Collective fit (each rank passes its own rows; two small Allreduces), local ``transform``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from sklearn.base import BaseEstimator, OneToOneFeatureMixin, TransformerMixin

from mpinb._checks import default_comm
from mpinb._constraints import Accepts, Flag, check_parameters, describe
from mpinb._estimator import RankAware, agree, set_feature_names
from mpinb._inputs import (
    as_data,
    as_weights,
    check_feature_names,
    check_fitted,
    check_width,
    feature_names,
    finite_sums,
)
from mpinb._moments import add_second, merge, moments
from mpinb.agreement import raise_together

__all__ = ["StandardScaler"]

_EPS = np.finfo(np.float64).eps


class StandardScaler(RankAware, OneToOneFeatureMixin, TransformerMixin, BaseEstimator):
    """Standardise features by removing the mean and scaling to unit variance, over rows spread
    over MPI ranks.

    Collective: every rank of ``comm`` constructs it with the same parameters and calls
    :meth:`fit` and :meth:`partial_fit` together, each passing only its own shard ``X_local``
    (possibly with zero rows); rows never move between ranks. A fit is two passes over the shard
    and two small Allreduces (the weighted column sums, then the centred second moments, about
    the global mean). :meth:`transform` and :meth:`inverse_transform` are local: each rank
    scales its own rows, and a fitted scaler pulled to the notebook client works there.

    It equals scikit-learn's ``StandardScaler`` fitted on the union of the shards (to float
    round-off, about 1e-15 relatively) and has its attributes, so it can stand ahead of
    :class:`mpinb.KMeans` in a scikit-learn ``Pipeline`` on every rank. Unlike scikit-learn, which
    ignores NaN in ``fit``, a NaN or infinity on any rank raises the same ``ValueError`` on every
    rank; ``transform`` lets them through as scikit-learn does.

    Parameters
    ----------
    copy : bool, default True
        If False, :meth:`transform` and :meth:`inverse_transform` scale a float array in place.
    with_mean : bool, default True
        Centre the data before scaling.
    with_std : bool, default True
        Scale the data to unit variance (population variance, ``ddof=0``, as scikit-learn).
    comm : mpi4py.MPI.Comm, optional
        The ranks that hold the data; ``MPI.COMM_WORLD`` when omitted (resolved at call time).
        It is not pickled with the estimator.

    Attributes
    ----------
    scale_ : ndarray of shape (n_features,) or None
        Per-feature scaling, ``sqrt(var_)``, with 1 for features whose variance is zero within
        round-off (as scikit-learn decides it); None when ``with_std=False``.
    mean_ : ndarray of shape (n_features,) or None
        The (weighted) mean of each feature over all ranks; None when ``with_mean`` and
        ``with_std`` are both False.
    var_ : ndarray of shape (n_features,) or None
        The (weighted) variance of each feature over all ranks; None when ``with_std=False``.
    n_features_in_ : int
        Number of features seen during :meth:`fit`.
    n_samples_seen_ : int or float
        Rows seen over all ranks (since :meth:`fit`, over every :meth:`partial_fit`); the sum of
        the weights, a float, once a call had ``sample_weight``.

    Examples
    --------
    >>> lo, hi = mpinb.shard_bounds(len(X), rank=comm.rank, size=comm.size)
    >>> scaler = mpinb.StandardScaler().fit(X[lo:hi])       # collective
    >>> X_scaled = scaler.transform(X[lo:hi])                # local: this rank's rows
    >>> np.allclose(scaler.mean_, X.mean(axis=0)), X_scaled.shape == (hi - lo, X.shape[1])
    (True, True)

    Ahead of k-means on every rank:

    >>> from sklearn.pipeline import make_pipeline
    >>> pipe = make_pipeline(mpinb.StandardScaler(), mpinb.KMeans(3, random_state=0)).fit(X[lo:hi])
    >>> pipe.predict(X[lo:hi]).shape == (hi - lo,)
    True
    """

    # Fitted attributes (set by fit; declared for the type checker, so ``hasattr`` still tells fitted).
    n_features_in_: int
    mean_: np.ndarray | None
    var_: np.ndarray | None
    _seen: Any

    _constraints: ClassVar[dict[str, Accepts]] = {
        "copy": Accepts(Flag()),
        "with_mean": Accepts(Flag()),
        "with_std": Accepts(Flag()),
    }

    def __init__(
        self, *, copy: bool = True, with_mean: bool = True, with_std: bool = True, comm: Any = None
    ) -> None:
        # Only stores the parameters, as scikit-learn's contract asks: fit checks them.
        self.copy = copy
        self.with_mean = with_mean
        self.with_std = with_std
        self.comm = comm

    def fit(self, X_local: Any, y: Any = None, sample_weight: Any = None) -> StandardScaler:
        """Compute the mean and standard deviation of the rows held by all ranks.

        Collective. Every rank passes its own shard (possibly with zero rows). Invalid input on
        any rank -- NaN or infinity, a different number of features or different parameters on
        another rank, no rows on any rank, a bad ``sample_weight`` -- raises the same exception
        on every rank.

        Parameters
        ----------
        X_local : array_like of shape (n_local_samples, n_features)
            This rank's rows; float32 data are accumulated in float64.
        y : None
            Ignored; present for scikit-learn's API.
        sample_weight : array_like of shape (n_local_samples,), optional
            Non-negative weight of each local row; ones when omitted.

        Returns
        -------
        StandardScaler
            ``self``, fitted, with the same attributes on every rank.
        """
        for name in ("mean_", "var_", "scale_", "n_samples_seen_", "n_features_in_", "_seen", "_weighted"):
            self.__dict__.pop(name, None)
        return self._update(X_local, sample_weight, "StandardScaler.fit")

    def partial_fit(self, X_local: Any, y: Any = None, sample_weight: Any = None) -> StandardScaler:
        """Update the mean and standard deviation with one more batch of rows on every rank.

        Collective, as :meth:`fit`; the batch is the union of every rank's ``X_local``, and the
        statistics equal those of one fit on every batch so far (Chan, Golub and LeVeque's
        update, as scikit-learn's). A rank may pass zero rows; every rank at once may not.

        Parameters
        ----------
        X_local : array_like of shape (n_local_samples, n_features)
            This rank's rows of the batch, of the fitted number of features.
        y : None
            Ignored.
        sample_weight : array_like of shape (n_local_samples,), optional
            Non-negative weight of each local row; ones when omitted.

        Returns
        -------
        StandardScaler
            ``self``, updated.
        """
        return self._update(X_local, sample_weight, "StandardScaler.partial_fit")

    def transform(self, X: Any, copy: bool | None = None) -> np.ndarray:
        """Standardise rows: ``(X - mean_) / scale_``.

        Local: no communication. On shards each rank passes its own rows.

        Parameters
        ----------
        X : array_like of shape (n_samples, n_features)
        copy : bool, optional
            Overrides the ``copy`` parameter.

        Returns
        -------
        ndarray of shape (n_samples, n_features)
            float32 for float32 rows, float64 otherwise.
        """
        X = self._rows(X, copy, names=True)
        if self.with_mean:
            X -= self.mean_
        if self.with_std:
            X /= self.scale_
        return X

    def inverse_transform(self, X: Any, copy: bool | None = None) -> np.ndarray:
        """Scale rows back to the original representation: ``X * scale_ + mean_``.

        Local: no communication.

        Parameters
        ----------
        X : array_like of shape (n_samples, n_features)
        copy : bool, optional
            Overrides the ``copy`` parameter.

        Returns
        -------
        ndarray of shape (n_samples, n_features)
        """
        X = self._rows(X, copy)
        if self.with_std:
            X *= self.scale_
        if self.with_mean:
            X += self.mean_
        return X

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.transformer_tags.preserves_dtype = ["float64", "float32"]
        return tags

    # ------------------------------------------------------------------------------------------

    def _update(self, X_local: Any, sample_weight: Any, method: str) -> StandardScaler:
        """The collective body of :meth:`fit` (after a reset) and :meth:`partial_fit`."""
        comm = default_comm(self.comm)
        fitted = hasattr(self, "n_samples_seen_")
        with raise_together(comm=comm):
            params = check_parameters(self, self._constraints)
            names = getattr(self, "feature_names_in_", None) if fitted else feature_names(X_local)
            if fitted:
                check_feature_names(self, X_local)
            X = as_data(X_local, "StandardScaler")
            weights = as_weights(sample_weight, X.shape[0])
            if fitted:
                check_width(X, self.n_features_in_, self, "X_local")
            local_sum = finite_sums(X, weights)
        agree(tuple((k, describe(v)) for k, v in params.items()), X.shape[1], "StandardScaler", comm=comm,
              names=names)
        with_mean, with_std = params["with_mean"], params["with_std"]
        batch = moments(X, weights, local_sum, comm=comm, name=method, what=method)
        if with_std:
            add_second(batch, X, weights, comm=comm, name=method)
        weighted = getattr(self, "_weighted", False) or weights is not None
        last = float(self._seen) if fitted else 0.0
        if not (with_mean or with_std):
            # Neither step needs a statistic; scikit-learn counts rows then, not weights.
            seen, mean, var = last + batch.n, None, None
        else:
            last_mean = self.mean_ if fitted and self.mean_ is not None else np.zeros(X.shape[1])
            last_m2 = None
            if with_std:
                last_m2 = self.var_ * last if fitted and self.var_ is not None else np.zeros(X.shape[1])
            seen, mean, m2 = merge(last, last_mean, last_m2, batch.weight, batch.mean, batch.m2)
            var = None if m2 is None else m2 / seen
        scale = None
        if var is not None:
            assert mean is not None
            # scikit-learn's rule for a feature indistinguishable from a constant: its variance
            # within the error bound of the two-pass algorithm; such a feature is not scaled.
            constant = var <= seen * _EPS * var + (seen * mean * _EPS) ** 2
            scale = np.sqrt(var)
            scale[constant] = 1.0
        self._seen = seen
        self._weighted = weighted
        self.mean_ = mean
        self.var_ = var
        self.scale_ = scale
        self.n_features_in_ = int(X.shape[1])
        set_feature_names(self, names)
        self.n_samples_seen_ = seen if weighted else int(seen)
        return self

    def _rows(self, X: Any, copy: bool | None, names: bool = False) -> np.ndarray:
        """``X`` as float rows of the fitted width, copied unless ``copy`` (or the parameter) is
        False and it already is a float array; with ``names``, its feature names checked as
        scikit-learn's ``transform`` does (its ``inverse_transform`` does not)."""
        check_fitted(self, "n_samples_seen_")
        if names:
            check_feature_names(self, X)
        original = X
        X = as_data(X, "StandardScaler")
        check_width(X, self.n_features_in_, self)
        # A converted array is already a copy; the input itself, or a view of it (a DataFrame's
        # values), is not.
        shared = X is original or X.base is not None
        if ((self.copy if copy is None else copy) and shared) or not X.flags.writeable:
            X = X.copy()
        return X
