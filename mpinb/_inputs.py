"""Rows and weights as every estimator of mpinb takes them: checked on one rank, with the
messages users see.

Local and deterministic. A fit runs these checks inside :func:`mpinb.raise_together`, so one
rank's bad input raises the same error on every rank; ``transform`` and ``predict`` of a fitted
model run them alone (they are local too).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mpinb._chunks import chunk_rows, chunks

__all__ = ["as_data", "as_weights", "check_fitted", "check_width", "finite_sums", "raise_nonfinite"]


def as_data(X: Any, what: str) -> np.ndarray:
    """A 2-D float32 or float64 array of rows, or the error that says what is wrong; ``what``
    names the estimator in the messages ("k-means", "StandardScaler")."""
    if hasattr(X, "tocsr") or hasattr(X, "toarray"):
        raise TypeError(f"mpinb's {what} needs a dense array; sparse input is not supported.")
    arr = np.asarray(X)
    if arr.ndim != 2:
        raise ValueError(
            f"X_local must be a 2-D array of shape (n_local_samples, n_features); got shape "
            f"{arr.shape}. A rank without rows passes an array of shape (0, n_features)."
        )
    if arr.shape[1] == 0:
        raise ValueError(f"X_local has 0 features; {what} needs at least one column.")
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"X_local must hold real numbers; got dtype {arr.dtype}.")
    if arr.dtype not in (np.float32, np.float64):
        arr = arr.astype(np.float64)
    return arr


def as_weights(sample_weight: Any, n: int) -> np.ndarray | None:
    """``None`` for unit weights, else one finite non-negative float64 weight per row."""
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


def finite_sums(X: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """This rank's float64 column sums of ``weights * X`` (in chunks), or the error naming the
    first non-finite value: a sum is non-finite exactly when some value is, or when it overflows."""
    sums = np.zeros(X.shape[1])
    for s, e in chunks(X.shape[0], chunk_rows(X.shape[1])):
        if weights is None:
            sums += X[s:e].sum(axis=0, dtype=np.float64)
        else:
            sums += weights[s:e] @ X[s:e].astype(np.float64, copy=False)
    if not np.isfinite(sums).all():
        raise_nonfinite(X)
    return sums


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


def check_fitted(est: Any, attribute: str) -> None:
    """scikit-learn's ``NotFittedError`` unless ``est`` has ``attribute`` (set last by its fit)."""
    if not hasattr(est, attribute):
        from sklearn.exceptions import NotFittedError

        raise NotFittedError(
            f"This {type(est).__name__} instance is not fitted yet. Call 'fit' with appropriate "
            "arguments before using this estimator."
        )


def check_width(X: np.ndarray, n_features_in: int, est: Any, name: str = "X") -> None:
    """The error for rows of another width than the fitted model's ``n_features_in_``."""
    if X.shape[1] != n_features_in:
        raise ValueError(
            f"{name} has {X.shape[1]} features, but {type(est).__name__} was fitted with "
            f"{n_features_in} features."
        )
