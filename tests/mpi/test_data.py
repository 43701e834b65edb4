"""mpinb.data under mpiexec: shards gathered in rank order are byte-identical to the one-rank data,
errors are raised on every rank, and memory per rank follows its shard."""

from __future__ import annotations

import shutil
import tempfile
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

import mpinb
from mpinb import data
from support.mpitools import assert_everywhere, assert_same_everywhere, raises_everywhere

RANK = MPI.COMM_WORLD.Get_rank()
SIZE = MPI.COMM_WORLD.Get_size()
SELF = MPI.COMM_SELF


@pytest.fixture
def shared_dir(comm) -> Iterator[Path]:
    """A temporary directory every rank sees: made on rank 0, its path broadcast, removed after."""
    path = tempfile.mkdtemp(prefix="mpinb-data-") if RANK == 0 else None
    path = Path(comm.bcast(path, root=0))
    try:
        yield path
    finally:
        comm.Barrier()
        if RANK == 0:
            shutil.rmtree(path, ignore_errors=True)


def save_on_root(comm, path: Path, array_fn) -> None:
    """Rank 0 writes the file; the barrier makes it visible before anyone reads."""
    if RANK == 0:
        np.save(path, array_fn())
    comm.Barrier()


def assert_gathers_to(local: np.ndarray, full: np.ndarray, comm) -> None:
    gathered = mpinb.gather_rows(local, root=None, comm=comm)
    ok = gathered.dtype == full.dtype and gathered.shape == full.shape and gathered.tobytes() == full.tobytes()
    assert_everywhere(ok, "shards gathered in rank order are byte-identical to the one-rank data", comm)


# ------------------------------------------------------------------------------ byte-identical shards


@pytest.mark.parametrize("name", ["load_digits", "load_iris", "load_wine", "load_breast_cancer"])
def test_bundled_shards_gather_to_the_full_split(name: str, comm) -> None:
    loader = getattr(data, name)
    mine = loader(comm=comm, test_size=0.2, random_state=11)
    full = loader(shard=False, test_size=0.2, random_state=11)
    on_self = loader(comm=SELF, test_size=0.2, random_state=11)
    for local, whole, alone in zip(mine, full, on_self, strict=True):
        assert_gathers_to(local, whole, comm)
        assert alone.tobytes() == whole.tobytes()
    assert_everywhere(len(mine.X_train) == len(mine.y_train), "X and y shards have the same length", comm)


def test_bundled_fresh_seed_is_agreed_by_all_ranks(comm) -> None:
    # With random_state=None each rank must still use the same split, or rows would be duplicated
    # and lost across shards. Train + test together must be exactly the digits, each row once.
    import sklearn.datasets

    X_train, X_test, y_train, y_test = data.load_digits(random_state=None, comm=comm)
    rows = mpinb.gather_rows(np.column_stack([np.concatenate([X_train, X_test]), np.concatenate([y_train, y_test])]),
                             root=None, comm=comm)
    bunch = sklearn.datasets.load_digits()
    want = np.column_stack([bunch.data, bunch.target])
    ok = rows.shape == want.shape and np.array_equal(
        rows[np.lexsort(rows.T[::-1])], want[np.lexsort(want.T[::-1])]
    )
    assert_everywhere(ok, "train + test shards are a permutation of the digits", comm)


GENERATORS = {
    "blobs": lambda n, **kw: data.make_blobs(n, 5, 4, cluster_std=0.7, random_state=3, **kw),
    "blobs-centers": lambda n, **kw: data.make_blobs(n, centers=[[0, 0], [5, 5]], dtype=np.float32, **kw),
    "classification": lambda n, **kw: data.make_classification(n, 8, 3, n_informative=4, flip_y=0.1, **kw),
}


@pytest.mark.parametrize("name", sorted(GENERATORS))
@pytest.mark.parametrize("n", [0, 3, 1024, 4099])
def test_generated_shards_gather_to_the_one_rank_data(name: str, n: int, comm) -> None:
    gen = GENERATORS[name]
    X, y = gen(n, comm=comm)
    lo, hi = mpinb.shard_bounds(n, rank=RANK, size=SIZE)
    assert_everywhere(len(X) == len(y) == hi - lo, "each rank generates exactly its shard_bounds rows", comm)
    X_self, y_self = gen(n, comm=SELF)
    X_all, y_all = gen(n, shard=False)
    assert X_self.tobytes() == X_all.tobytes() and y_self.tobytes() == y_all.tobytes()
    assert_gathers_to(X, X_all, comm)
    assert_gathers_to(y, y_all, comm)


def test_generators_with_fresh_seed_agree_across_ranks(comm) -> None:
    assert_same_everywhere(data._synthetic.shared_seed(None, True, comm), comm)
    X, y = data.make_blobs(1000, random_state=None, comm=comm)
    labels = mpinb.gather_rows(y, root=None, comm=comm)
    # Rows of a cluster lie around one centre: within-cluster spread is the noise (std 1). Ranks
    # with different seeds would put cluster c around different centres in the 20-wide box.
    Xg = mpinb.gather_rows(X, root=None, comm=comm)
    spread = max(Xg[labels == c].std(axis=0).max() for c in range(3) if (labels == c).any())
    assert_everywhere(spread < 1.5, f"within-cluster spread {spread:.2f} < 1.5", comm)


@pytest.mark.parametrize(
    "array_fn",
    [
        lambda: np.arange(3 * 1001, dtype=np.float64).reshape(1001, 3),
        lambda: np.arange(13, dtype=np.int32),
        lambda: np.arange(2 * 3 * 5, dtype=np.float32).reshape(5, 3, 2),
        lambda: np.asfortranarray(np.arange(4 * 9, dtype=np.int16).reshape(9, 4)),
        lambda: np.arange(6.0).reshape(2, 3),  # fewer rows than ranks at 3 and 4
        lambda: np.zeros((0, 4)),
    ],
    ids=["2d", "1d", "3d", "fortran", "2rows", "empty"],
)
def test_load_npy_shards_gather_to_the_file(array_fn, comm, shared_dir: Path) -> None:
    path = shared_dir / "a.npy"
    save_on_root(comm, path, array_fn)
    local = data.load_npy(path, comm=comm)
    lo, hi = mpinb.shard_bounds(len(array_fn()), rank=RANK, size=SIZE)
    assert_everywhere(len(local) == hi - lo and local.flags.c_contiguous and local.flags.owndata, "shard", comm)
    full = np.ascontiguousarray(np.load(path))
    assert_gathers_to(local, full, comm)
    assert data.load_npy(path, comm=SELF).tobytes() == full.tobytes()


# ----------------------------------------------------------------------------- errors on every rank


def test_load_npy_missing_file_everywhere(comm, shared_dir: Path) -> None:
    where = "the only rank" if SIZE == 1 else f"all {SIZE} ranks"
    with raises_everywhere(FileNotFoundError, match=rf"No such file.*nope\.npy.*\[on {where}\]", comm=comm):
        data.load_npy(shared_dir / "nope.npy", comm=comm)


@pytest.mark.parametrize(
    ("array_fn", "kwargs", "exc", "match"),
    [
        (lambda: np.arange(5.0), {"ndim": 2}, ValueError, r"must hold a 2-D array; got shape \(5,\)"),
        (lambda: np.float32(1.0), {}, ValueError, "holds a 0-d array"),
        (lambda: np.array([{}, []], dtype=object), {}, ValueError, "holds Python objects"),
    ],
    ids=["ndim", "0-d", "objects"],
)
def test_load_npy_wrong_content_everywhere(array_fn, kwargs, exc, match, comm, shared_dir: Path) -> None:
    path = shared_dir / "bad.npy"
    save_on_root(comm, path, array_fn)
    with raises_everywhere(exc, match=match, comm=comm):
        data.load_npy(path, comm=comm, **kwargs)


def test_load_npy_not_npy_everywhere(comm, shared_dir: Path) -> None:
    path = shared_dir / "text.npy"
    if RANK == 0:
        path.write_text("x,y\n1,2\n")
    comm.Barrier()
    with raises_everywhere(ValueError, match=r"text\.npy' is not a valid \.npy file", comm=comm):
        data.load_npy(path, comm=comm)


@pytest.mark.mpi_sizes(2, 3, 4)
def test_load_npy_path_on_some_ranks_only(comm, shared_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Node-local disks, simulated: each rank works in its own directory, and the same relative
    # path exists only in rank 0's.
    mine = shared_dir / f"rank{RANK}"
    mine.mkdir()
    monkeypatch.chdir(mine)
    if RANK == 0:
        np.save("x.npy", np.arange(10.0))
    comm.Barrier()
    others = "1" if SIZE == 2 else f"1-{SIZE - 1}"  # consecutive ranks are written as a range
    label = "rank" if SIZE == 2 else "ranks"
    with raises_everywhere(FileNotFoundError, match=rf"No such file.*x\.npy.*\[on {label} {others} of {SIZE}\]",
                           comm=comm):
        data.load_npy("x.npy", comm=comm)


@pytest.mark.mpi_sizes(2, 3, 4)
def test_load_npy_different_files_across_ranks(comm, shared_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mine = shared_dir / f"rank{RANK}"
    mine.mkdir()
    monkeypatch.chdir(mine)
    np.save("x.npy", np.zeros((10 + RANK % 2, 3)))
    comm.Barrier()
    with raises_everywhere(mpinb.CollectiveMismatchError, match=r"'x\.npy' must be the same on every rank", comm=comm):
        data.load_npy("x.npy", comm=comm)


def test_generator_argument_error_everywhere(comm) -> None:
    with raises_everywhere(ValueError, match="n_informative must be <= n_features", comm=comm):
        data.make_classification(100, 4, n_informative=5, comm=comm)


# ------------------------------------------------------------------------------------ memory per rank


def _peak(fn) -> tuple[int, object]:
    """Peak bytes allocated while ``fn`` runs; tracemalloc sees NumPy's data buffers."""
    tracemalloc.start()
    try:
        result = fn()
        return tracemalloc.get_traced_memory()[1], result
    finally:
        tracemalloc.stop()


SLACK = 1 << 20  # bookkeeping and one generator block, far below any shard here


def test_load_npy_memory_follows_the_shard(comm, shared_dir: Path) -> None:
    rows, cols = 600_000, 10  # 48 MB of float64
    path = shared_dir / "big.npy"
    save_on_root(comm, path, lambda: np.ones((rows, cols)))
    comm.Barrier()
    peak, local = _peak(lambda: data.load_npy(path, ndim=2, comm=comm))
    shard_bytes = local.nbytes
    total = rows * cols * 8
    lo, hi = mpinb.shard_bounds(rows, rank=RANK, size=SIZE)
    assert_everywhere(shard_bytes == (hi - lo) * cols * 8, "shard size", comm)
    assert_everywhere(shard_bytes <= peak <= shard_bytes + SLACK,
                      f"peak {peak:,} B within [shard {shard_bytes:,}, shard + 1 MiB]", comm)
    fractions = comm.allgather(peak / total)
    assert_everywhere(all(abs(f - 1 / SIZE) < 0.03 for f in fractions),
                      f"each rank allocates ~1/{SIZE} of the file: {fractions}", comm)
    del local


def test_make_blobs_memory_follows_the_shard(comm) -> None:
    n, d = 800_000, 4  # 25.6 MB of X and 6.4 MB of y in all
    peak, (X, y) = _peak(lambda: data.make_blobs(n, d, 5, comm=comm))
    shard_bytes = X.nbytes + y.nbytes
    assert_everywhere(shard_bytes <= peak <= shard_bytes + SLACK,
                      f"peak {peak:,} B within [shard {shard_bytes:,}, shard + 1 MiB]", comm)
    fractions = comm.allgather(peak / (n * (d + 1) * 8))
    assert_everywhere(all(abs(f - 1 / SIZE) < 0.03 for f in fractions),
                      f"each rank allocates ~1/{SIZE} of the data set: {fractions}", comm)


# ------------------------------------------------------------------------- shard_files, shard_dataset


def write_files_on_root(comm, directory: Path, n: int, *, prefix: str = "part") -> list[str]:
    """Rank 0 writes ``n`` small files, in an order unlike their sorted one; returns the sorted paths."""
    names = [f"{prefix}-{i:04d}.bin" for i in range(n)]
    if RANK == 0:
        directory.mkdir(parents=True, exist_ok=True)
        for name in reversed(names):
            (directory / name).write_bytes(name.encode())
    comm.Barrier()
    return sorted(str(directory / name) for name in names)


@pytest.mark.parametrize("per_rank", [1, 2, 3.5], ids=["one", "two", "uneven"])
def test_shard_files_partition_the_sorted_list_in_rank_order(per_rank: float, comm, shared_dir: Path) -> None:
    n = int(per_rank * SIZE) + (1 if per_rank % 1 else 0)
    files = write_files_on_root(comm, shared_dir / "parts", n)
    by_pattern = data.shard_files(str(shared_dir / "parts" / "part-*.bin"), comm=comm)
    # Each rank lists the paths in its own order, as Paths: the sorted list is what must agree.
    order = np.random.default_rng(RANK).permutation(n)
    by_list = data.shard_files([Path(files[i]) for i in order], comm=comm)
    lo, hi = mpinb.shard_bounds(n, rank=RANK, size=SIZE)
    assert_everywhere(by_pattern == by_list == files[lo:hi], "this rank's files are its shard_bounds run", comm)
    everyone = comm.allgather(by_pattern)
    assert_everywhere([f for mine in everyone for f in mine] == files, "rank order concatenates to the sorted list",
                      comm)
    assert_everywhere(min(map(len, everyone)) >= 1 and max(map(len, everyone)) - min(map(len, everyone)) <= 1,
                      f"balanced, none empty: {list(map(len, everyone))}", comm)
    assert data.shard_files(files, comm=SELF) == files


@pytest.mark.mpi_sizes(2, 3, 4)
def test_shard_files_different_lists_across_ranks(comm, shared_dir: Path) -> None:
    files = write_files_on_root(comm, shared_dir, 2 * SIZE + 1)
    mine = files if RANK < SIZE - 1 else files[:-1]  # the last rank misses one
    with raises_everywhere(mpinb.CollectiveMismatchError,
                           match=r"the sorted list of files passed to shard_files must be the same on every rank, "
                                 rf"but differs across {SIZE} ranks",
                           comm=comm):
        data.shard_files(mine, comm=comm)


@pytest.mark.mpi_sizes(2, 3, 4)
def test_shard_files_pattern_matching_on_some_ranks_only(comm, shared_dir: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # Node-local disks, simulated: only rank 0's working directory holds the files.
    mine = shared_dir / f"rank{RANK}"
    mine.mkdir()
    monkeypatch.chdir(mine)
    if RANK == 0:
        for i in range(SIZE):
            Path(f"x{i}.rec").write_bytes(b"")
    comm.Barrier()
    others = "1" if SIZE == 2 else f"1-{SIZE - 1}"  # consecutive ranks are written as a range
    label = "rank" if SIZE == 2 else "ranks"
    # Each failing rank names its own working directory, so the message lists them rank by rank.
    match = rf"no files matching '\*\.rec' \(relative to '.*rank1'\).*\[on {label} {others} of {SIZE}\]"
    with raises_everywhere(ValueError, match=match, comm=comm):
        data.shard_files("*.rec", comm=comm)


@pytest.mark.mpi_sizes(2, 3, 4)
def test_shard_files_fewer_files_than_ranks_everywhere(comm, shared_dir: Path) -> None:
    files = write_files_on_root(comm, shared_dir, SIZE - 1)
    plural = "file" if SIZE == 2 else "files"
    with raises_everywhere(ValueError, match=rf"at least as many files as ranks.*got {SIZE - 1} {plural} for {SIZE} "
                                             rf"ranks\. Write the data as at least {SIZE} files", comm=comm):
        data.shard_files(str(shared_dir / "*.bin"), comm=comm)
    # One more file and every rank gets exactly one.
    files += write_files_on_root(comm, shared_dir, 1, prefix="zz")
    assert_everywhere(data.shard_files(files, comm=comm) == [files[RANK]], "one file per rank", comm)


def test_shard_files_no_files_everywhere(comm, shared_dir: Path) -> None:
    where = "the only rank" if SIZE == 1 else f"all {SIZE} ranks"
    with raises_everywhere(ValueError, match=rf"found no files matching '.*\*\.rec'; .*\[on {where}\]", comm=comm):
        data.shard_files(str(shared_dir / "*.rec"), comm=comm)
    with raises_everywhere(ValueError, match=r"at least one file; got an empty list", comm=comm):
        data.shard_files([], comm=comm)


def test_shard_files_missing_file_everywhere(comm, shared_dir: Path) -> None:
    # The last file in sorted order does not exist; only the last rank, which owns it, notices.
    files = write_files_on_root(comm, shared_dir, 2 * SIZE - 1) + [str(shared_dir / "zz-missing.bin")]
    where = "the only rank" if SIZE == 1 else f"rank {SIZE - 1} of {SIZE}"
    match = rf"cannot read 1 of this rank's 2 files: '.*zz-missing\.bin' \(No such file or directory\)\. \[on {where}\]"
    with raises_everywhere(FileNotFoundError, match=match, comm=comm):
        data.shard_files(files, comm=comm)




@pytest.mark.parametrize("per_rank", [1, 5.25])
def test_shard_dataset_shards_are_disjoint_and_cover_the_dataset(tf, per_rank: float, comm) -> None:
    n = int(per_rank * SIZE) + (1 if per_rank % 1 else 0)
    mine = [int(v) for v in data.shard_dataset(tf.data.Dataset.range(n), comm=comm).as_numpy_iterator()]
    everyone = comm.allgather(mine)
    seen = [v for part in everyone for v in part]
    assert_everywhere(sorted(seen) == list(range(n)) and len(set(seen)) == n, "disjoint shards covering the dataset",
                      comm)
    assert_everywhere(mine == list(range(RANK, n, SIZE)) and len(mine) >= 1, "element i on rank i % size", comm)


@pytest.mark.mpi_sizes(2, 3, 4)
def test_shard_dataset_too_few_elements_everywhere(tf, comm) -> None:
    with raises_everywhere(ValueError, match=rf"the dataset has 1 element for {SIZE} ranks", comm=comm):
        data.shard_dataset(tf.data.Dataset.range(SIZE + 1).batch(SIZE + 1), comm=comm)


def test_tfrecord_files_read_by_exactly_one_rank(tf, comm, shared_dir: Path) -> None:
    n_files, per_file = 2 * SIZE + 1, 3
    if RANK == 0:
        for i in range(n_files):
            with tf.io.TFRecordWriter(str(shared_dir / f"part-{i:03d}.tfrecord")) as writer:
                for j in range(per_file):
                    writer.write(f"{i}:{j}".encode())
    comm.Barrier()
    files = data.shard_files(str(shared_dir / "*.tfrecord"), comm=comm)
    records = [r.decode() for r in tf.data.TFRecordDataset(files).as_numpy_iterator()]
    gathered = [r for part in comm.allgather(records) for r in part]
    want = [f"{i}:{j}" for i in range(n_files) for j in range(per_file)]
    assert_everywhere(gathered == want, "records gathered in rank order are the files' records in sorted order", comm)
