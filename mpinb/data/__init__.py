"""Data on the ranks: bundled datasets, synthetic data generated per shard, ``.npy`` shard loading,
and file sharding for training from many files.

Each rank reads or generates only its own rows, so bulk data never passes through the notebook
client and memory per rank is proportional to its shard. Shards follow :func:`mpinb.shard_bounds`:
contiguous and balanced, so gathering them in rank order (``mpinb.gather_rows``) gives back exactly
the data set one process would have loaded, whatever the number of ranks. Data kept in many files
(TFRecord, ``.npz`` parts) is sharded by whole files instead: :func:`shard_files` gives each rank a
contiguous run of the sorted file list, and :func:`shard_dataset` shards a ``tf.data`` pipeline.
"""

from __future__ import annotations

from mpinb.data._bundled import Split, load_breast_cancer, load_digits, load_iris, load_wine
from mpinb.data._files import shard_dataset, shard_files
from mpinb.data._npy import load_npy
from mpinb.data._synthetic import make_blobs, make_classification

__all__ = [
    "Split",
    "load_breast_cancer",
    "load_digits",
    "load_iris",
    "load_npy",
    "load_wine",
    "make_blobs",
    "make_classification",
    "shard_dataset",
    "shard_files",
]
