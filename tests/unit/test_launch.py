"""Finding mpiexec and the environment of ranks started from this machine."""

from __future__ import annotations

import sys


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
    assert env["PRTE_MCA_rmaps_default_mapping_policy"] == ":oversubscribe"  # Open MPI's leave
    mine = mpi_env(64, base={"PRTE_MCA_rmaps_default_mapping_policy": "slot"})
    assert mine["PRTE_MCA_rmaps_default_mapping_policy"] == "slot"
    assert "PRTE_MCA_rmaps_default_mapping_policy" not in mpi_env(1, base={})


def test_mpi_env_leaves_the_thread_budget_to_the_ranks() -> None:
    from mpinb.client.launch import mpi_env
    from mpinb.comm import thread_env

    # The launcher cannot know how many ranks share each host; each rank decides (limit_threads).
    env = mpi_env(64, base={})
    assert not set(thread_env(1)) & set(env), env
    assert env["MPIR_CVAR_ENABLE_HEAVY_YIELD"] == "1"
