"""What a fitted k-means model does with rows: shared by :class:`KMeans` and :class:`MiniBatchKMeans`.

``predict`` and ``transform`` are per-row functions of the centres, so on shards each rank gets
its own rows' answers with no communication (and a model pulled to the notebook client works
there); ``score`` sums over the ranks and is collective.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from mpinb import _collective
from mpinb._checks import default_comm
from mpinb._digest import digest
from mpinb._estimator import RankAware
from mpinb._inputs import as_data, as_weights, check_feature_names, check_fitted, check_width, raise_nonfinite
from mpinb.agreement import check_same, raise_together
from mpinb.kmeans._distances import column_sums, euclidean, local_inertia, nearest

__all__ = ["FittedCentres"]


class FittedCentres(RankAware):
    """Mixin: ``predict``, ``transform``, ``score`` and pickling for an estimator with
    ``cluster_centers_``, ``n_features_in_`` and a ``comm`` parameter."""

    # What the mixin reads of the estimator it is mixed into (declared for the type checker only).
    comm: Any
    cluster_centers_: np.ndarray
    n_features_in_: int
    if TYPE_CHECKING:
        def fit(self, X_local: Any, y: Any = None, sample_weight: Any = None) -> Any: ...

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

    def _check_input(self, X: Any) -> np.ndarray:
        check_fitted(self, "cluster_centers_")
        check_feature_names(self, X)
        X = as_data(X, "k-means")
        check_width(X, self.n_features_in_, self)
        if not np.isfinite(column_sums(X, len(self.cluster_centers_))).all():
            raise_nonfinite(X)
        return X
