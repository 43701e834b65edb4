"""``mpinb demo``: distributed k-means and sharded Keras training on an MPI cluster, figures to disk."""

from __future__ import annotations

import json
import pickle
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["run_demo"]


def run_demo(n: int = 4, *, batch: bool = False, out: str | Path = "mpinb-demo", epochs: int = 12) -> int:
    """Run the demo on ``n`` ranks and write figures and a JSON summary to ``out``.

    Client. With ``batch=False`` it starts an :class:`~mpinb.MPICluster` of ``n`` engines (what a
    notebook does); with ``batch=True`` it runs the same engine-side code through plain
    ``mpiexec``. Returns a process exit code.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    mode = "mpiexec (batch)" if batch else "ipyparallel MPI engines"
    print(f"mpinb demo: {n} MPI ranks via {mode}; writing {out}/", flush=True)
    summary = _run_batch(n, epochs) if batch else _run_cluster(n, epochs)
    summary["mode"] = "batch" if batch else "cluster"
    summary["total_seconds"] = time.perf_counter() - t0
    plot = summary.pop("plot")
    figures = _figures(summary, plot, out)
    summary["figures"] = [str(p) for p in figures]
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    _print_table(summary, out)
    return 0


def _run_cluster(n: int, epochs: int) -> dict[str, Any]:
    from mpinb.client.cluster import MPICluster
    from mpinb.jobs.demo import run

    with MPICluster(n=n) as cluster:
        started = time.perf_counter()
        results = cluster.view.apply_sync(run, epochs=epochs)
        summary = next(r for r in results if "plot" in r)
        summary["engine_seconds"] = time.perf_counter() - started
    return summary


def _run_batch(n: int, epochs: int) -> dict[str, Any]:
    from mpinb.client.launch import run_mpi

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "summary.pkl"
        # Captured: TensorFlow logs a few lines per rank at start-up; shown only if something fails.
        proc = run_mpi(n, ["-m", "mpinb.jobs.demo", str(path), str(epochs)], timeout=600, capture=True)
        if proc.returncode != 0:
            print(proc.stdout)
            raise RuntimeError(f"the demo failed under mpiexec (exit {proc.returncode}); its output is above.")
        with open(path, "rb") as fh:
            return pickle.load(fh)


def _figures(summary: dict[str, Any], plot: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    import numpy as np

    from mpinb.client.plotting import plot_clusters, plot_inertia, plot_loss

    paths = []
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    plot_clusters(plot["X"], plot["labels"], np.asarray(summary["kmeans"]["centers"]), ax=axes[0])
    axes[0].set_title(f"k-means on {summary['kmeans']['n_rows']:,} rows over {summary['ranks']} ranks")
    plot_inertia(summary["kmeans"]["inertia_history"], ax=axes[1])
    fig.tight_layout()
    paths.append(out / "kmeans.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4.5))
    plot_loss(summary["keras"]["history"], ax=ax)
    accuracy = summary["keras"]["test_accuracy"]
    ax.set_title(f"sharded Keras on digits, {summary['ranks']} ranks (test acc {accuracy:.3f})")
    fig.tight_layout()
    paths.append(out / "loss.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def _print_table(summary: dict[str, Any], out: Path) -> None:
    km, kr = summary["kmeans"], summary["keras"]
    rows = [
        ("ranks", f"{summary['ranks']} ({summary['threads_per_rank']} thread each)"),
        ("k-means", f"{km['n_rows']:,} rows, k={km['n_clusters']}: inertia {km['inertia']:.4g}, "
                    f"{km['n_iter']} iterations, {km['seconds']:.2f} s"),
        ("Keras", f"digits MLP, {kr['epochs']} epochs, global batch {kr['global_batch']}: "
                  f"test accuracy {kr['test_accuracy']:.3f}, {kr['seconds']:.1f} s (incl. TensorFlow start)"),
        ("total", f"{summary['total_seconds']:.1f} s"),
        ("wrote", ", ".join([*summary["figures"], str(out / "summary.json")])),
    ]
    width = max(len(k) for k, _ in rows)
    print()
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")
