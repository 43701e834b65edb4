"""Principal component analysis of rows spread over MPI ranks: :class:`PCA`, scikit-learn shaped.

Collective fit (each rank passes its own rows; two small Allreduces of the column sums and the
centred scatter matrix, and the eigendecomposition on rank 0), local ``transform``.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin

from mpinb import _collective
from mpinb._checks import default_comm
from mpinb._constraints import Accepts, Exactly, Flag, Fraction, Integer, check_parameters, describe
from mpinb._digest import digest
from mpinb._estimator import RankAware, agree, set_feature_names
from mpinb._inputs import as_data, check_feature_names, check_fitted, check_width, feature_names, finite_sums
from mpinb._moments import add_second, moments
from mpinb.agreement import check_same, raise_together

__all__ = ["PCA"]


class PCA(RankAware, ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """Principal component analysis of rows spread over MPI ranks, each rank keeping its own rows.

    Collective: every rank of ``comm`` constructs it with the same parameters and calls
    :meth:`fit` (and :meth:`score`) together, each passing only its own shard ``X_local``
    (possibly with zero rows); rows never move between ranks. A fit is two passes over the shard
    and two Allreduces of small summaries -- the column sums, then the ``n_features x
    n_features`` scatter matrix about the global mean (not a sum of raw squares, which loses the
    digits that matter when the mean is large next to the spread) -- then an eigendecomposition
    of the covariance on rank 0, broadcast so every rank holds the same components. This is
    scikit-learn's ``svd_solver="covariance_eigh"``, with its signs (the largest entry of each
    component is positive); it suits data with many more rows than features (its memory and work
    beyond the pass over the rows grow as ``n_features**2`` and ``n_features**3``).
    :meth:`transform`, :meth:`inverse_transform` and :meth:`score_samples` are local.

    Fitted on shards, it equals scikit-learn's ``PCA`` fitted on the union of the shards: the
    components up to round-off (relative to the gap between neighbouring variances) and the
    variances to about 1e-12 of the largest. A singular value is the square root of a variance,
    so one that is zero in exact arithmetic (more components than the centred rows' rank) comes
    out near ``1e-8`` times the largest rather than near ``1e-16``.

    Parameters
    ----------
    n_components : int, float or None, default None
        Components to keep. An int from 0 to ``min(n_samples, n_features)`` (``n_samples`` over
        all ranks); a float strictly between 0 and 1, the fewest components whose explained
        variance exceeds that fraction of the total; None, ``min(n_samples, n_features)``.
    copy : bool, default True
        Kept for scikit-learn's API: the rows are never modified.
    whiten : bool, default False
        Scale the projections to unit variance (divide by ``sqrt(explained_variance_)``).
    comm : mpi4py.MPI.Comm, optional
        The ranks that hold the data; ``MPI.COMM_WORLD`` when omitted (resolved at call time).
        It is not pickled with the estimator.

    Attributes
    ----------
    components_ : ndarray of shape (n_components, n_features)
        Principal axes, by decreasing explained variance, identical on every rank (float32 only
        when every rank passed float32 rows).
    explained_variance_ : ndarray of shape (n_components,)
        Variance along each component (with ``n_samples - 1`` degrees of freedom).
    explained_variance_ratio_ : ndarray of shape (n_components,)
        Fraction of the total variance along each component.
    singular_values_ : ndarray of shape (n_components,)
        Singular values of the centred data of all ranks.
    mean_ : ndarray of shape (n_features,)
        Mean of each feature over all ranks.
    n_components_ : int
        Components kept.
    n_samples_ : int
        Rows over all ranks.
    noise_variance_ : float
        Mean of the variances left out (probabilistic PCA's noise), 0 when none are.
    n_features_in_ : int
        Number of features seen during :meth:`fit`.

    Examples
    --------
    >>> lo, hi = mpinb.shard_bounds(len(X), rank=comm.rank, size=comm.size)
    >>> pca = mpinb.PCA(n_components=0.95).fit(X[lo:hi])     # collective
    >>> Z = pca.transform(X[lo:hi])                          # local: this rank's rows
    >>> Z.shape == (hi - lo, pca.n_components_)
    True
    """

    # Fitted attributes (set by fit; declared for the type checker, so ``hasattr`` still tells fitted).
    components_: np.ndarray
    mean_: np.ndarray
    explained_variance_: np.ndarray

    _constraints: ClassVar[dict[str, Accepts]] = {
        "n_components": Accepts(Exactly(None), Integer(minimum=0), Fraction()),
        "copy": Accepts(Flag()),
        "whiten": Accepts(Flag()),
    }

    def __init__(self, n_components: int | float | None = None, *, copy: bool = True, whiten: bool = False,
                 comm: Any = None) -> None:
        # Only stores the parameters, as scikit-learn's contract asks: fit checks them.
        self.n_components = n_components
        self.copy = copy
        self.whiten = whiten
        self.comm = comm

    def fit(self, X_local: Any, y: Any = None) -> PCA:
        """Fit the principal components of the rows held by all ranks.

        Collective. Every rank passes its own shard (possibly with zero rows). Invalid input on
        any rank -- NaN or infinity, a different number of features or different parameters on
        another rank, fewer than 2 rows over all ranks, ``n_components`` above ``min(n_samples,
        n_features)`` -- raises the same exception on every rank.

        Parameters
        ----------
        X_local : array_like of shape (n_local_samples, n_features)
            This rank's rows; float32 data are accumulated in float64.
        y : None
            Ignored; present for scikit-learn's API.

        Returns
        -------
        PCA
            ``self``, fitted, with the same attributes on every rank.
        """
        comm = default_comm(self.comm)
        with raise_together(comm=comm):
            params = check_parameters(self, self._constraints)
            names = feature_names(X_local)
            X = as_data(X_local, "PCA")
            local_sum = finite_sums(X)
        agree(tuple((k, describe(v)) for k, v in params.items()), X.shape[1], "PCA", comm=comm, names=names)
        n_features = X.shape[1]
        first = moments(X, None, local_sum, comm=comm, name="PCA.fit", what="PCA.fit")
        # Decided on reduced values, identical on every rank, before the second pass.
        n_samples, wanted = first.n, params["n_components"]
        if n_samples < 2:
            raise ValueError(
                f"PCA needs at least 2 samples over all ranks to estimate a variance; got {n_samples}."
            )
        if isinstance(wanted, int) and wanted > min(n_samples, n_features):
            raise ValueError(
                f"n_components must be <= min(n_samples, n_features) = min({n_samples:,}, {n_features}) = "
                f"{min(n_samples, n_features):,}; got {wanted:,}."
            )
        data = add_second(first, X, None, outer=True, comm=comm, name="PCA.fit")
        assert data.m2 is not None
        from mpinb.comm import on_root

        # On rank 0 and broadcast: LAPACK's eigenvectors are the same bits on every rank only
        # when every rank runs the same LAPACK on the same CPU.
        variances, axes = on_root(_spectrum, data.m2, n_samples, comm=comm)
        rank_bound = min(n_samples, n_features)
        variances = variances[:rank_bound]  # the rest are zero: the centred data have rank < n_samples
        total = variances.sum()
        ratio = variances / total if total > 0 else np.zeros_like(variances)
        if wanted is None:
            k = rank_bound
        elif isinstance(wanted, float):
            # The fewest components whose cumulated ratio exceeds the fraction, as scikit-learn.
            k = min(int(np.searchsorted(np.cumsum(ratio), wanted, side="right")) + 1, rank_bound)
        else:
            k = wanted
        out = np.float32 if data.all_float32 else np.float64
        self.noise_variance_ = float(variances[k:].mean()) if k < rank_bound else 0.0
        self.n_samples_ = n_samples
        self.n_components_ = int(k)
        self.mean_ = data.mean.astype(out)
        self.components_ = np.ascontiguousarray(axes[:k]).astype(out)
        self.explained_variance_ = variances[:k].astype(out)
        self.explained_variance_ratio_ = ratio[:k].astype(out)
        self.singular_values_ = np.sqrt(variances[:k] * (n_samples - 1)).astype(out)
        self.n_features_in_ = int(n_features)
        set_feature_names(self, names)
        return self

    def transform(self, X: Any) -> np.ndarray:
        """Project rows on the principal components: ``(X - mean_) @ components_.T``, divided by
        ``sqrt(explained_variance_)`` when ``whiten``.

        Local: no communication. On shards each rank passes its own rows.

        Parameters
        ----------
        X : array_like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples, n_components)
        """
        X = self._rows(X)
        Z = X @ self.components_.T
        Z -= self.mean_ @ self.components_.T
        if self.whiten:
            Z /= self._whitening()
        return Z

    def inverse_transform(self, X: Any) -> np.ndarray:
        """Rows back in the original space: ``X @ components_ + mean_`` (undoing the whitening).

        Local: no communication.

        Parameters
        ----------
        X : array_like of shape (n_samples, n_components)

        Returns
        -------
        ndarray of shape (n_samples, n_features)
        """
        check_fitted(self, "components_")
        Z = as_data(X, "PCA") if self.n_components_ else np.asarray(X, dtype=np.float64).reshape(-1, 0)
        check_width(Z, self.n_components_, self, "X (projected rows)")
        axes = self.components_
        if self.whiten:
            axes = np.sqrt(self.explained_variance_)[:, None] * axes
        return Z @ axes + self.mean_

    def get_covariance(self) -> np.ndarray:
        """The data covariance of the generative model, ``components_.T @ diag(explained_variance_
        - noise_variance_) @ components_ + noise_variance_ * I``.

        Local.

        Returns
        -------
        ndarray of shape (n_features, n_features)
        """
        check_fitted(self, "components_")
        axes, excess = self._excess()
        cov = (axes.T * excess) @ axes
        cov.flat[:: cov.shape[0] + 1] += self.noise_variance_
        return cov

    def get_precision(self) -> np.ndarray:
        """The inverse of :meth:`get_covariance`, by the matrix inversion lemma.

        Local.

        Returns
        -------
        ndarray of shape (n_features, n_features)
        """
        check_fitted(self, "components_")
        d = self.n_features_in_
        noise = self.noise_variance_
        if self.n_components_ == 0:
            return np.eye(d) / noise
        if noise == 0.0:
            return np.linalg.inv(self.get_covariance())
        axes, excess = self._excess()
        # (noise I + A' diag(e) A)^-1 = I/noise - A' (diag(1/e) + A A'/noise)^-1 A / noise^2
        inner = axes @ axes.T / noise
        inner.flat[:: inner.shape[0] + 1] += 1.0 / excess
        precision = axes.T @ np.linalg.inv(inner) @ axes
        precision /= -(noise**2)
        precision.flat[:: d + 1] += 1.0 / noise
        return precision

    def score_samples(self, X: Any) -> np.ndarray:
        """The log-likelihood of each row under the probabilistic PCA model.

        Local: no communication.

        Parameters
        ----------
        X : array_like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples,)
        """
        return self._log_likelihood(self._rows(X))

    def _log_likelihood(self, X: np.ndarray) -> np.ndarray:
        centred = X - self.mean_
        precision = self.get_precision()
        sign, logdet = np.linalg.slogdet(precision)
        if sign <= 0:
            logdet = -np.inf
        log_like = -0.5 * np.einsum("ij,ij->i", centred, centred @ precision)
        log_like -= 0.5 * (X.shape[1] * math.log(2.0 * math.pi) - logdet)
        return log_like

    def score(self, X_local: Any, y: Any = None) -> float:
        """The average log-likelihood of all ranks' rows under the probabilistic PCA model.

        Collective over ``comm``: every rank passes its own rows (possibly none) and gets the
        same value, the mean over every rank's rows. Bad input on any rank (NaN, a wrong number
        of features) raises the same error on every rank, and so does a model that differs
        between ranks.

        Parameters
        ----------
        X_local : array_like of shape (n_local_samples, n_features)
        y : None
            Ignored.

        Returns
        -------
        float
        """
        comm = default_comm(self.comm)
        with raise_together(comm=comm):
            X = self._rows(X_local)
            finite_sums(X)
            local = self._log_likelihood(X)
        # A rank scoring another model (refitted alone, say) would add a meaningless term.
        model = digest(self.components_, self.mean_, self.explained_variance_,
                       np.float64(self.noise_variance_))
        check_same(model, "the PCA's fitted model (a digest)", comm=comm)
        totals = np.array([local.sum(), local.size], dtype=np.float64)
        _collective.reduce_in_place([totals], comm=comm, name="PCA.score")
        if totals[1] == 0:
            raise ValueError("PCA.score got 0 rows on every rank; pass at least one row on some rank.")
        return float(totals[0] / totals[1])

    @property
    def _n_features_out(self) -> int:
        """Number of transformed output features (for ``get_feature_names_out``)."""
        return int(self.components_.shape[0])

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.transformer_tags.preserves_dtype = ["float64", "float32"]
        return tags

    # ------------------------------------------------------------------------------------------

    def _rows(self, X: Any) -> np.ndarray:
        check_fitted(self, "components_")
        check_feature_names(self, X)
        X = as_data(X, "PCA")
        check_width(X, self.n_features_in_, self)
        return X

    def _whitening(self) -> np.ndarray:
        scale = np.sqrt(self.explained_variance_)
        eps = np.finfo(scale.dtype).eps
        return np.maximum(scale, eps)

    def _excess(self) -> tuple[np.ndarray, np.ndarray]:
        """The components (scaled when whitened, as scikit-learn) and the variances above the
        noise, clipped at 0."""
        axes = self.components_.astype(np.float64)
        variances = self.explained_variance_.astype(np.float64)
        if self.whiten:
            axes = axes * np.sqrt(variances)[:, None]
        return axes, np.maximum(variances - self.noise_variance_, 0.0)


def _spectrum(scatter: np.ndarray, n_samples: int) -> tuple[np.ndarray, np.ndarray]:
    """The covariance's eigenvalues (descending, clipped at 0) and eigenvectors (rows), each with
    its largest entry positive, as scikit-learn's ``svd_flip`` on ``Vt``."""
    values, vectors = np.linalg.eigh(scatter / (n_samples - 1))
    values = values[::-1].copy()
    axes = vectors[:, ::-1].T.copy()
    values[values < 0.0] = 0.0  # round-off of a positive semi-definite matrix
    biggest = np.argmax(np.abs(axes), axis=1)
    signs = np.sign(axes[np.arange(axes.shape[0]), biggest])
    axes *= signs[:, None]
    return values, axes
