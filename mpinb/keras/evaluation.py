"""`evaluate`: exact global metrics over test shards of any sizes, by summing metric states."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np

from mpinb._checks import check_int, default_comm
from mpinb._collective import collective_call
from mpinb._training.averaging import sum_arrays
from mpinb.agreement import check_same, raise_together
from mpinb.comm import allreduce
from mpinb.gpus import ensure_chosen
from mpinb.keras._arrays import check_xy, dummy_row
from mpinb.keras._inputs import Stream, as_stream, no_rows, stand_in

__all__ = ["Scored", "evaluate", "global_evaluate", "scored", "validation_rows"]


@dataclass(frozen=True)
class Scored:
    """This rank's rows to score: arrays ``x, y`` (``rows`` of them), or a pipeline (``stream``)
    read for ``steps`` batches (``None``: to its end)."""

    x: Any = None
    y: Any = None
    rows: int | None = None
    stream: Stream | None = None
    steps: int | None = None

    @property
    def kind(self) -> str:
        """``"arrays"`` for in-memory data, else the stream's: ``"tf.data.Dataset"``, ``"PyDataset"``
        or ``"generator"``."""
        return "arrays" if self.stream is None else self.stream.kind


def scored(x: Any, y: Any, steps: int | None, xname: str = "x", yname: str = "y",
           steps_name: str = "steps") -> Scored:
    """``x, y`` (arrays, or a pipeline and ``y=None``) checked as rows to score. Local."""
    stream = as_stream(x)
    if stream is None:
        if steps is not None:
            raise ValueError(f"{steps_name}= is for a pipeline; with arrays every row is scored.")
        return Scored(x, y, check_xy(x, y, xname, yname))
    if y is not None:
        raise ValueError(f"{yname} must be None when {xname} is a {stream.kind}: it yields (x, y) batches.")
    if steps is not None:
        check_int(steps, steps_name, minimum=1)
    elif stream.batches_per_epoch() is None and stream.kind != "generator":
        raise ValueError(f"{xname} is a {stream.kind} of unknown or infinite length on this rank; pass {steps_name}= "
                         "(this rank's batches to score).")
    return Scored(stream=stream, steps=steps)


def validation_rows(data: Any, steps: int | None) -> Scored:
    """fit's ``validation_data`` checked: a pair of arrays, or a pipeline (a generator only with
    ``validation_steps``). Local."""
    stream = as_stream(data)
    if stream is not None:
        if stream.kind == "generator" and steps is None:
            raise ValueError("a generator as validation_data would be used up by the first epoch; pass "
                             "validation_steps= (this rank's batches scored each epoch).")
        return scored(data, None, steps, "validation_data", "y", "validation_steps")
    if not isinstance(data, (tuple, list)) or len(data) != 2 or as_stream(data[0]) is not None:
        raise TypeError("validation_data must be a pair (x_val, y_val) of this rank's validation rows, or a "
                        "pipeline (tf.data.Dataset, keras.utils.PyDataset or generator) of this rank's batches.")
    x_val, y_val = data
    return scored(x_val, y_val, steps, "validation_data[0]", "validation_data[1]", "validation_steps")


def evaluate(model: Any, x: Any, y: Any = None, *, batch_size: int = 32, steps: int | None = None,
             comm: Any = None) -> dict[str, float]:
    """Exact global metrics of a compiled model over test shards of any sizes.

    Collective. Each rank evaluates its own rows; then every metric's state variables (totals and
    counts, confusion counts, ...) are summed over ranks before the results are read, so the numbers
    equal one process evaluating all rows, even when shards are uneven or some are empty: weighted
    by rows, not by ranks or batches. (Averaging per-rank results would weight small shards too
    much.) Metrics whose state does not add up across rows, such as a running maximum, are not
    supported.

    Parameters
    ----------
    model : keras.Model
        Compiled; the same on every rank.
    x, y : array_like, or a data pipeline and None
        This rank's rows; zero rows are fine as long as some rank has rows. Or, with ``y=None``, a
        pipeline yielding this rank's batches ``(x, y)`` or ``(x, y, sample_weight)``: a
        ``tf.data.Dataset``, a ``keras.utils.PyDataset`` or a Python generator (each rank's of its
        own length; all of it is scored, or ``steps`` batches).
    batch_size : int, default 32
        Rows per evaluation batch on each rank, for arrays (affects speed, not the result).
    steps : int, optional
        Batches of this rank's pipeline to score; required where its length is unknown or
        infinite (a generator is otherwise read to its end).
    comm : mpi4py.MPI.Comm, optional
        Defaults to ``MPI.COMM_WORLD``.

    Returns
    -------
    dict
        Metric name → value (``"loss"`` first among sorted keys), identical on every rank.

    Examples
    --------
    >>> scores = mpinb.keras.evaluate(model, X_test_local, y_test_local)
    >>> scores["accuracy"]
    """
    comm = default_comm(comm)
    with collective_call("mpinb.keras.evaluate", comm):
        return _evaluate(model, x, y, batch_size, steps, comm)


def _evaluate(model: Any, x: Any, y: Any, batch_size: int, steps: int | None, comm: Any) -> dict[str, float]:
    ensure_chosen(comm)  # one GPU per rank, if nothing has initialised TensorFlow's devices yet
    with raise_together(comm=comm):
        check_int(batch_size, "batch_size", minimum=1)
        data = scored(x, y, steps)
        if not getattr(model, "compiled", False):
            raise ValueError("evaluate needs a compiled model: call model.compile(loss=..., metrics=...) first.")
    check_same(data.stream is None, "whether evaluate's x is arrays or a pipeline", comm=comm)
    if data.stream is None:
        (total,) = allreduce([np.int64(data.rows or 0)], comm=comm)  # arrays: rows is their count
        if total == 0:
            raise ValueError("evaluate got no rows on any rank; pass each rank's test shard.")
    return global_evaluate(model, data, batch_size, comm)


def global_evaluate(model: Any, data: Scored, batch_size: int, comm: Any) -> dict[str, float]:
    """Collective: every metric's state summed over ranks, read, then this rank's own put back."""
    if data.stream is not None:
        first = data.stream.peek()
        borrowed = stand_in(None if first is None else no_rows(first), comm=comm, name="evaluate's batch structures")
        if borrowed is None:  # the same verdict on every rank: every rank saw every offer
            raise ValueError(f"evaluate got no batch from any rank's {data.stream.kind}; give some rank batches.")
        if first is not None:
            with warnings.catch_warnings():
                # A pipeline shorter than steps= scores what it has; Keras warns that it "ran out of data".
                warnings.filterwarnings("ignore", message=".*ran out of data")
                model.evaluate(data.stream.evaluation_input(data.steps), steps=data.steps, verbose=0,
                               return_dict=True)
        else:
            _score_nothing(model, keras.tree.map_structure(_one_zero_row, borrowed))
    elif (data.rows or 0) > 0:
        model.evaluate(data.x, data.y, batch_size=batch_size, verbose=0, return_dict=True)
    else:
        _score_nothing(model, (dummy_row(data.x), dummy_row(data.y)))
    variables = list(model.metrics_variables)
    local = [np.array(v.numpy(), copy=True) for v in variables]
    for v, s in zip(variables, sum_arrays(local, comm=comm), strict=True):
        v.assign(s)
    results = model.get_metrics_result()
    for v, mine in zip(variables, local, strict=True):
        v.assign(mine)  # leave this rank's own state as Keras left it
    return {k: float(np.asarray(results[k])) for k in sorted(results)}


def _score_nothing(model: Any, batch: Any) -> None:
    """Metric variables are created on the first update: a rank without rows evaluates one dummy
    ``batch`` (``(x, y)`` or ``(x, y, sample_weight)``) so its metrics have the same layout as
    everyone else's, then zeroes their state."""
    x, y, weights = keras.utils.unpack_x_y_sample_weight(tuple(batch) if isinstance(batch, list) else batch)
    model.evaluate(x, y, sample_weight=weights, verbose=0, return_dict=True)
    for m in model.metrics:
        m.reset_state()


def _one_zero_row(leaf: np.ndarray) -> np.ndarray:
    return np.zeros((1, *leaf.shape[1:]), dtype=leaf.dtype)
