"""What a fitted k-means model does with rows: shared by :class:`KMeans` and :class:`MiniBatchKMeans`.

``predict`` and ``transform`` are per-row functions of the centres, so on shards each rank gets
its own rows' answers with no communication (and a model pulled to the notebook client works
there); ``score`` sums over the ranks and is collective.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.exceptions import NotFittedError

from mpinb import _collective
from mpinb._checks import default_comm
from mpinb._digest import digest
from mpinb.agreement import check_same, raise_together
from mpinb.kmeans._distances import column_sums, euclidean, local_inertia, nearest
from mpinb.kmeans._kernels import chunk_rows, chunks

__all__ = ["FittedCentres", "as_data", "as_weights", "raise_nonfinite"]


class FittedCentres:
    """Mixin: ``predict``, ``transform``, ``score`` and pickling for an estimator with
    ``cluster_centers_``, ``n_features_in_`` and a ``comm`` parameter."""

    def predict(self, X: Any) -> np.ndarray:
        """The index of the nearest centre of each row.

        Local: no communication. On shards, each rank passes its own rows and gets their labels
        (concatenated in rank order they are the labels of all rows); it is also safe on some
        ranks only, or on the notebook client for a pulled model.

        Parameters
        ----------
        X : array_like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples,), int32
        """
        X = self._check_input(X)
        return nearest(X, np.asarray(self.cluster_centers_, dtype=np.float64))

    def transform(self, X: Any) -> np.ndarray:
        """Euclidean distances of each row to every centre.

        Local: no communication, like :meth:`predict`. The result is (n_samples, n_clusters) by
        nature; it is computed in chunks, one GEMM each as scikit-learn's
        ``euclidean_distances``, with the distances that are small next to the norms recomputed
        from the differences, so a row equal to a centre is at distance exactly 0
        (``transform(cluster_centers_)`` has a zero diagonal).

        Parameters
        ----------
        X : array_like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples, n_clusters)
        """
        X = self._check_input(X)
        return euclidean(X, np.asarray(self.cluster_centers_, dtype=np.float64))

    def fit_transform(self, X_local: Any, y: Any = None, sample_weight: Any = None) -> np.ndarray:
        """Fit, then return the distances of this rank's rows to every centre.

        Collective: it calls ``fit``.
        """
        return self.fit(X_local, sample_weight=sample_weight).transform(X_local)

    def fit_predict(self, X_local: Any, y: Any = None, sample_weight: Any = None) -> np.ndarray:
        """Fit and return this rank's labels.

        Collective: it calls ``fit``.

        Returns
        -------
        ndarray of shape (n_local_samples,)
            ``labels_``.
        """
        return self.fit(X_local, sample_weight=sample_weight).labels_

    def score(self, X_local: Any, y: Any = None, sample_weight: Any = None) -> float:
        """Opposite of the inertia of all ranks' rows with respect to the fitted centres.

        Collective over ``comm``: every rank passes its own rows (possibly none) and gets the
        same value, summed over ranks. Bad input on any rank (NaN, a wrong number of features,
        a bad ``sample_weight``) raises the same error on every rank.

        Parameters
        ----------
        X_local : array_like of shape (n_local_samples, n_features)
        y : None
            Ignored.
        sample_weight : array_like of shape (n_local_samples,), optional

        Returns
        -------
        float
            ``-sum(weight * squared distance to the nearest centre)`` over all ranks.
        """
        comm = default_comm(self.comm)
        name = type(self).__name__
        with raise_together(comm=comm):
            X = self._check_input(X_local)
            weights = as_weights(sample_weight, X.shape[0])
            centers = np.asarray(self.cluster_centers_, dtype=np.float64)
            local = local_inertia(X, weights, centers, nearest(X, centers))
        # A rank scoring another model (refitted alone, say) would add a meaningless term.
        check_same(digest(centers), f"the {name}'s cluster_centers_ (a digest)", comm=comm)
        total = np.array([local])
        _collective.reduce_in_place([total], comm=comm, name=f"{name}.score")
        return -float(total[0])

    def __getstate__(self) -> dict[str, Any]:
        # A communicator belongs to the processes that created it; a pickled model (pulled to the
        # notebook client, say) keeps arrays and scalars only and uses COMM_WORLD if refitted.
        state = super().__getstate__()
        state["comm"] = None
        state.pop("_on_iteration", None)
        return state

    def _check_input(self, X: Any) -> np.ndarray:
        if not hasattr(self, "cluster_centers_"):
            raise NotFittedError(
                f"This {type(self).__name__} instance is not fitted yet. Call 'fit' with "
                "appropriate arguments before using this estimator."
            )
        X = as_data(X)
        if X.shape[1] != self.n_features_in_:
            raise ValueError(
                f"X has {X.shape[1]} features, but {type(self).__name__} was fitted with "
                f"{self.n_features_in_} features."
            )
        if not np.isfinite(column_sums(X, len(self.cluster_centers_))).all():
            raise_nonfinite(X)
        return X


def as_data(X: Any) -> np.ndarray:
    """A 2-D float32 or float64 array of rows, or the error that says what is wrong. Local."""
    if hasattr(X, "tocsr") or hasattr(X, "toarray"):
        raise TypeError("mpinb's k-means needs a dense array; sparse input is not supported.")
    arr = np.asarray(X)
    if arr.ndim != 2:
        raise ValueError(
            f"X_local must be a 2-D array of shape (n_local_samples, n_features); got shape "
            f"{arr.shape}. A rank without rows passes an array of shape (0, n_features)."
        )
    if arr.shape[1] == 0:
        raise ValueError("X_local has 0 features; k-means needs at least one column.")
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"X_local must hold real numbers; got dtype {arr.dtype}.")
    if arr.dtype not in (np.float32, np.float64):
        arr = arr.astype(np.float64)
    return arr


def as_weights(sample_weight: Any, n: int) -> np.ndarray | None:
    """``None`` for unit weights, else one finite non-negative float64 weight per row. Local."""
    if sample_weight is None:
        return None
    w = np.asarray(sample_weight)
    if w.dtype.kind not in "biuf":
        raise TypeError(f"sample_weight must hold real numbers; got dtype {w.dtype}.")
    w = w.astype(np.float64).reshape(-1) if w.ndim <= 1 else w
    if w.ndim != 1 or w.shape[0] != n:
        raise ValueError(
            f"sample_weight has shape {np.shape(sample_weight)}, but X_local has {n} rows; pass one "
            "weight per local row."
        )
    if n and not np.isfinite(w).all():
        raise ValueError("sample_weight must be finite and non-negative; it contains NaN or infinity.")
    if n and w.min() < 0:
        raise ValueError(f"sample_weight must be finite and non-negative; got a minimum of {w.min()}.")
    return w


def raise_nonfinite(X: np.ndarray) -> None:
    """Raise the error naming the first non-finite value of ``X`` (or the overflowing sum)."""
    for s, e in chunks(X.shape[0], chunk_rows(X.shape[1])):
        bad = ~np.isfinite(X[s:e])
        if bad.any():
            row = s + int(np.flatnonzero(bad.any(axis=1))[0])
            kind = "NaN" if np.isnan(X[s:e]).any() else "infinity"
            raise ValueError(
                f"X_local contains {kind} (first at local row {row}); remove or impute non-finite "
                "values before fitting."
            )
    # The sum overflowed although every value is finite.
    raise ValueError(
        "X_local's column sums overflow float64; rescale the data (for example divide by its "
        "largest absolute value) before fitting."
    )
