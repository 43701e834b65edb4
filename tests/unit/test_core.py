"""One-process tests of the core: sharding arithmetic, messages, import hygiene, one-rank collectives."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import mpinb
from mpinb.agreement import compose as _compose


@pytest.mark.parametrize("n", [0, 1, 3, 10, 11, 1000])
@pytest.mark.parametrize("size", [1, 2, 3, 4, 7])
def test_shard_bounds_partition_balanced_contiguous(n: int, size: int) -> None:
    bounds = [mpinb.shard_bounds(n, rank=r, size=size) for r in range(size)]
    assert bounds[0][0] == 0 and bounds[-1][1] == n
    for (_, stop), (start, _) in zip(bounds, bounds[1:]):
        assert stop == start
    lengths = [hi - lo for lo, hi in bounds]
    assert max(lengths) - min(lengths) <= 1
    assert lengths == sorted(lengths, reverse=True)  # the extra rows go to the first ranks


def test_shard_bounds_example_from_docstring() -> None:
    assert [mpinb.shard_bounds(10, rank=r, size=4) for r in range(4)] == [(0, 3), (3, 6), (6, 8), (8, 10)]


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"n": -1, "rank": 0, "size": 1}, ValueError, "n must be >= 0"),
        ({"n": 5, "rank": 2, "size": 2}, ValueError, "rank must satisfy"),
        ({"n": 5, "rank": 0, "size": 0}, ValueError, "size must be >= 1"),
        ({"n": 5.0, "rank": 0, "size": 1}, TypeError, "n must be an integer"),
    ],
)
def test_shard_bounds_rejects_bad_arguments(kwargs: dict, exc: type, match: str) -> None:
    n = kwargs.pop("n")
    with pytest.raises(exc, match=match):
        mpinb.shard_bounds(n, **kwargs)


def test_import_does_not_start_mpi_or_import_frameworks() -> None:
    """``import mpinb`` is safe on the client: it neither initialises MPI nor loads a framework."""
    heavy = ("mpi4py.MPI", "tensorflow", "keras", "matplotlib", "ipyparallel", "sklearn", "scipy")
    code = f"import sys, mpinb; print([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]", f"import mpinb pulled in {out}"


def test_public_api_is_sorted_and_documented() -> None:
    assert mpinb.__all__ == sorted(mpinb.__all__)
    assert set(dir(mpinb)) == set(mpinb.__all__)
    for name in mpinb.__all__:
        if name in ("__version__", "KMeans"):
            continue
        obj = getattr(mpinb, name)
        doc = obj.__doc__ or ""
        assert doc.strip(), f"{name} has no docstring"


def test_public_functions_state_their_kind() -> None:
    for name in ("allreduce", "bcast", "gather_rows", "on_root", "rprint", "limit_threads", "world", "shard",
                 "check_all", "check_same", "raise_together", "shard_bounds"):
        second = (getattr(mpinb, name).__doc__ or "").strip().split("\n\n")[1]
        assert second.split(":")[0].split(".")[0].strip() in {"Collective", "Local", "Client"}, name


def test_compose_names_failing_ranks_identically() -> None:
    assert _compose({1: "empty shard"}, 4) == "empty shard [on rank 1 of 4]"
    assert _compose({0: "bad", 2: "bad"}, 3) == "bad [on ranks 0, 2 of 3]"
    assert _compose({0: "a", 1: "b"}, 2) == "rank 0: a; rank 1: b [on all 2 ranks]"


def test_allreduce_rejects_unknown_op_before_communicating() -> None:
    with pytest.raises(ValueError, match="op must be one of 'sum', 'mean', 'min', 'max'; got 'avg'"):
        mpinb.allreduce([np.ones(3)], op="avg")


def test_allreduce_rejects_non_numeric() -> None:
    with pytest.raises(TypeError, match="item 1 has dtype <U1"):
        mpinb.allreduce([np.ones(2), np.array(["a"])])


def test_limit_threads_rejects_bad_n() -> None:
    with pytest.raises(ValueError, match="positive integer"):
        mpinb.limit_threads(0)


def test_find_mpiexec_prefers_the_one_next_to_python(tmp_path, monkeypatch) -> None:
    from mpinb.client import launch

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "mpiexec").write_text("#!/bin/sh\n")
    monkeypatch.setattr(sys, "executable", str(fake / "python"))
    assert launch.find_mpiexec() == str(fake / "mpiexec")


def test_mpi_env_sets_budget_and_yield_without_overriding_user(monkeypatch) -> None:
    from mpinb.client.launch import mpi_env

    env = mpi_env(64, threads_per_rank=1, base={"OMP_NUM_THREADS": "3"})
    assert env["OMP_NUM_THREADS"] == "3"
    assert env["OPENBLAS_NUM_THREADS"] == "1"
    assert env["MPIR_CVAR_ENABLE_HEAVY_YIELD"] == "1"


def test_mpi_env_leaves_the_thread_budget_to_the_ranks() -> None:
    from mpinb.client.launch import mpi_env
    from mpinb.comm import thread_env

    # The launcher cannot know how many ranks share each host; each rank decides (limit_threads).
    env = mpi_env(64, base={})
    assert not set(thread_env(1)) & set(env), env
    assert env["MPIR_CVAR_ENABLE_HEAVY_YIELD"] == "1"
