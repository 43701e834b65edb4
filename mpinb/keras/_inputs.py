"""Data pipelines as ``fit`` input: a ``tf.data.Dataset``, a ``keras.utils.PyDataset`` or a generator.

Local. Each rank's pipeline yields that rank's batches, ``(x, y)`` or ``(x, y, sample_weight)``.
``fit`` agrees on the number of steps per epoch collectively, then feeds Keras exactly that many
batches per epoch, every epoch, so no rank runs out of data while the others wait in the gradient
exchange (Keras itself would carry a half-read dataset over into the next epoch, and stop the
rank whose data ends first). A rank whose pipeline is shorter than the epoch fills the rest with
batches of no rows (its first batch's structure, cut to zero rows), which weigh nothing.
:func:`stand_in` is the one collective here: a rank whose pipeline yields nothing borrows another
rank's batch structure.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

__all__ = ["Stream", "as_numpy", "as_stream", "no_rows", "stand_in"]


class Stream:
    """One rank's pipeline, whatever its kind."""

    def __init__(self, data: Any, kind: str) -> None:
        self.data = data
        self.kind = kind
        self._peeked: list[Any] = []

    def batches_per_epoch(self) -> int | None:
        """Batches one pass yields, or ``None`` when unknown or infinite."""
        if self.kind == "tf.data.Dataset":
            n = int(self.data.cardinality())
            return n if n >= 0 else None  # -1 infinite, -2 unknown
        if self.kind == "PyDataset":
            n = self.data.num_batches
            return None if n is None else int(n)
        return None

    def first_inputs(self) -> Any:
        """The inputs of the first batch, to build a model that has no weights yet."""
        return self._first()[0]

    def empty_batch(self) -> Any:
        """This rank's first batch cut to zero rows, or ``None`` when its pipeline yields none."""
        if self.batches_per_epoch() == 0:
            return None
        try:
            return no_rows(self._first())
        except (StopIteration, ValueError, IndexError):
            return None

    def feed(self, steps: int, epochs: int, real: int | None = None, empty: Any = None) -> Any:
        """What ``model.fit`` gets: exactly ``steps`` batches for each of ``epochs`` epochs, the
        first ``real`` of them (all by default) from the pipeline, the rest ``empty``."""
        real = steps if real is None else real
        if self.kind == "tf.data.Dataset":
            import tensorflow as tf

            # A finite pass restarts each epoch (re-shuffling where the pipeline shuffles); an
            # infinite one continues, as a user of .repeat() expects.
            if int(self.data.cardinality()) == -1:
                return self.data.take(steps * epochs)
            epoch = self.data.take(real)
            if real < steps:
                blanks = tf.data.Dataset.from_tensors(empty).repeat(steps - real)
                epoch = blanks if real == 0 else epoch.concatenate(blanks)
            return epoch.repeat(epochs)
        if self.kind == "PyDataset":
            return _pydataset_batches(self.data, steps, epochs, real, empty)
        return _counted(itertools.chain(self._peeked, self.data), steps * epochs)

    def evaluation_input(self, steps: int | None) -> Any:
        """What ``model.evaluate`` gets to score ``steps`` batches (``None``: one pass). A
        generator is handed over ``steps`` batches at a time, so that the next evaluation (the next
        epoch's validation) continues where this one stopped, and the first batch peeked to build
        the model is scored, not lost."""
        if self.kind != "generator":
            return self.data
        batches = itertools.chain(self._peeked, self.data)
        self._peeked = []
        # A generator object, as Keras's data adapters want one.
        return (b for b in (batches if steps is None else itertools.islice(batches, steps)))

    def peek(self) -> Any:
        """The first batch evaluation would read, or ``None`` when the pipeline yields none (a
        generator keeps it, to hand it over first)."""
        try:
            if self.kind == "tf.data.Dataset":
                return next(iter(self.data.take(1)), None)
            if self.kind == "PyDataset":
                return None if self.data.num_batches == 0 else self.data[0]
            if not self._peeked:
                self._peeked.append(next(self.data))
            return self._peeked[0]
        except StopIteration:
            return None

    def _first(self) -> Any:
        if self.kind == "tf.data.Dataset":
            return next(iter(self.data.take(1)))
        if self.kind == "PyDataset":
            return self.data[0]
        if not self._peeked:
            try:
                self._peeked.append(next(self.data))
            except StopIteration:
                raise ValueError("the generator given as x yields no batch on this rank.") from None
        return self._peeked[0]


def as_stream(x: Any) -> Stream | None:
    """A :class:`Stream` when ``x`` is a pipeline, ``None`` when it is in-memory arrays."""
    import keras

    if isinstance(x, keras.utils.PyDataset):
        return Stream(x, "PyDataset")
    if isinstance(x, Iterator):
        return Stream(x, "generator")
    import sys

    tf = sys.modules.get("tensorflow")
    if tf is not None and isinstance(x, tf.data.Dataset):
        return Stream(x, "tf.data.Dataset")
    return None


def no_rows(batch: Any) -> Any:
    """``batch`` (a structure of arrays or tensors) with every leaf cut to zero rows. Local."""
    import tensorflow as tf

    def cut(leaf: Any) -> Any:
        if isinstance(leaf, tf.SparseTensor):
            shape = tf.concat([[0], leaf.dense_shape[1:]], 0)
            return tf.sparse.slice(leaf, tf.zeros_like(leaf.dense_shape), shape)
        return leaf[:0]

    return tf.nest.map_structure(cut, batch)


def as_numpy(batch: Any) -> Any:
    """A batch of zero rows as NumPy arrays (dense), to travel to a rank whose pipeline has none."""
    import numpy as np
    import tensorflow as tf

    def dense(leaf: Any) -> Any:
        if isinstance(leaf, tf.SparseTensor):
            return np.zeros([0, *leaf.shape[1:]], dtype=leaf.dtype.as_numpy_dtype)
        return np.asarray(leaf)

    return tf.nest.map_structure(dense, batch)


def stand_in(empty: Any, *, comm: Any, name: str) -> Any:
    """Collective: the first rank's batch of zero rows (``empty``, ``None`` where a rank has no
    batch), as NumPy arrays, on every rank; ``None`` on every rank when no rank has one. A few
    hundred bytes: every rank offers its structure, so that one whose pipeline is empty can still
    build the same model inputs and metric variables."""
    from mpinb import _collective

    offered = _collective.allgather(None if empty is None else as_numpy(empty), comm=comm, name=name)
    return next((o for o in offered if o is not None), None)


def _pydataset_batches(data: Any, steps: int, epochs: int, real: int | None = None, empty: Any = None
                       ) -> Iterator[Any]:
    # In index order, calling on_epoch_end as Keras would: the PyDataset shuffles itself there.
    # (An infinite PyDataset is indexed on from where the last epoch stopped.) It is called once the
    # epoch's last batch is drawn, before that batch is handed over: after the last yield, code would
    # run only if the consumer asked for one batch more, which TensorFlow's prefetching sometimes
    # does and sometimes not (the last epoch's on_epoch_end went missing in 1 of 2 CI runs).
    # A shorter one ends its epoch at its own last batch, and gives batches of no rows after it.
    real = steps if real is None else real
    index = 0
    for _ in range(epochs):
        if data.num_batches is not None:
            index = 0
        for step in range(steps):
            if step < real:
                batch = data[index]
                index += 1
            else:
                batch = empty
            if step == max(real, 1) - 1:
                data.on_epoch_end()
            yield batch


def _counted(batches: Iterator[Any], total: int) -> Iterator[Any]:
    given = 0
    for batch in itertools.islice(batches, total):
        given += 1
        yield batch
    if given < total:
        raise ValueError(
            f"the generator given as x stopped after {given} batches on this rank; fit needs "
            f"steps_per_epoch × epochs = {total}. Make it yield that many (or loop for ever)."
        )
