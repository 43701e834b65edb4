"""The core collectives under mpiexec (world, allreduce, bcast, gather_rows, on_root, rprint,
limit_threads): correct values, and every error raised on every rank."""

from __future__ import annotations

import io
import os

import numpy as np
import pytest
from mpi4py import MPI

import mpinb
from support.mpitools import assert_everywhere, assert_same_everywhere, raises_everywhere

RANK = MPI.COMM_WORLD.Get_rank()
SIZE = MPI.COMM_WORLD.Get_size()


def test_world_describes_rank_and_node(any_comm) -> None:
    w = mpinb.world(any_comm)
    assert (w.rank, w.size) == (any_comm.Get_rank(), any_comm.Get_size())
    assert w.is_root == (w.rank == 0)
    assert 0 <= w.local_rank < w.local_size <= w.size
    assert w.comm is any_comm
    # All ranks of this test run on one machine: the node split must count all of them.
    assert w.local_size == w.size and w.local_rank == w.rank
    assert_same_everywhere(w.host.encode(), any_comm)


def test_allreduce_mixed_shapes_and_dtypes(any_comm) -> None:
    r, p = any_comm.Get_rank(), any_comm.Get_size()
    arrays = [
        np.full((3, 4), r + 1.0),
        np.arange(5, dtype=np.int32) * (r + 1),
        np.float32(r),
        7,
        np.array([r % 2 == 0, True]),
        np.full(2, r, dtype=np.float16),
        np.array([1 + 1j * r]),
    ]
    out = mpinb.allreduce(arrays, comm=any_comm)
    ranks = np.arange(p)
    np.testing.assert_array_equal(out[0], np.full((3, 4), (ranks + 1).sum(), dtype=float))
    assert out[1].dtype == np.int32 and out[1].shape == (5,)
    np.testing.assert_array_equal(out[1], np.arange(5) * (ranks + 1).sum())
    assert out[2].dtype == np.float32 and np.ndim(out[2]) == 0 and out[2] == ranks.sum()
    assert out[3] == 7 * p
    assert out[4].dtype == np.int64  # booleans are counted
    np.testing.assert_array_equal(out[4], [(ranks % 2 == 0).sum(), p])
    assert out[5].dtype == np.float16 and out[5][0] == ranks.sum()
    assert out[6][0] == p + 1j * ranks.sum()


@pytest.mark.parametrize("op", ["mean", "min", "max"])
def test_allreduce_ops(op: str, any_comm) -> None:
    r, p = any_comm.Get_rank(), any_comm.Get_size()
    vals = np.array([r, -r, 10 + r], dtype=np.int64)
    flags = np.array([r == 0, True])
    got, got_flags = mpinb.allreduce([vals, flags], op=op, comm=any_comm)
    table = np.array([[q, -q, 10 + q] for q in range(p)])
    expect = {"mean": table.mean(axis=0), "min": table.min(axis=0), "max": table.max(axis=0)}[op]
    np.testing.assert_allclose(got, expect)
    if op == "mean":
        assert got.dtype == np.float64
    else:
        assert got.dtype == np.int64
        want = [p == 1, True] if op == "min" else [True, True]
        np.testing.assert_array_equal(got_flags, want)


def test_allreduce_single_array_and_empty_list(any_comm) -> None:
    (only,) = mpinb.allreduce(np.ones(3), comm=any_comm)
    np.testing.assert_array_equal(only, np.full(3, any_comm.Get_size()))
    assert mpinb.allreduce([], comm=any_comm) == []


def test_allreduce_result_does_not_alias_the_scratch_buffer(any_comm) -> None:
    (first,) = mpinb.allreduce([np.ones(4)], comm=any_comm)
    (second,) = mpinb.allreduce([np.full(4, 2.0)], comm=any_comm)
    np.testing.assert_array_equal(first, np.full(4, any_comm.Get_size()))
    np.testing.assert_array_equal(second, np.full(4, 2.0 * any_comm.Get_size()))


def test_allreduce_into_out_and_in_place(any_comm) -> None:
    n, r = any_comm.Get_size(), any_comm.Get_rank()
    big = np.arange(70_000, dtype=np.float64) + r  # travels alone (over 256 KiB)
    arrays = [np.full(3, r + 1.0), np.int32(r), big, np.ones(40_000, np.float16)]
    want = mpinb.allreduce(arrays, op="mean", comm=any_comm)
    out = [np.zeros_like(np.asarray(w)) for w in want]
    got = mpinb.allreduce(arrays, op="mean", out=out, comm=any_comm)
    assert all(g is o for g, o in zip(got, out, strict=True))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    # out=arrays: in place, the large array straight into itself.
    inplace = [np.full(4, r + 1.0), big.copy()]
    mpinb.allreduce(inplace, out=inplace, comm=any_comm)
    np.testing.assert_array_equal(inplace[0], np.full(4, n * (n + 1) / 2))
    np.testing.assert_array_equal(inplace[1], np.arange(70_000) * n + n * (n - 1) / 2)
    # A lone small array travels alone too: in place into itself, or through a wire buffer when
    # out overlaps it without being it.
    lone = np.full(5, r + 1.0)
    assert mpinb.allreduce([lone], out=[lone], comm=any_comm)[0] is lone
    np.testing.assert_array_equal(lone, np.full(5, n * (n + 1) / 2))
    view = lone.reshape(5)
    mpinb.allreduce([lone], out=[view], comm=any_comm)
    np.testing.assert_array_equal(lone, np.full(5, n * n * (n + 1) / 2))
    # An integer mean into float64 out, large and small: the int64 wire is not the result's dtype.
    ints = [np.arange(40_000, dtype=np.int64) + r, np.int64(r)]
    means = mpinb.allreduce(ints, op="mean", out=[np.zeros(40_000), np.zeros(())], comm=any_comm)
    np.testing.assert_array_equal(means[0], np.arange(40_000) + (n - 1) / 2)
    assert means[1] == (n - 1) / 2
    with pytest.raises(ValueError, match=r"out\[0\] must be a writeable array of shape \(3,\) and dtype float64"):
        mpinb.allreduce([np.ones(3)], out=[np.ones(2)], comm=any_comm)


def test_allreduce_reuses_its_wire_buffers_once_results_are_dropped(any_comm) -> None:
    from mpinb._collective.fused import plan as _plan

    arrays = [np.ones(5), np.ones(40_000)]
    plan = _plan([np.asarray(a) for a in arrays], "sum")
    kept = mpinb.allreduce(arrays, comm=any_comm)
    for _ in range(4):
        mpinb.allreduce(arrays, comm=any_comm)  # results dropped at once: one set serves them all
    # One set in use by ``kept``, one reused for the four dropped results; ``kept`` intact.
    assert plan.pool.made == 2
    np.testing.assert_array_equal(kept[1], np.full(40_000, any_comm.Get_size()))


def test_packed_results_held_by_the_caller_are_never_overwritten(any_comm) -> None:
    """Small arrays' results are views of a reused wire buffer, made once per set of buffers: a
    result still held, or a view of one, keeps its set from the next calls; dropped, it is reused."""
    from mpinb._collective.fused import plan as _plan

    arrays = [np.ones(3), np.ones((2, 2)), np.float64(1.0)]
    plan = _plan([np.asarray(a) for a in arrays], "mean")
    first = mpinb.allreduce(arrays, op="mean", comm=any_comm)
    whole, row = first[0], first[1][1]  # a result itself, and a view of another
    del first
    for scale in (2.0, 3.0):
        again = mpinb.allreduce([a * scale for a in arrays], op="mean", comm=any_comm)
        assert again[0] is not whole
        np.testing.assert_array_equal(again[0], np.full(3, scale))
        assert again[2] == scale
        del again
    np.testing.assert_array_equal(whole, np.ones(3))
    np.testing.assert_array_equal(row, np.ones(2))
    del whole
    mpinb.allreduce(arrays, op="mean", comm=any_comm)
    assert plan.pool.made == 2  # ``row`` alone still holds the first set
    del row
    mpinb.allreduce(arrays, op="mean", comm=any_comm)
    assert plan.pool.made == 2


def test_allreduce_uses_one_buffer_collective_per_dtype(comm) -> None:
    from support.counting import CountingComm

    base = comm.Dup()
    counted = CountingComm(base)
    mpinb.world(counted)  # mpinb's set-up on a communicator new to it
    del counted.calls[:]
    arrays = [np.ones(3), np.ones((2, 2)), np.int32(1), np.ones(5, dtype=np.int32), np.ones(1)]
    mpinb.allreduce(arrays, comm=counted)
    reductions = [m for m, _ in counted.calls if m == "Iallreduce"]
    base.Free()
    # The arrival message (it checks the layout) plus one per dtype (float64, int32); none on one rank.
    assert len(reductions) == (0 if SIZE == 1 else 3), counted.calls


@pytest.mark.mpi_sizes(2, 3, 4)
def test_allreduce_shape_mismatch_raises_everywhere(comm) -> None:
    shape = (3,) if RANK != 1 else (4,)
    with raises_everywhere(mpinb.CollectiveMismatchError,
                           match=r"shapes, dtypes and op must be the same on every rank"):
        mpinb.allreduce([np.ones(2), np.ones(shape)], comm=comm)


@pytest.mark.mpi_sizes(2, 3, 4)
def test_allreduce_dtype_mismatch_raises_everywhere(comm) -> None:
    value = 1.0 if RANK == SIZE - 1 else 1
    with raises_everywhere(mpinb.CollectiveMismatchError, match=f"rank {SIZE - 1}: "):
        mpinb.allreduce([value], comm=comm)


@pytest.mark.mpi_sizes(2, 3, 4)
def test_allreduce_count_and_op_mismatch_raise_everywhere(comm) -> None:
    items = [np.ones(2)] * (2 if RANK == 0 else 1)
    with raises_everywhere(mpinb.CollectiveMismatchError):
        mpinb.allreduce(items, comm=comm)
    with raises_everywhere(mpinb.CollectiveMismatchError, match="'max'"):
        mpinb.allreduce([np.ones(2)], op="max" if RANK == 0 else "sum", comm=comm)


def test_bcast_array_by_buffer_and_objects(any_comm) -> None:
    root = any_comm.Get_size() - 1
    mine = np.arange(12.0).reshape(3, 4) if any_comm.Get_rank() == root else None
    got = mpinb.bcast(mine, root=root, comm=any_comm)
    np.testing.assert_array_equal(got, np.arange(12.0).reshape(3, 4))
    assert got.flags.writeable
    obj = {"lr": 0.1, "names": ["a", "b"]} if any_comm.Get_rank() == 0 else None
    assert mpinb.bcast(obj, comm=any_comm) == {"lr": 0.1, "names": ["a", "b"]}


def test_bcast_unpicklable_raises_everywhere(any_comm) -> None:
    r, p = any_comm.Get_rank(), any_comm.Get_size()
    root = p - 1  # the message must name the sender, which is not rank 0 from two ranks on
    obj = (lambda x: x) if r == root else None
    if p == 1:
        # Nothing leaves the only rank, so nothing is pickled: it gets its own object back, not a copy.
        assert mpinb.bcast(obj, root=root, comm=any_comm) is obj
    else:
        with raises_everywhere(TypeError, match=f"bcast could not pickle function on rank {root}: ", comm=any_comm):
            mpinb.bcast(obj, root=root, comm=any_comm)
    # The failed broadcast left nothing behind: the next one delivers root's object everywhere.
    assert mpinb.bcast({"after": root} if r == root else None, root=root, comm=any_comm) == {"after": root}


def test_bcast_bad_root_raises_everywhere(comm) -> None:
    with raises_everywhere(ValueError, match=f"root must be a rank between 0 and {SIZE - 1}; got {SIZE}"):
        mpinb.bcast(1, root=SIZE, comm=comm)


def test_gather_rows_uneven_in_rank_order(any_comm) -> None:
    r, p = any_comm.Get_rank(), any_comm.Get_size()
    local = np.full((r + 1, 2), r, dtype=np.int16)  # rank r has r+1 rows; rank 0 may be the only one
    everywhere = mpinb.gather_rows(local, root=None, comm=any_comm)
    expect = np.concatenate([np.full((q + 1, 2), q, dtype=np.int16) for q in range(p)])
    np.testing.assert_array_equal(everywhere, expect)
    assert everywhere.dtype == np.int16
    at_root = mpinb.gather_rows(local, comm=any_comm)
    if r == 0:
        np.testing.assert_array_equal(at_root, expect)
    else:
        assert at_root is None


def test_gather_rows_empty_shards_and_1d(any_comm) -> None:
    r = any_comm.Get_rank()
    local = np.arange(3.0) + 10 * r if r % 2 == 0 else np.empty(0)
    got = mpinb.gather_rows(local, root=None, comm=any_comm)
    expect = np.concatenate([np.arange(3.0) + 10 * q for q in range(any_comm.Get_size()) if q % 2 == 0])
    np.testing.assert_array_equal(got, expect)


def test_gather_rows_objects_fall_back_to_pickle(any_comm) -> None:
    got = mpinb.gather_rows(np.array([f"r{any_comm.Get_rank()}"]), root=None, comm=any_comm)
    assert list(got) == [f"r{q}" for q in range(any_comm.Get_size())]


@pytest.mark.mpi_sizes(2, 3, 4)
def test_gather_rows_width_mismatch_raises_everywhere(comm) -> None:
    local = np.zeros((2, 3 if RANK == 1 else 2))
    with raises_everywhere(mpinb.CollectiveMismatchError, match=r"rank 1: rows of shape \(3,\)"):
        mpinb.gather_rows(local, comm=comm)


@pytest.mark.mpi_sizes(2, 3, 4)
@pytest.mark.parametrize("root", [0, None])
def test_gather_rows_0d_on_one_rank_raises_everywhere(comm, root) -> None:
    # Only rank 1 passes a scalar: the others must raise with it, not wait for it (or gather it as a row).
    local = np.float64(RANK) if RANK == 1 else np.arange(2.0)
    with raises_everywhere(ValueError, match=rf"got a 0-d value \(a scalar\) on rank 1 of {SIZE}\. Pass a 1-D"):
        mpinb.gather_rows(local, root=root, comm=comm)
    # mpinb's own communicator is still usable: the next gather pairs with the next gather.
    got = mpinb.gather_rows(np.atleast_1d(np.float64(RANK)), root=None, comm=comm)
    np.testing.assert_array_equal(got, np.arange(float(SIZE)))


def test_on_root_returns_everywhere(any_comm) -> None:
    got = mpinb.on_root(lambda a, b=0: np.arange(a) + b, 4, b=any_comm.Get_size(), comm=any_comm)
    np.testing.assert_array_equal(got, np.arange(4) + any_comm.Get_size())


def test_on_root_reraises_roots_exception_everywhere(comm) -> None:
    def boom() -> None:
        raise FileNotFoundError("config.yaml not found")

    with raises_everywhere(FileNotFoundError, match="config.yaml not found") as info:
        mpinb.on_root(boom, comm=comm)
    if RANK > 0:
        assert any("mpinb.on_root" in note for note in info.value.__notes__)


def test_on_root_runs_only_on_root(comm, tmp_path_factory) -> None:
    calls = []
    mpinb.on_root(calls.append, 1, comm=comm)
    assert_everywhere(len(calls) == (1 if RANK == 0 else 0), "on_root ran fn on root only", comm)


def test_rprint_orders_by_rank(comm) -> None:
    buf = io.StringIO()
    mpinb.rprint("hello", RANK, comm=comm, file=buf)
    lines = buf.getvalue().splitlines()
    if RANK == 0:
        assert lines == [f"[rank {r}/{SIZE}] hello {r}" for r in range(SIZE)]
    else:
        assert lines == []
    buf = io.StringIO()
    mpinb.rprint("only root", comm=comm, root_only=True, file=buf)
    assert buf.getvalue() == (f"[rank 0/{SIZE}] only root\n" if RANK == 0 else "")


def test_limit_threads_shares_the_node(comm) -> None:
    from threadpoolctl import threadpool_info

    n = mpinb.limit_threads(comm=comm)
    cores = len(os.sched_getaffinity(0))
    assert n == max(1, cores // SIZE)
    assert os.environ["OMP_NUM_THREADS"] == str(n)
    assert all(pool["num_threads"] <= n for pool in threadpool_info())
    assert mpinb.limit_threads(1, comm=comm) == 1


@pytest.mark.mpi_sizes(2, 3, 4)
def test_long_layout_mismatch_message_is_clipped_to_the_difference(comm) -> None:
    arrays = [np.ones(100 + i) for i in range(50)]
    if RANK == 1:
        arrays[40] = np.ones(7)
    with raises_everywhere(mpinb.CollectiveMismatchError) as info:
        mpinb.allreduce(arrays, comm=comm)
    message = str(info.value)
    assert len(message) < 600 and "(7,)" in message and "(140,)" in message


def test_allreduce_large_payload_is_segmented_and_exact(any_comm) -> None:
    r, p = any_comm.Get_rank(), any_comm.Get_size()
    big = np.arange(2_500_000, dtype=np.float64) * (r + 1)  # 20 MB: five 4 MiB segments
    small = np.full(3, float(r))
    out_big, out_small = mpinb.allreduce([big, small], comm=any_comm)
    factor = p * (p + 1) / 2
    np.testing.assert_array_equal(out_big, np.arange(2_500_000, dtype=np.float64) * factor)
    np.testing.assert_array_equal(out_small, np.full(3, p * (p - 1) / 2))
