"""In-memory training rows as ``fit`` input: an array, or a list/tuple/dict of arrays (multi-input
models), checked, indexed and fed to Keras as a tf.data pipeline in each epoch's batch order.

Local. The nesting is Keras's own (``keras.tree``), so any structure Keras accepts as model inputs
is indexed leaf by leaf. A leaf may be a ``scipy.sparse`` matrix, as Keras accepts with TensorFlow:
its rows are fed as ``tf.SparseTensor`` batches.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from mpinb._training.plan import BatchPlan, epoch_rows

__all__ = ["as_arrays", "check_finite_inputs", "check_xy", "dataset", "dummy_row", "length", "take"]


def as_arrays(data: Any) -> Any:
    """``data`` with every leaf a NumPy array (or a CSR matrix, for a scipy.sparse one). A list or
    tuple is a structure of inputs only when every item is an array; otherwise (a list of numbers,
    say) it is one array, as NumPy reads it."""
    if isinstance(data, (list, tuple)) and not (data and all(hasattr(v, "shape") for v in data)):
        return np.asarray(data)
    return keras.tree.map_structure(lambda v: v.tocsr() if _is_sparse(v) else np.asarray(v), data)


def length(data: Any) -> int:
    """The number of rows, which every leaf must share along axis 0."""
    lengths = {leaf.shape[0] if leaf.ndim else -1 for leaf in keras.tree.flatten(as_arrays(data))}
    if len(lengths) != 1 or -1 in lengths:
        raise ValueError("every input array needs the same number of rows along axis 0; "
                         f"got lengths {sorted(lengths)}.")
    return lengths.pop()


def take(data: Any, idx: np.ndarray, *, dense: bool = False) -> Any:
    """The rows ``idx`` of every leaf (sparse ones as dense arrays with ``dense``)."""
    return keras.tree.map_structure(lambda v: v[idx].toarray() if dense and _is_sparse(v) else v[idx], as_arrays(data))


def dummy_row(data: Any) -> Any:
    """One row of zeros shaped like ``data``'s rows (for metric variables on an empty shard)."""
    return keras.tree.map_structure(lambda v: np.zeros((1, *v.shape[1:]), dtype=v.dtype), as_arrays(data))


def check_xy(x: Any, y: Any, xname: str, yname: str) -> int:
    """The rows of ``x``, which ``y`` must match; raises otherwise."""
    nx, ny = length(x), length(y)
    if nx != ny:
        raise ValueError(f"{xname} and {yname} must have the same number of rows; got {nx} and {ny}.")
    return nx


def check_finite_inputs(x: Any, y: Any) -> None:
    for name, value in (("x", x), ("y", y)):
        for leaf in keras.tree.flatten(as_arrays(value)):
            if leaf.dtype.kind == "f" and not np.isfinite(leaf.data if _is_sparse(leaf) else leaf).all():
                raise ValueError(f"{name} contains NaN or infinity; clean the data before training.")


def dataset(x: Any, y: Any, n_local: int, plan: BatchPlan, first_epoch: int, epochs: int, seed: int, rank: int,
            shuffle: bool) -> Any:
    """A tf.data pipeline yielding exactly ``plan.steps`` batches per epoch, this rank's local batch
    of each step (of any size, 0 included), each epoch's order drawn by
    :func:`~mpinb._training.plan.epoch_rows` (so it is NumPy-defined and reproducible), gathered
    from tensors in memory."""
    import tensorflow as tf

    sizes = plan.local_sizes(rank)
    assert sizes is not None, "in-memory arrays: the plan knows every local batch"
    used = int(sizes.sum())
    xt = keras.tree.map_structure(_rows_source, as_arrays(x))
    yt = keras.tree.map_structure(_rows_source, as_arrays(y))
    lengths = tf.constant(sizes, dtype=tf.int64)

    def order(epoch: np.ndarray) -> np.ndarray:
        return epoch_rows(n_local, used, epoch=int(epoch), seed=seed, rank=rank, shuffle=shuffle)

    def epoch_indices(epoch: Any) -> Any:
        idx = tf.ensure_shape(tf.numpy_function(order, [epoch], tf.int64, stateful=False), (used,))
        return tf.data.Dataset.from_tensor_slices(tf.RaggedTensor.from_row_lengths(idx, lengths))

    def gather(idx: Any) -> Any:
        return (keras.tree.map_structure(lambda t: t(idx) if callable(t) else tf.gather(t, idx), xt),
                keras.tree.map_structure(lambda t: t(idx) if callable(t) else tf.gather(t, idx), yt))

    # No autotuning: every stage's parallelism and buffer is fixed here, so there is nothing to tune,
    # and its model thread would outlive the fit: TensorFlow can lose the wake-up that ends it, and
    # then deleting the iterator waits out the thread's current period (which doubles up to 60 s),
    # as when a fit that raised leaves its iterator to a full garbage collection.
    options = tf.data.Options()
    options.autotune.enabled = False
    return (tf.data.Dataset.range(first_epoch, epochs)
            .flat_map(epoch_indices)
            .map(gather, num_parallel_calls=1, deterministic=True)
            .prefetch(2)
            .with_options(options))


def _is_sparse(value: Any) -> bool:
    import sys

    sparse = sys.modules.get("scipy.sparse")  # only a user who has scipy can pass its matrices
    return sparse is not None and sparse.issparse(value)


def _rows_source(leaf: Any) -> Any:
    """A tensor to gather rows from, or for a sparse matrix a function of the row indices that
    returns them as a ``tf.SparseTensor`` (TensorFlow cannot gather rows of a sparse tensor)."""
    import tensorflow as tf

    if not _is_sparse(leaf):
        return tf.convert_to_tensor(leaf)
    dtype, columns = tf.as_dtype(leaf.dtype), leaf.shape[1]

    def rows(idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        part = leaf[idx].tocoo()  # row-major, as a SparseTensor needs
        return np.stack([part.row, part.col], axis=1).astype(np.int64), part.data

    def gather(idx: Any) -> Any:
        where, values = tf.numpy_function(rows, [idx], [tf.int64, dtype], stateful=False)
        shape = tf.stack([tf.size(idx, out_type=tf.int64), tf.constant(columns, tf.int64)])
        return tf.SparseTensor(tf.ensure_shape(where, (None, 2)), tf.ensure_shape(values, (None,)), shape)

    return gather
