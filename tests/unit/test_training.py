"""The framework-neutral training core in one process: batch plans, packing, stop decisions, checkpoint records."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from mpinb import _layout
from mpinb._training import packing
from mpinb._training.checkpoint import save_atomically, saved_epoch
from mpinb._training.exchange import GradientExchange
from mpinb._training.plan import epoch_batches, proportional_sizes, steps_per_epoch, steps_per_execution
from mpinb._training.stopping import JointStop
from mpinb.interrupt import StopFlag
from support.counting import count_calls


def test_the_core_imports_no_framework():
    code = ("import pkgutil, importlib, sys, mpinb._training as core\n"
            "for m in pkgutil.iter_modules(core.__path__): importlib.import_module(f'mpinb._training.{m.name}')\n"
            "assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_epoch_batches_are_disjoint_reproducible_and_reshuffled():
    a = epoch_batches(103, per_rank_batch=10, steps=10, epoch=0, seed=7, rank=1, shuffle=True)
    assert a.shape == (10, 10) and len(np.unique(a)) == 100 and a.max() < 103
    np.testing.assert_array_equal(a, epoch_batches(103, per_rank_batch=10, steps=10, epoch=0, seed=7, rank=1,
                                                   shuffle=True))
    assert not np.array_equal(a, epoch_batches(103, per_rank_batch=10, steps=10, epoch=1, seed=7, rank=1, shuffle=True))
    assert not np.array_equal(a, epoch_batches(103, per_rank_batch=10, steps=10, epoch=0, seed=7, rank=2, shuffle=True))
    np.testing.assert_array_equal(
        epoch_batches(25, per_rank_batch=4, steps=3, epoch=5, seed=0, rank=0, shuffle=False),
        np.arange(12).reshape(3, 4),
    )
    assert steps_per_epoch([450, 449, 449, 449], 8) == 56
    assert steps_per_epoch([100, 7], 8) == 0


@pytest.mark.parametrize(("requested", "steps", "expected"),
                         [(1, 28, 1), (4, 28, 4), (8, 28, 7), (8, 13, 1), (50, 28, 28), (6, 2, 2)])
def test_steps_per_execution_divides_the_epoch(requested, steps, expected):
    assert steps_per_execution(requested, steps) == expected


@pytest.mark.parametrize("compiled", [True, False], ids=["numba", "numpy"])
def test_packer_reuses_idle_buffers_and_never_overwrites_live_views(monkeypatch, compiled):
    if not compiled:
        monkeypatch.setattr(packing, "_scale_kernel", lambda: None)
    allocations = count_calls(monkeypatch, _layout, "_BufferSet")
    grads = (np.ones((3, 5), np.float32), np.full(7, 2.0, np.float32), np.arange(4.0))
    packer = packing.Packer(grads)
    first, views, finite = packer.fill(grads, 0.5)
    assert finite
    assert all(v.ctypes.data % 64 == 0 for v in views)  # TensorFlow wraps aligned arrays without a copy
    np.testing.assert_array_equal(views[0], np.full((3, 5), 0.5))
    np.testing.assert_array_equal(views[2], np.arange(4.0) / 2)
    # No room for votes: they ride in the arrival.
    assert sum(b.size for b in first) == packer.plan.lengths[0] + packer.plan.lengths[1]
    second, _, _ = packer.fill(grads, 0.25)  # `views` still alive: a new set of buffers
    assert second[0].ctypes.data != first[0].ctypes.data
    np.testing.assert_array_equal(views[0], np.full((3, 5), 0.5))
    held = views[1]  # one view, held alone (TensorFlow may keep one tensor of a step)
    del views, first
    third, _, _ = packer.fill(grads, 0.125)
    assert third[0].ctypes.data == second[0].ctypes.data  # its views dropped: reused; the first is held
    np.testing.assert_array_equal(held, np.full(7, 1.0))  # never overwritten while held
    del held, second, third
    packer.fill(grads, 1.0)  # everything released: an old set is reused
    assert len(allocations) == 2
    for bad in (np.nan, np.inf, -np.inf):
        broken = (grads[0], np.array([1, 2, bad, 4, 5, 6, 7], np.float32), grads[2])
        assert not packer.fill(broken, 1.0)[2]  # this rank's non-finite vote
        # A rank without rows in the step sends zeros, and its empty batch's NaN does not vote.
        bufs, _, finite = packer.fill(broken, 0.0)
        assert finite and all(not b.any() for b in bufs)


@pytest.mark.parametrize(("counts", "batch"), [((100, 200, 300), 64), ((1, 300, 299), 64), ((0, 250, 350), 64),
                                             ((600,), 64), ((3, 0, 2), 2), ((7, 7, 7, 7), 28), ((5, 9), 100)])
def test_proportional_sizes_use_every_row_once_in_global_batches_split_by_share(counts, batch):
    sizes = proportional_sizes(counts, batch)
    total = sum(counts)
    assert sizes.shape == (-(-total // batch), len(counts)) and (sizes >= 0).all()
    np.testing.assert_array_equal(sizes.sum(axis=0), counts)  # every row of every rank, once
    assert (sizes.sum(axis=1)[:-1] == batch).all() and 0 < sizes.sum(axis=1)[-1] <= batch  # Keras's last batch
    share = np.outer(sizes.sum(axis=1), counts) / total
    assert np.abs(sizes - share).max() < 1 + 1e-9  # each rank's share of each step, within one row
    np.testing.assert_array_equal(sizes, proportional_sizes(list(counts), batch))  # a pure function


def test_the_exchange_weighs_each_rank_by_its_rows_and_takes_votes_from_the_arrival():
    from mpi4py import MPI

    ex = GradientExchange(MPI.COMM_SELF)
    ex.weigh_by_rows(np.array([3, 0, 2]), np.array([4, 4, 2]))
    np.testing.assert_array_equal(ex.reduce(np.ones(3))[0], np.full(3, 0.75))  # scaled by b_r / B before the sum
    ex.votes = (1.0, 0.0)
    np.testing.assert_array_equal(ex.reduce(np.array([np.nan, 1.0, 1.0]))[0], np.zeros(3))  # no rows here: zeros
    assert ex.take_votes() == (True, False, False)  # the interrupt arrived; a weight-0 NaN does not vote
    ex.votes = (0.0, 1.0)
    assert ex.reduce(np.array([np.inf, 1.0, 1.0]))[0][1] == 1.0
    assert ex.take_votes() == (False, True, True)
    assert ex.take_votes() == (False, False, False)


def test_joint_stop_keeps_the_first_reason_and_raises_it():
    joint = JointStop(StopFlag(), comm=None)  # decide and raise are local: no communicator needed
    assert not joint.decide(False, False, False, 0, 3) and joint.stopped is None
    joint.hold()
    assert joint.votes == (0.0, 1.0)
    assert joint.decide(False, False, True, 1, 4) and joint.stopped == ("callback", 1, 4)
    assert joint.votes == (0.0, 0.0)  # the held request is spent
    assert joint.decide(True, True, False, 2, None) and joint.stopped == ("callback", 1, 4)
    joint.raise_if_stopped()  # a callback's stop is no error
    joint.stopped = None
    joint.decide(False, True, True, 0, None)
    with pytest.raises(FloatingPointError, match="NaN or infinite at epoch 1 end"):
        joint.raise_if_stopped()
    joint.stopped = None
    joint.decide(True, True, True, 2, 6)
    with pytest.raises(KeyboardInterrupt, match="training stopped at epoch 3, step 7"):
        joint.raise_if_stopped()


def test_checkpoint_record_follows_a_complete_file(tmp_path):
    path = str(tmp_path / "sub" / "m.keras")
    assert saved_epoch(path) is None

    def write(tmp):
        assert tmp.endswith(".keras") and tmp != path
        with open(tmp, "w") as fh:
            fh.write("model")

    save_atomically(write, path, 4)
    assert saved_epoch(path) == 4 and json.loads(open(f"{path}.json").read())["epoch"] == 4
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["m.keras", "m.keras.json"]
    (tmp_path / "sub" / "m.keras.json").unlink()
    with pytest.raises(FileNotFoundError, match="epoch record"):
        saved_epoch(path)
