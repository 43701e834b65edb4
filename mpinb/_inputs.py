"""Rows and weights as every estimator of mpinb takes them: checked on one rank, with the
messages users see.

Local and deterministic. A fit runs these checks inside :func:`mpinb.raise_together`, so one
rank's bad input raises the same error on every rank; ``transform`` and ``predict`` of a fitted
model run them alone (they are local too).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from mpinb._chunks import chunk_rows, chunks

__all__ = ["as_data", "as_weights", "check_feature_names", "check_fitted", "check_width", "feature_names",
           "finite_sums", "raise_nonfinite"]


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
        column = _first_non_numeric(X, arr)
        if column is None:
            raise TypeError(f"X_local must hold real numbers; got dtype {arr.dtype}.")
        raise TypeError(
            f"X_local must hold real numbers, but its {column}; {what} needs numbers in every column: encode it "
            "(sklearn.preprocessing.OneHotEncoder or OrdinalEncoder, say) or drop it before fitting."
        )
    if arr.dtype not in (np.float32, np.float64):
        arr = arr.astype(np.float64)
    return arr


def feature_names(X: Any) -> np.ndarray | None:
    """The feature names of ``X`` as scikit-learn takes them: a DataFrame's column names when all
    are strings (an object array), else ``None``; a mix of string and other names is a ``TypeError``."""
    columns = getattr(X, "columns", None)
    if columns is None or isinstance(X, np.ndarray):
        return None
    names = np.asarray(list(columns), dtype=object)
    if names.ndim != 1 or len(names) == 0:
        return None
    types = sorted({type(name).__qualname__ for name in names})
    if len(types) > 1 and "str" in types:
        raise TypeError(
            f"Feature names are only supported if all input features have string names, but your input has "
            f"{types} as feature name / column name types. If you want feature names to be stored and validated, "
            "you must convert them all to strings, by using X.columns = X.columns.astype(str) for example. "
            "Otherwise you can remove feature / column names from your input data, or convert them all to a "
            "non-string data type."
        )
    return names if types == ["str"] else None


def check_feature_names(est: Any, X: Any) -> None:
    """Compare the feature names of rows given to a fitted ``est`` with those it was fitted on,
    as scikit-learn does: a ``UserWarning`` when only one side has names, a ``ValueError`` listing
    the names unseen and missing (or saying the order differs) when both have and they differ."""
    fitted = getattr(est, "feature_names_in_", None)
    given = feature_names(X)
    name = type(est).__name__
    if fitted is None and given is None:
        return
    if fitted is None:
        warnings.warn(f"X has feature names, but {name} was fitted without feature names", UserWarning,
                      stacklevel=3)
        return
    if given is None:
        warnings.warn(f"X does not have valid feature names, but {name} was fitted with feature names",
                      UserWarning, stacklevel=3)
        return
    if len(fitted) == len(given) and all(a == b for a, b in zip(fitted, given, strict=True)):
        return
    unseen, missing = sorted(set(given) - set(fitted)), sorted(set(fitted) - set(given))
    message = "The feature names should match those that were passed during fit.\n"
    if unseen:
        message += "Feature names unseen at fit time:\n" + _listed(unseen)
    if missing:
        message += "Feature names seen at fit time, yet now missing:\n" + _listed(missing)
    if not unseen and not missing:
        message += "Feature names must be in the same order as they were in fit.\n"
    raise ValueError(message)


def _listed(names: list[str], most: int = 5) -> str:
    return "".join(f"- {n}\n" for n in names[:most]) + ("- ...\n" if len(names) > most else "")


def _first_non_numeric(X: Any, arr: np.ndarray) -> str | None:
    """Which column keeps ``X`` from being numbers: a DataFrame's first column of another dtype,
    by name, or an array's first column that does not convert to floats, by index."""
    columns, dtypes = getattr(X, "columns", None), getattr(X, "dtypes", None)
    if columns is not None and dtypes is not None:
        try:
            pairs = list(zip(columns, dtypes, strict=True))
        except TypeError:
            pairs = []
        for label, dtype in pairs:
            if getattr(dtype, "kind", "f") not in "biuf":
                return f"column {label!r} has dtype {dtype}"
    if arr.ndim == 2:
        for j in range(arr.shape[1]):
            try:
                arr[:, j].astype(np.float64)
            except (TypeError, ValueError):
                first = next((v for v in arr[:, j] if not isinstance(v, (int, float, np.number))), None)
                shown = first.item() if isinstance(first, np.generic) else first  # 'a', not np.str_('a')
                return f"column {j} holds {type(first).__name__} values ({shown!r}, dtype {arr.dtype})"
    return None


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
