"""Feature names on one process, without pandas: a stand-in with a DataFrame's ``columns``,
``dtypes`` and ``__array__`` is what mpinb reads (tests/mpi/test_feature_names.py runs real
DataFrames against scikit-learn at 1-3 ranks when pandas is installed)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from mpi4py import MPI

import mpinb
from mpinb._inputs import feature_names

SELF = MPI.COMM_SELF


class Frame:
    """The parts of a DataFrame mpinb uses: column labels, one dtype per column, the values."""

    def __init__(self, values: np.ndarray, columns: list, dtypes: list | None = None) -> None:
        self.values, self.columns = values, columns
        self.dtypes = dtypes if dtypes is not None else [values.dtype] * values.shape[1]
        self.shape = values.shape

    def __array__(self, dtype=None, copy=None):
        return self.values if dtype is None else self.values.astype(dtype)

    def __len__(self) -> int:
        return len(self.values)


def rows() -> np.ndarray:
    return np.random.default_rng(0).normal(size=(80, 3))


@pytest.mark.parametrize("make", [lambda: mpinb.KMeans(2, random_state=0, comm=SELF),
                                  lambda: mpinb.MiniBatchKMeans(2, random_state=0, comm=SELF),
                                  lambda: mpinb.StandardScaler(comm=SELF), lambda: mpinb.PCA(2, comm=SELF)])
def test_names_set_at_fit_and_checked_as_scikit_learn_does(make) -> None:
    est = make().fit(Frame(rows(), ["a", "b", "c"]))
    name = type(est).__name__
    assert est.feature_names_in_.tolist() == ["a", "b", "c"] and est.feature_names_in_.dtype == object
    method = getattr(est, "predict", None) or est.transform
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        method(Frame(rows(), ["a", "b", "c"]))
    with pytest.warns(UserWarning, match=f"^X does not have valid feature names, but {name} was fitted with "
                                         "feature names$"):
        method(rows())
    with pytest.raises(ValueError, match="^The feature names should match those that were passed during fit.\n"
                                         "Feature names unseen at fit time:\n- z\nFeature names seen at fit time, "
                                         "yet now missing:\n- a\n$"):
        method(Frame(rows(), ["z", "b", "c"]))
    with pytest.raises(ValueError, match="Feature names must be in the same order as they were in fit"):
        method(Frame(rows(), ["b", "a", "c"]))
    est.fit(rows())
    assert not hasattr(est, "feature_names_in_")
    with pytest.warns(UserWarning, match=f"^X has feature names, but {name} was fitted without feature names$"):
        method(Frame(rows(), ["a", "b", "c"]))


def test_names_that_are_not_all_strings() -> None:
    assert feature_names(Frame(rows(), [0, 1, 2])) is None
    assert feature_names(rows()) is None
    with pytest.raises(TypeError, match=r"Feature names are only supported if all input features have string names, "
                                        r"but your input has \['int', 'str'\] as feature name"):
        mpinb.KMeans(2, comm=SELF).fit(Frame(rows(), ["a", 1, "c"]))


def test_the_column_that_is_not_numbers_is_named() -> None:
    values = np.array([[1.0, "Paris", 2.0], [3.0, "Lyon", 4.0]], dtype=object)
    with pytest.raises(TypeError, match=r"X_local must hold real numbers, but its column 'city' has dtype object; "
                                        r"k-means needs numbers in every column: encode it"):
        mpinb.KMeans(1, comm=SELF).fit(Frame(values, ["x", "city", "y"], [np.dtype(float), np.dtype(object),
                                                                          np.dtype(float)]))
    with pytest.raises(TypeError, match=r"X_local must hold real numbers, but its column 1 holds str values "
                                        r"\('Paris', dtype object\); PCA needs numbers"):
        mpinb.PCA(comm=SELF).fit(values)
    with pytest.raises(TypeError, match=r"X_local must hold real numbers, but its column 1 holds str_ values"):
        mpinb.StandardScaler(comm=SELF).fit(np.array([["1", "a"], ["2", "b"]]))
