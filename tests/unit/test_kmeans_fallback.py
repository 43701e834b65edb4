"""When numba cannot give mpinb its compiled k-means passes -- a pass that fails to compile or link
for this CPU, or ``MPINB_NUMBA=on`` where numba does not import -- the fit still runs, on the NumPy
passes, with the same result and one warning that says so."""

from __future__ import annotations

import sys
import warnings

import numpy as np
import pytest

numba = pytest.importorskip("numba")

from mpinb import KMeans, _numba  # noqa: E402
from mpinb.kmeans import _kernels  # noqa: E402


@pytest.fixture
def fresh_executors(monkeypatch):
    """Compiled passes built anew (fresh dispatchers, nothing compiled in this process yet), and
    the process's memory of a failure forgotten before and after."""
    monkeypatch.setenv("MPINB_NUMBA", "on")

    def forget():
        _kernels._compiled.cache_clear()
        _kernels._broken.clear()
        _numba._imported.cache_clear()
        _numba._why_not.clear()
        _numba.unavailable_on_demand.cache_clear()

    forget()
    yield
    forget()


def blobs():
    rng = np.random.default_rng(3)
    centres = rng.normal(scale=6, size=(5, 4))
    return np.vstack([c + rng.normal(size=(300, 4)) for c in centres])


def fit(X):
    return KMeans(5, n_init=1, init="random", random_state=0, max_iter=50).fit(X)


def numpy_reference(X, monkeypatch):
    monkeypatch.setenv("MPINB_NUMBA", "off")
    try:
        return fit(X)
    finally:
        monkeypatch.setenv("MPINB_NUMBA", "on")


def mpinb_warnings(caught):
    return [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning) and "mpinb" in str(w.message)
            or "MPINB_NUMBA" in str(w.message)]


def test_a_pass_that_fails_to_compile_falls_back_to_numpy_with_one_warning(fresh_executors, monkeypatch):
    X = blobs()
    reference = numpy_reference(X, monkeypatch)
    real_compile = numba.core.dispatcher.Dispatcher.compile
    tried = []

    def failing_compile(self, sig):
        if self.py_func.__module__.startswith("mpinb.kmeans"):
            tried.append(self.py_func.__name__)
            raise numba.core.errors.LoweringError("LLVM ERROR: Cannot select: simulated for this CPU")
        return real_compile(self, sig)

    monkeypatch.setattr(numba.core.dispatcher.Dispatcher, "compile", failing_compile)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = fit(X)
        second = fit(X)
    assert tried, "no compiled pass was tried: the test did not exercise the compiled executor"
    said = mpinb_warnings(caught)
    assert len(said) == 1, said
    assert "compiled k-means passes failed at compiling" in said[0] and "LLVM ERROR: Cannot select" in said[0]
    assert "NumPy passes instead" in said[0]
    for model in (first, second):
        np.testing.assert_array_equal(model.labels_, reference.labels_)
        np.testing.assert_allclose(model.cluster_centers_, reference.cluster_centers_, rtol=1e-12, atol=1e-12)
        assert model.n_iter_ == reference.n_iter_
    assert _kernels.kernels(_kernels.COMPILE_FROM) is _kernels.NUMPY  # the rest of the process


def test_an_error_raised_by_compiled_code_is_not_hidden(fresh_executors):
    @numba.njit
    def raises(x):
        if x > 0:
            raise ValueError("raised inside compiled code")
        return x

    from types import SimpleNamespace

    guarded = _kernels._guarded(SimpleNamespace(name="compiled", simd_width=None, **dict.fromkeys(_kernels.PASSES,
                                                                                               raises)), numba)
    assert guarded.assign_rows(-1.0) == -1.0
    with pytest.raises(ValueError, match="raised inside compiled code"):
        guarded.assign_rows(1.0)
    assert not _kernels._broken  # compiled code ran: no fallback, no warning


def test_numba_on_without_numba_says_so_and_runs_numpy(fresh_executors, monkeypatch):
    X = blobs()
    reference = numpy_reference(X, monkeypatch)
    monkeypatch.setitem(sys.modules, "numba", None)  # import numba raises ImportError
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = fit(X)
        fit(X)
    said = mpinb_warnings(caught)
    assert len(said) == 1, said
    assert said[0].startswith("MPINB_NUMBA=on asks for mpinb's compiled passes, but numba cannot be imported")
    assert "ModuleNotFoundError: import of numba halted" in said[0]
    np.testing.assert_array_equal(model.labels_, reference.labels_)


def test_auto_without_numba_stays_quiet(fresh_executors, monkeypatch):
    monkeypatch.setenv("MPINB_NUMBA", "auto")
    monkeypatch.setitem(sys.modules, "numba", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _kernels.kernels(_kernels.COMPILE_FROM) is _kernels.NUMPY
    assert not mpinb_warnings(caught)
