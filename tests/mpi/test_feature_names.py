"""scikit-learn's contract on DataFrames, for every mpinb estimator under mpiexec at 1, 2 and 3
ranks: ``feature_names_in_`` set from each rank's DataFrame (the same names on every rank, an
empty DataFrame on a rank without rows included), checked at predict/transform as scikit-learn
checks it; names that differ between ranks, and a column of strings, raise one error on every
rank that names the ranks (and the column)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from mpi4py import MPI
from sklearn.cluster import KMeans as SkKMeans
from sklearn.cluster import MiniBatchKMeans as SkMiniBatchKMeans
from sklearn.decomposition import PCA as SkPCA
from sklearn.preprocessing import StandardScaler as SkScaler

import mpinb
from mpinb import CollectiveMismatchError
from support.mpitools import assert_everywhere, raises_everywhere, uneven

pd = pytest.importorskip("pandas")

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
COLUMNS = ["alpha", "beta", "gamma"]

# Each estimator with scikit-learn's, and the method that checks names on fitted rows.
ESTIMATORS = {
    "KMeans": (lambda: mpinb.KMeans(3, random_state=0), lambda: SkKMeans(3, random_state=0, n_init=1), "predict"),
    "MiniBatchKMeans": (lambda: mpinb.MiniBatchKMeans(3, random_state=0, batch_size=64),
                        lambda: SkMiniBatchKMeans(3, random_state=0, batch_size=64), "predict"),
    "StandardScaler": (mpinb.StandardScaler, SkScaler, "transform"),
    "PCA": (lambda: mpinb.PCA(2), lambda: SkPCA(2), "transform"),
}


def frame(n: int = 120 * SIZE) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    return pd.DataFrame(rng.normal(size=(n, len(COLUMNS))), columns=COLUMNS)


def outcome(call) -> tuple[str | None, list[str]]:
    """What a local call raised (type and message) and which warnings about feature names it gave."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            call()
            raised = None
        except Exception as err:  # noqa: BLE001 - compared with scikit-learn's outcome
            raised = f"{type(err).__name__}: {err}"
    return raised, [str(w.message) for w in seen if "feature names" in str(w.message)]


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_names_are_set_from_uneven_dataframe_shards_and_checked_as_sklearn_checks_them(name: str) -> None:
    ours_of, theirs_of, method = ESTIMATORS[name]
    df = frame()
    ours = ours_of().fit(uneven(df, shares=(2, 0, 3)))  # rank 1 holds an empty DataFrame: same columns
    theirs = theirs_of().fit(df)
    assert_everywhere(list(ours.feature_names_in_) == COLUMNS, "feature_names_in_ from the columns")
    assert_everywhere(ours.feature_names_in_.dtype == object, "an object array, as scikit-learn's")
    mine = uneven(df)
    for case, rows in {"named": mine, "array": mine.to_numpy(), "renamed": mine.rename(columns={"alpha": "a"}),
                       "reordered": mine[["beta", "alpha", "gamma"]]}.items():
        ours_says = outcome(lambda rows=rows: getattr(ours, method)(rows))
        theirs_says = outcome(lambda rows=rows: getattr(theirs, method)(rows))
        assert_everywhere(ours_says == theirs_says, f"{name}.{method} on {case} rows: {ours_says} vs {theirs_says}")
    # Refitted on arrays, the names go, as in scikit-learn.
    assert_everywhere(not hasattr(ours.fit(uneven(df.to_numpy())), "feature_names_in_"), "names dropped")


def test_partial_fit_keeps_the_first_batchs_names_and_checks_later_batches() -> None:
    df = frame()
    scaler = mpinb.StandardScaler().partial_fit(uneven(df))
    scaler.partial_fit(uneven(df))
    assert_everywhere(list(scaler.feature_names_in_) == COLUMNS, "names from the first batch")
    with raises_everywhere(ValueError, match=r"(?s)The feature names should match those that were passed during "
                                             r"fit\.\nFeature names unseen at fit time:\n- a\n.*- alpha\n"):
        scaler.partial_fit(uneven(df.rename(columns={"alpha": "a"})))


@pytest.mark.skipif(SIZE == 1, reason="names can differ between ranks only where there are several")
def test_names_that_differ_on_one_rank_raise_on_every_rank_naming_it() -> None:
    df = frame()
    mine = uneven(df)
    if RANK == SIZE - 1:
        mine = mine.rename(columns={"gamma": "delta"})
    with raises_everywhere(CollectiveMismatchError, match=r"the feature names of X_local .* must be the same on every "
                                                          r"rank, but differs across") as info:
        mpinb.KMeans(2, random_state=0).fit(mine)
    assert_everywhere(f"rank {SIZE - 1}: " in str(info.value) and "'delta'" in str(info.value), str(info.value))


@pytest.mark.skipif(SIZE == 1, reason="one rank's array among DataFrames needs several ranks")
def test_an_array_on_one_rank_among_dataframes_raises_on_every_rank() -> None:
    mine = uneven(frame())
    with raises_everywhere(CollectiveMismatchError, match=r"differs across \d ranks \(rank 0: None; ranks? 1.*: "
                                                          r"\['alpha', 'beta', 'gamma'\]\)"):
        mpinb.PCA(2).fit(mine.to_numpy() if RANK == 0 else mine)


def test_a_string_column_is_named_in_the_error_on_every_rank() -> None:
    mine = uneven(frame())
    if RANK == SIZE - 1:
        mine = mine.assign(city=["Paris"] * len(mine))
        mine = mine[["alpha", "city", "beta"]]
    else:
        mine = mine[["alpha", "gamma", "beta"]]
    where = "the only rank" if SIZE == 1 else f"rank {SIZE - 1} of {SIZE}"
    with raises_everywhere(TypeError, match=r"X_local must hold real numbers, but its column 'city' has dtype "
                                            rf"(object|str); StandardScaler needs numbers in every column: encode "
                                            rf"it .* \[on {where}\]"):
        mpinb.StandardScaler().fit(mine)
