"""One GPU per rank at 1-4 ranks, from faked CUDA_VISIBLE_DEVICES lists (no GPU needed)."""

from __future__ import annotations

import os

import pytest

from mpinb import gpus
from support.mpitools import raises_everywhere


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch, comm) -> pytest.MonkeyPatch:
    monkeypatch.setattr(gpus, "_chosen", None)
    monkeypatch.setattr(gpus, "tf_initialised", lambda: False)  # the suite's TensorFlow runs on the CPU
    monkeypatch.delenv("MPINB_GPUS", raising=False)
    monkeypatch.delenv("SLURM_GPUS_PER_TASK", raising=False)
    monkeypatch.setenv("TF_FORCE_GPU_ALLOW_GROWTH", "false")
    return monkeypatch


def test_each_rank_gets_the_gpu_of_its_local_rank(fresh, comm) -> None:
    fresh.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    choice = gpus.use_one_gpu_per_rank(comm=comm)
    assert comm.allgather(choice.gpu) == [str(r) for r in range(comm.Get_size())]
    assert os.environ["CUDA_VISIBLE_DEVICES"] == str(comm.Get_rank())
    assert os.environ["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"


@pytest.mark.mpi_sizes(2, 3, 4)
def test_more_ranks_than_gpus_fails_on_every_rank(fresh, comm) -> None:
    fresh.setenv("CUDA_VISIBLE_DEVICES", "5")
    rule = rf"{comm.Get_size()} ranks on .* see 1 GPU\(s\) \(CUDA_VISIBLE_DEVICES=5\)"
    with raises_everywhere(ValueError, match=rule):
        gpus.use_one_gpu_per_rank(comm=comm)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "5"


@pytest.mark.mpi_sizes(2, 3, 4)
def test_more_ranks_than_gpus_share_when_asked(fresh, comm) -> None:
    fresh.setenv("CUDA_VISIBLE_DEVICES", "5")
    fresh.setenv("MPINB_GPUS", "share")
    choice = gpus.use_one_gpu_per_rank(memory_limit_mb=1000, comm=comm)
    assert choice == gpus.Choice("5", comm.Get_size(), 1000)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "5"


def test_a_binding_per_task_is_kept(fresh, comm) -> None:
    fresh.setenv("CUDA_VISIBLE_DEVICES", str(10 + comm.Get_rank()))
    choice = gpus.use_one_gpu_per_rank(comm=comm)
    assert choice.gpu == str(10 + comm.Get_rank()) and choice.sharers == 1
