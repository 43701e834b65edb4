"""One GPU per rank: the inventory and the choice, from faked environments and device lists."""

from __future__ import annotations

import pytest

from mpinb import gpus


def test_inventory_reads_cuda_visible_devices_first() -> None:
    assert gpus.inventory({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, driver=lambda: ["9"]) == ["0", "1", "2", "3"]
    assert gpus.inventory({"CUDA_VISIBLE_DEVICES": "GPU-ab, GPU-cd"}) == ["GPU-ab", "GPU-cd"]
    assert gpus.inventory({"CUDA_VISIBLE_DEVICES": ""}, driver=lambda: ["0"]) == []
    assert gpus.inventory({"CUDA_VISIBLE_DEVICES": "2,-1,3"}) == ["2"]  # CUDA stops at an invalid entry


def test_inventory_asks_the_driver_when_unset() -> None:
    assert gpus.inventory({}, driver=lambda: ["0", "1"]) == ["0", "1"]
    assert gpus.inventory({}, driver=lambda: []) == []


def test_four_gpus_two_ranks_per_host_on_two_hosts() -> None:
    four = ["0", "1", "2", "3"]
    seen = [("a", four), ("a", four), ("b", four), ("b", four)]
    assert gpus.assign(seen) == [("0", 1), ("1", 1), ("0", 1), ("1", 1)]


def test_local_rank_follows_rank_order_within_a_host_not_global_rank() -> None:
    two = ["4", "7"]
    seen = [("a", two), ("b", two), ("a", two), ("b", two)]
    assert gpus.assign(seen) == [("4", 1), ("4", 1), ("7", 1), ("7", 1)]


def test_three_ranks_on_two_gpus_is_an_error_naming_the_host() -> None:
    seen = [("node7", ["0", "1"])] * 3 + [("node8", ["0", "1"])] * 2
    rule = r"3 ranks on node7 see 2 GPU\(s\) \(CUDA_VISIBLE_DEVICES=0,1\).*share=True"
    with pytest.raises(ValueError, match=rule):
        gpus.assign(seen)


def test_three_ranks_on_two_gpus_share_when_asked() -> None:
    seen = [("a", ["0", "1"])] * 3
    assert gpus.assign(seen, share=True) == [("0", 2), ("1", 1), ("0", 2)]


def test_a_binding_per_task_is_respected() -> None:
    # A launcher gave each task its own GPU: every rank keeps the one it sees.
    seen = [("a", ["2"]), ("a", ["3"]), ("a", ["0", "1"]), ("a", ["0", "1"])]
    assert gpus.assign(seen) == [("2", 1), ("3", 1), ("0", 1), ("1", 1)]


def test_slurm_gpus_per_task_keeps_each_tasks_one_gpu_even_under_the_same_name() -> None:
    # Under device cgroups every task sees its own GPU as "0".
    seen = [("a", ["0"]), ("a", ["0"])]
    with pytest.raises(ValueError, match="2 ranks on a see 1 GPU"):
        gpus.assign(seen)
    assert gpus.assign(seen, bound=True) == [("0", 1), ("0", 1)]


def test_no_gpu_means_the_cpu() -> None:
    assert gpus.assign([("a", []), ("a", [])]) == [(None, 1), (None, 1)]
    assert str(gpus.Choice(None)) == "CPU"
    assert str(gpus.Choice("3")) == "GPU 3"
    assert str(gpus.Choice("0", 2, 4000)) == "GPU 0, shared by 2 ranks, 4000 MiB"


def test_one_rank_sets_its_gpu_and_memory_growth(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpus, "_chosen", None)
    monkeypatch.setattr(gpus, "tf_initialised", lambda: False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,6")
    monkeypatch.setenv("TF_FORCE_GPU_ALLOW_GROWTH", "false")
    monkeypatch.delenv("MPINB_GPUS", raising=False)
    choice = gpus.use_one_gpu_per_rank()
    assert choice == gpus.Choice("5") and gpus.device() == "GPU 5"
    import os

    assert os.environ["CUDA_VISIBLE_DEVICES"] == "5" and os.environ["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert gpus.use_one_gpu_per_rank() is choice  # decided once


def test_off_leaves_the_environment_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpus, "_chosen", None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,6")
    monkeypatch.setenv("MPINB_GPUS", "off")
    assert gpus.use_one_gpu_per_rank() == gpus.Choice(None)
    import os

    assert os.environ["CUDA_VISIBLE_DEVICES"] == "5,6"


def test_too_late_once_tensorflow_has_initialised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpus, "_chosen", None)
    monkeypatch.setattr(gpus, "tf_initialised", lambda: True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.delenv("MPINB_GPUS", raising=False)
    with pytest.raises(RuntimeError, match="already initialised its devices"):
        gpus.use_one_gpu_per_rank()
