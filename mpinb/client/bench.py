"""Scaling measurements from the client: the same work at several world sizes, side by side."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["scaling"]


def scaling(ranks: Sequence[int] = (1, 2, 4), *, timeout: float = 600, **params: Any) -> list[dict[str, Any]]:
    """Time a k-means iteration and a Keras training step at each number of ranks.

    Client. Each world size runs as its own ``mpiexec`` job (the batch path: no engines to start,
    and a fresh MPI world per size). Keyword
    arguments go to the engine-side measurement (``n_rows``, ``n_features``, ``n_clusters``,
    ``kmeans_iters``, ``train_rows``, ``global_batch``, ``epochs``, ``hidden``, ``keras``,
    ``threads`` per rank, default 1).

    Returns
    -------
    list of dict
        One per world size: ``ranks``, ``threads_per_rank``, ``kmeans`` (``seconds_per_iteration``)
        and ``keras`` (``seconds_per_step``, ``compute_per_step``, ``comm_per_step`` and the part of it
        spent waiting for the slowest rank, ``wait_per_step``).
    """
    from mpinb.client.launch import run_mpi

    results = []
    for n in ranks:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "scaling.json"
            argv = ["-m", "mpinb.jobs.scaling", str(path), json.dumps(params)]
            proc = run_mpi(n, argv, timeout=timeout, capture=True)
            if proc.returncode != 0:
                raise RuntimeError(f"the measurement at {n} ranks failed (exit {proc.returncode}):\n"
                                   f"{proc.stdout[-3000:]}")
            results.append(json.loads(path.read_text()))
    return results
