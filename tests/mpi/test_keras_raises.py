"""A framework error on one rank inside an mpinb call, in a batch job: every rank raises, nothing hangs.

Issue 49's case: ``mpiexec -n 3 python step.py`` where rank 1 holds a label out of range. TensorFlow
raises ``InvalidArgumentError`` in rank 1's train step, between two gradient exchanges; the other
ranks waited in the next exchange for ever (a script has no cell end to release them). Rank 1 now
revokes that place as its error leaves ``mpinb.keras.fit`` (:func:`mpinb._collective.collective_call`),
the others raise ``CollectiveAbandoned`` naming rank 1 and its error, and the next collective works.
The same holds for the estimators' ``fit`` (here ``KMeans.fit``). At 1, 2 and 3 ranks (at 1 rank the
error is the rank's own, and nothing else happens).
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpinb
from mpinb.errors import CollectiveAbandoned
from support.mpitools import assert_everywhere

keras = pytest.importorskip("keras")
mk = pytest.importorskip("mpinb.keras")

pytestmark = pytest.mark.mpi_sizes(1, 2, 3)

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
BAD = 1 if SIZE > 1 else 0  # the rank whose own code raises


def mlp():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.05),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def rows(bad_label: bool = False):
    rng = np.random.default_rng(RANK)
    X = rng.normal(size=(256, 8)).astype(np.float32)
    y = (X[:, 0] > 0).astype(np.int64)
    if bad_label and RANK == BAD:
        y[5] = 7  # two classes: TensorFlow's loss kernel rejects it as the step runs
    return X, y


def next_collective_works() -> None:
    total = mpinb.allreduce([np.ones(3)])[0]
    assert_everywhere(bool(np.all(total == SIZE)), "the collective after the error")


def test_a_label_out_of_range_on_one_rank_makes_every_rank_raise_naming_it():
    import tensorflow as tf

    X, y = rows(bad_label=True)
    with pytest.raises(Exception) as caught:
        mk.fit(mlp(), X, y, batch_size=64, epochs=2, verbose=0)
    err = caught.value
    if RANK == BAD:
        ok = isinstance(err, tf.errors.InvalidArgumentError)
    else:
        text = str(err)
        ok = (isinstance(err, CollectiveAbandoned) and err.by == BAD
              and f"rank {BAD} raised InvalidArgumentError: Received a label value of 7" in text
              and "in mpinb.keras.fit, between two collectives" in text)
    assert_everywhere(ok, f"the error of each rank ({type(err).__name__}: {str(err)[:300]})")
    next_collective_works()
    # And the next fit, on good rows, trains on every rank.
    X, y = rows()
    history = mk.fit(mlp(), X, y, batch_size=64, epochs=1, verbose=0)
    assert_everywhere(np.isfinite(history["loss"][-1]), "the next fit")


class _RaisesAtTrainEnd(keras.callbacks.Callback):
    """Raises on one rank as training ends, after the last gradient exchange: the other ranks may
    have left fit already, or be in a collective of its end."""

    def on_train_end(self, logs=None):
        if RANK == BAD:
            raise ValueError("the user's callback failed on this rank")


def test_an_error_after_the_last_exchange_leaves_every_rank_able_to_go_on():
    X, y = rows()
    try:
        mk.fit(mlp(), X, y, batch_size=64, epochs=1, verbose=0, callbacks=[_RaisesAtTrainEnd()])
        err = None
    except Exception as caught:  # noqa: BLE001 - asserted on below
        err = caught
    if RANK == BAD:
        ok = isinstance(err, ValueError) and "the user's callback failed" in str(err)
    else:
        # It returned (it had left fit when rank BAD raised), or raised naming rank BAD.
        ok = err is None or (isinstance(err, CollectiveAbandoned) and err.by == BAD and "ValueError" in str(err))
    assert_everywhere(ok, f"the outcome of fit on each rank ({err!r})")
    next_collective_works()


def test_an_error_every_rank_raises_together_revokes_nothing():
    """A bad argument fails on every rank alike (a decision of raise_together): no rank was left
    waiting, and the collective layer stays on its communicator."""
    chan = mpinb._collective.channel(COMM)
    before = chan.gens[chan.active].number if chan.gens else 0
    X, y = rows()
    with pytest.raises(ValueError, match="epochs"):
        mk.fit(mlp(), X, y, batch_size=64, epochs=-1, verbose=0)
    next_collective_works()
    after = chan.gens[chan.active].number if chan.gens else 0
    assert_everywhere(after == before, f"the generation after an error of every rank ({before} -> {after})")


def test_an_error_inside_kmeans_fit_on_one_rank_makes_every_rank_raise_naming_it(monkeypatch):
    from mpinb.kmeans import _lloyd

    assign, calls = _lloyd.assign, []

    def third_assignment_fails(*args, **kwargs):
        calls.append(1)
        if RANK == BAD and len(calls) == 3:  # between two of Lloyd's reductions
            raise MemoryError("no room for the distances")
        return assign(*args, **kwargs)

    monkeypatch.setattr(_lloyd, "assign", third_assignment_fails)
    X = np.random.default_rng(RANK).normal(size=(400, 4))
    with pytest.raises(Exception) as caught:
        mpinb.KMeans(4, n_init=1, random_state=0, max_iter=20, tol=0).fit(X)
    err = caught.value
    if RANK == BAD:
        ok = isinstance(err, MemoryError)
    else:
        ok = (isinstance(err, CollectiveAbandoned) and err.by == BAD
              and f"rank {BAD} raised MemoryError: no room for the distances in KMeans.fit" in str(err))
    assert_everywhere(ok, f"the error of each rank ({type(err).__name__}: {err})")
    monkeypatch.undo()
    next_collective_works()
