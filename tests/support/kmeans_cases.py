"""Data the k-means tests share, in one process and under MPI: overlapping blobs, a start that
forces an empty cluster, duplicated points, callable inits, and the cases compared with
scikit-learn."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import sklearn
from sklearn.datasets import load_digits, load_iris, make_blobs

# scikit-learn 1.9 draws MiniBatchKMeans's batches with ``RandomState.choice`` in proportion to the
# sample weights, as mpinb does; before, with ``randint`` (weights then scaled each step), so the
# same seed drew other rows. Comparisons of fits that draw their own batches need 1.9.
sklearn_draws_as_mpinb = pytest.mark.skipif(
    tuple(int(p) for p in sklearn.__version__.split(".")[:2]) < (1, 9),
    reason=f"scikit-learn {sklearn.__version__} draws MiniBatchKMeans's batches otherwise (randint; 1.9: choice "
           "weighted by sample_weight, as mpinb)")


def blobs(n: int, d: int = 5, centers: int = 6, std: float = 3.0, seed: int = 0) -> np.ndarray:
    """Overlapping blobs: many points near cluster boundaries."""
    return make_blobs(n, d, centers=centers, cluster_std=std, random_state=seed)[0]


def forced_empty(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Two identical initial centres: the second gets no point in the first iteration, so it is
    relocated to the farthest point."""
    X = blobs(n, 4, 5, 2.0, seed=3)
    init = X[:5].copy()
    init[4] = init[3]
    return X, init


def agreement_cases(n_blobs: int, n_empty: int) -> dict[str, Callable[[], tuple[np.ndarray, np.ndarray]]]:
    """(X, init) makers for the comparisons with scikit-learn from the same start."""
    return {
        "iris": lambda: (load_iris().data, load_iris().data[:3].copy()),
        "digits": lambda: (load_digits().data, load_digits().data[:10].copy()),
        "blobs": lambda: (blobs(n_blobs), blobs(n_blobs)[:6].copy()),
        "empty-cluster": lambda: forced_empty(n_empty),
    }


def duplicates(repeat: int = 1) -> np.ndarray:
    """scikit-learn issue 28055: four distinct points, one of them twice, each row ``repeat``
    times. Started on its first five rows, one cluster is empty and cannot be relocated (every
    point sits on its centre), so scikit-learn stops after one iteration."""
    base = np.array([[0, 0], [1, 1], [1, 1], [1, 0], [0, 1]], dtype=np.float64)
    return np.repeat(base, repeat, axis=0)


def fixed_centres(X: np.ndarray, k: int) -> Callable[..., np.ndarray]:
    """A callable ``init`` that ignores its arguments: the first ``k`` rows of the full ``X``."""
    centres = X[:k].copy()

    def init(X_local: np.ndarray, n_clusters: int, random_state: np.random.RandomState) -> np.ndarray:
        return centres.copy()

    return init


def drawn_centres(low: float, high: float, d: int) -> Callable[..., np.ndarray]:
    """A callable ``init`` drawing centres from ``random_state`` alone (uniform in a box)."""

    def init(X_local: np.ndarray, n_clusters: int, random_state: np.random.RandomState) -> np.ndarray:
        return random_state.uniform(low, high, size=(n_clusters, d))

    return init
