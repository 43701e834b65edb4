"""The API's examples run as doctests on every rank, where they need no cluster, no files and no
Keras model: each collective example is called by every rank together, as a ``%%px`` cell would.

The examples read a few names they do not define (``X``, ``y``, ``X_local``, ``comm``, loop bounds),
given here as the iris measurements, their labels and this rank's shard; the others are marked
``# doctest: +SKIP`` in their docstrings, and this file counts how many examples run.
"""

from __future__ import annotations

import doctest
import importlib

import numpy as np
import pytest
from mpi4py import MPI

import mpinb
from support.mpitools import assert_same_everywhere

# Modules whose examples are checked; the rest of the API's examples need a cluster, files or a model.
MODULES = ("mpinb.agreement", "mpinb.comm", "mpinb.deadline", "mpinb.interrupt", "mpinb.live", "mpinb.shards",
           "mpinb.preprocessing", "mpinb.decomposition", "mpinb.kmeans._estimator", "mpinb.kmeans._minibatch",
           "mpinb.data._bundled", "mpinb.data._synthetic")


def _names() -> dict:
    from sklearn.datasets import load_iris

    X, y = load_iris(return_X_y=True)
    X_local = mpinb.shard(X)
    return {"np": np, "mpinb": mpinb, "X": X, "y": y, "X_local": X_local, "comm": MPI.COMM_WORLD,
            "max_iter": 3, "s": X_local.sum(axis=0), "c": len(X_local), "epochs": 2, "loss": 0.5, "val_loss": 0.6}


@pytest.mark.parametrize("name", MODULES)
def test_the_examples_run_on_every_rank(name: str) -> None:
    module = importlib.import_module(name)
    timeout = mpinb.get_collective_timeout()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    ran = 0
    try:
        for test in doctest.DocTestFinder(exclude_empty=True).find(module, globs={**vars(module), **_names()}):
            ran += sum(1 for example in test.examples if not example.options.get(doctest.SKIP))
            runner.run(test, out=lambda text: print(text, end=""))
    finally:
        mpinb.set_collective_timeout(timeout)  # an example sets one
    results = runner.summarize(verbose=False)
    assert results.failed == 0, f"{results.failed} of {results.attempted} examples of {name} failed (above)"
    assert ran > 0 and results.attempted > 0, f"no example of {name} ran"
    assert_same_everywhere(results.attempted)
