"""MPICluster engines choose one GPU per rank by themselves when they start (faked GPU lists)."""

from __future__ import annotations

import pytest

import mpinb


def test_engines_each_take_the_gpu_of_their_local_rank() -> None:
    with mpinb.MPICluster(n=2, env={"CUDA_VISIBLE_DEVICES": "3,7"}) as cluster:
        cluster.view.execute("import os; from mpinb import gpus; seen = (gpus.device(), "
                             "os.environ.get('CUDA_VISIBLE_DEVICES'), "
                             "os.environ.get('TF_FORCE_GPU_ALLOW_GROWTH'))")
        seen = cluster.pull("seen")  # in rank order
    assert seen == [("GPU 3", "3", "true"), ("GPU 7", "7", "true")]


def test_engines_on_too_few_gpus_fail_to_start_with_the_reason() -> None:
    with pytest.raises(Exception, match="2 ranks on .* see 1 GPU"):
        with mpinb.MPICluster(n=2, env={"CUDA_VISIBLE_DEVICES": "3"}):
            pass
