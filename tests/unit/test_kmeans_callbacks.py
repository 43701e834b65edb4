"""scikit-learn's callbacks (``sklearn.callback``, scikit-learn 1.9) on mpinb's k-means estimators
in one process: the hooks' task tree, the global values they see against scikit-learn's own trace
of the same fit, ``ProgressBar``, and nothing changed where the API does not exist."""

from __future__ import annotations

import importlib.util
import pickle
import re
import subprocess
import sys

import numpy as np
import pytest
from mpi4py import MPI
from sklearn.base import clone
from sklearn.cluster import KMeans as SkKMeans
from sklearn.cluster import MiniBatchKMeans as SkMiniBatchKMeans

from mpinb import KMeans, MiniBatchKMeans
from support import kmeans_cases

SELF = MPI.COMM_SELF
HAVE_CALLBACKS = importlib.util.find_spec("sklearn.callback") is not None
if HAVE_CALLBACKS:
    from sklearn import callback
# Every test but the last: the last is what scikit-learn 1.5-1.8 users get.
needs_callbacks = pytest.mark.skipif(not HAVE_CALLBACKS, reason="scikit-learn before 1.9 has no sklearn.callback")


class Recorder:
    """Keeps every hook call: (hook, task name, task id, max_subtasks) and, at a task's end, the
    model the hook was given."""

    def __init__(self, stop: bool = False) -> None:
        self.calls: list[tuple] = []
        self.ends: list[dict] = []
        self.stop = stop

    def setup(self, estimator, context):
        self.calls.append(("setup",))

    def teardown(self, estimator, context):
        self.calls.append(("teardown",))

    def on_fit_task_begin(self, estimator, context, *, X=None, fitted_estimator=None):
        self.calls.append(("begin", context.task_name, context.task_id, context.max_subtasks))

    def on_fit_task_end(self, estimator, context, *, X=None, metadata=None, fitted_estimator=None):
        self.calls.append(("end", context.task_name, context.task_id, context.max_subtasks))
        self.ends.append({
            "task": context.task_name, "id": context.task_id, "parent": getattr(context.parent, "task_id", None),
            "inertia": fitted_estimator.inertia_, "centers": fitted_estimator.cluster_centers_.copy(),
            "n_iter": getattr(fitted_estimator, "n_iter_", None),
            "n_steps": getattr(fitted_estimator, "n_steps_", None),
            "score": fitted_estimator.score(X), "comm": fitted_estimator.comm, "rows": len(X), "metadata": metadata,
        })
        return self.stop


def iterations(rec: Recorder, task: str = "iteration") -> list[dict]:
    return [e for e in rec.ends if e["task"] == task]


def sklearn_trace(out: str, pattern: str) -> list[float]:
    return [float(m) for m in re.findall(pattern, out)]


# ---------------------------------------------------------------------------------------------
# KMeans


@needs_callbacks
def test_kmeans_hooks_form_one_task_per_iteration():
    X = kmeans_cases.blobs(2000)
    rec = Recorder()
    km = KMeans(6, max_iter=50, random_state=0, comm=SELF).set_callbacks(rec).fit(X)
    n = km.n_iter_
    expected = [("setup",), ("begin", "fit", 0, 50)]
    for i in range(n):
        expected += [("begin", "iteration", i, 0), ("end", "iteration", i, 0)]
    expected += [("end", "fit", 0, 50), ("teardown",)]
    assert rec.calls == expected
    # Each iteration's model: the centres after it, the inertia of its assignment (as recorded in
    # inertia_history_), the iterations so far; the fit's end gives the fitted model.
    np.testing.assert_array_equal([e["inertia"] for e in iterations(rec)], km.inertia_history_)
    assert [e["n_iter"] for e in iterations(rec)] == list(range(1, n + 1))
    np.testing.assert_array_equal(iterations(rec)[-1]["centers"], km.cluster_centers_)
    last = rec.ends[-1]
    assert last["task"] == "fit" and last["inertia"] == km.inertia_ and last["score"] == pytest.approx(-km.inertia_)
    # The hooks' model lives on COMM_SELF: its collective methods never wait for other ranks.
    assert all(e["comm"] is SELF for e in rec.ends)
    assert {e["rows"] for e in rec.ends} == {len(X)} and {e["metadata"] is None for e in rec.ends} == {True}
    assert not hasattr(km, "_callback_fit_ctx") and not hasattr(km, "_skl_callbacks_to_teardown")


@needs_callbacks
@pytest.mark.parametrize("case", sorted(kmeans_cases.agreement_cases(3000, 2000)))
def test_kmeans_hooks_see_scikit_learns_iterations(case, capsys):
    """scikit-learn 1.9's KMeans takes no callbacks; its verbose trace prints the same values:
    ``Iteration i, inertia x`` after each assignment, from the same start."""
    X, init = kmeans_cases.agreement_cases(3000, 2000)[case]()
    SkKMeans(len(init), init=init, n_init=1, algorithm="lloyd", verbose=1).fit(X)
    theirs = sklearn_trace(capsys.readouterr().out, r"Iteration \d+, inertia ([-\d.e+]+)\.")
    rec = Recorder()
    KMeans(len(init), init=init, n_init=1, comm=SELF).set_callbacks(rec).fit(X)
    ours = iterations(rec)
    assert [e["id"] for e in ours] == list(range(len(theirs)))
    np.testing.assert_allclose([e["inertia"] for e in ours], theirs, rtol=1e-10)


@needs_callbacks
def test_kmeans_runs_are_tasks_when_there_are_several():
    X = kmeans_cases.blobs(1500)
    rec = Recorder()
    km = KMeans(6, init="random", n_init=3, max_iter=20, random_state=1, comm=SELF).set_callbacks(rec).fit(X)
    assert rec.calls[1] == ("begin", "fit", 0, 3)
    runs = iterations(rec, "run")
    assert [e["id"] for e in runs] == [0, 1, 2]
    begun = [c for c in rec.calls if c[:2] == ("begin", "run")]
    assert begun == [("begin", "run", i, 20) for i in range(3)]
    assert min(e["inertia"] for e in runs) == pytest.approx(km.inertia_, rel=1e-12)
    for run in range(3):
        ids = [e["id"] for e in iterations(rec) if e["parent"] == run]
        assert ids == list(range(len(ids))) and 1 <= len(ids) <= 20


@needs_callbacks
def test_a_request_to_stop_is_ignored():
    X = kmeans_cases.blobs(1500)
    plain = KMeans(6, random_state=0, comm=SELF).fit(X)
    stopping = KMeans(6, random_state=0, comm=SELF).set_callbacks(Recorder(stop=True)).fit(X)
    assert stopping.n_iter_ == plain.n_iter_ > 1
    np.testing.assert_array_equal(stopping.cluster_centers_, plain.cluster_centers_)


@needs_callbacks
def test_progress_bar_shows_the_iterations(capsys):
    pytest.importorskip("rich")
    X = kmeans_cases.blobs(1500)
    KMeans(6, max_iter=4, tol=0, random_state=0, comm=SELF).set_callbacks(callback.ProgressBar()).fit(X)
    out = capsys.readouterr().out
    assert "KMeans - fit" in out and "100%" in out


@needs_callbacks
def test_callbacks_survive_clone_and_pickle_and_are_optional():
    rec = Recorder()
    km = KMeans(3, comm=SELF).set_callbacks(rec)
    assert clone(km)._skl_callbacks == [rec]
    assert pickle.loads(pickle.dumps(km.set_callbacks()))  # no callbacks left
    assert not hasattr(km, "_skl_callbacks")
    with pytest.raises(TypeError, match="FitCallback protocol"):
        km.set_callbacks(object())


# ---------------------------------------------------------------------------------------------
# MiniBatchKMeans


@needs_callbacks
@kmeans_cases.sklearn_draws_as_mpinb
def test_minibatch_hooks_see_scikit_learns_passes(capsys):
    """A task per pass over the data (``max_iter`` of them at most); at its end the model's
    ``inertia_`` is the smoothed batch inertia scaled to all rows, so divided by the rows it is
    scikit-learn's verbose ``ewa inertia`` at that mini-batch, from the same seed."""
    X = kmeans_cases.blobs(3000)
    SkMiniBatchKMeans(6, batch_size=256, random_state=0, verbose=1, n_init=1).fit(X)
    lines = re.findall(r"Minibatch step (\d+)/\d+: mean batch inertia: ([-\d.e+]+)(?:, ewa inertia: ([-\d.e+]+))?",
                       capsys.readouterr().out)
    theirs = {int(step): float(ewa or mean) for step, mean, ewa in lines}
    rec = Recorder()
    mbk = MiniBatchKMeans(6, batch_size=256, random_state=0, n_init=1, comm=SELF).set_callbacks(rec).fit(X)
    passes = iterations(rec, "pass")
    assert rec.calls[:3] == [("setup",), ("begin", "fit", 0, 100), ("begin", "pass", 0, 0)]
    assert rec.calls[-2:] == [("end", "fit", 0, 100), ("teardown",)]
    assert [e["n_iter"] for e in passes] == list(range(1, mbk.n_iter_ + 1))
    # Pass p ends with the last mini-batch that draws no more than p passes' worth of rows (11.7
    # mini-batches of 256 make a pass over 3,000); the last pass ends where early stopping ended the fit.
    ends = [e["n_steps"] for e in passes]
    assert ends[:2] == [11, 23] and ends[-1] == mbk.n_steps_ == max(theirs) and mbk.n_iter_ > 1
    np.testing.assert_allclose([e["inertia"] / len(X) for e in passes], [theirs[s] for s in ends], rtol=1e-10)
    np.testing.assert_array_equal(passes[-1]["centers"], mbk.cluster_centers_)


@needs_callbacks
def test_partial_fit_is_one_task():
    X = kmeans_cases.blobs(600)
    rec = Recorder()
    mbk = MiniBatchKMeans(4, random_state=0, comm=SELF).set_callbacks(rec)
    mbk.partial_fit(X[:300])
    mbk.partial_fit(X[300:])
    one = [("setup",), ("begin", "partial_fit", 0, 0), ("end", "partial_fit", 0, 0), ("teardown",)]
    assert rec.calls == one + one
    assert rec.ends[-1]["n_steps"] == 2 and rec.ends[-1]["inertia"] == mbk.inertia_


# ---------------------------------------------------------------------------------------------
# Without sklearn.callback


def test_without_sklearn_callback_nothing_changes():
    """scikit-learn 1.5-1.8 have no sklearn.callback: mpinb imports, fits, and offers no
    set_callbacks (a meta-estimator then propagates nothing to it). With 1.9, in a process where
    ``from sklearn.callback import CallbackSupportMixin`` fails (scikit-learn's own modules, which
    import it, imported first)."""
    hide = ("import sklearn.callback, sklearn.cluster, sklearn.linear_model, sklearn.preprocessing\n"
            "del sklearn.callback.CallbackSupportMixin\n") if HAVE_CALLBACKS else ""
    code = (
        hide + "import numpy as np; from mpi4py import MPI; import mpinb, mpinb._fit_callbacks as fc\n"
        "assert not fc.AVAILABLE\n"
        "X = np.random.default_rng(0).normal(size=(200, 3))\n"
        "for est in (mpinb.KMeans(3, random_state=0, comm=MPI.COMM_SELF),\n"
        "            mpinb.MiniBatchKMeans(3, batch_size=50, random_state=0, comm=MPI.COMM_SELF)):\n"
        "    est.fit(X)\n"
        "    assert not hasattr(est, 'set_callbacks'), type(est)\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
