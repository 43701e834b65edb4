"""One-process tests of mpinb.data: the datasets' content, shard arithmetic simulated over many world
sizes, and the error messages of load_npy."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

from mpinb import data
from mpinb.shards import shard_bounds

SELF = MPI.COMM_SELF
BUNDLED = {
    "load_digits": (1797, 64, 10),
    "load_iris": (150, 4, 3),
    "load_wine": (178, 13, 3),
    "load_breast_cancer": (569, 30, 2),
}


@dataclass
class FakeComm:
    """Just enough of a communicator for the generators, which only ask where they sit: it lets one
    process play every rank of a world of any size."""

    rank: int
    size: int

    def Get_rank(self) -> int:  # noqa: N802 - mpi4py's spelling
        return self.rank

    def Get_size(self) -> int:  # noqa: N802
        return self.size


# -------------------------------------------------------------------------------------- bundled data


@pytest.mark.parametrize("name", sorted(BUNDLED))
def test_bundled_split_matches_stratified_train_test_split(name: str) -> None:
    import sklearn.datasets
    from sklearn.model_selection import train_test_split

    n, d, k = BUNDLED[name]
    split = getattr(data, name)(shard=False, test_size=0.25, random_state=3)
    assert isinstance(split, data.Split) and len(split) == 4
    X_train, X_test, y_train, y_test = split
    assert X_train.shape[1] == X_test.shape[1] == d and len(X_train) + len(X_test) == n
    assert X_train.dtype == np.float64 and y_train.dtype == np.int64
    bunch = getattr(sklearn.datasets, name)()
    want = train_test_split(bunch.data, bunch.target, test_size=0.25, random_state=3, stratify=bunch.target)
    for got, ref in zip(split, want, strict=True):
        np.testing.assert_array_equal(got, ref)
    # Stratified: each class's share of the test set is its share of the whole, within one sample.
    counts = np.bincount(bunch.target, minlength=k)
    assert np.all(np.abs(np.bincount(y_test, minlength=k) - counts * len(y_test) / n) <= 1)


def test_bundled_shard_on_self_is_everything_and_shard_false_needs_no_mpi() -> None:
    full = data.load_iris(shard=False)
    mine = data.load_iris(comm=SELF)
    for a, b in zip(full, mine, strict=True):
        np.testing.assert_array_equal(a, b)
    code = (
        "import sys, mpinb.data as d; d.load_wine(shard=False); d.make_blobs(100, shard=False);"
        "d.make_classification(100, shard=False, random_state=None); print('mpi4py.MPI' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False", "shard=False initialised MPI, which a notebook client must not do"


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"test_size": 0.0}, ValueError, r"test_size must be a fraction between 0 and 1 .* got 0.0"),
        ({"test_size": 1.5}, ValueError, "test_size must be"),
        ({"test_size": True}, ValueError, "test_size must be"),
        ({"test_size": 0}, ValueError, "test_size must be"),
        ({"random_state": -1}, ValueError, "random_state must be a non-negative integer; got -1"),
        ({"random_state": 1.5}, TypeError, "random_state must be a non-negative integer; got 1.5"),
        ({"random_state": 1 << 32}, ValueError, r"random_state must be < 2\*\*32"),
    ],
)
def test_bundled_rejects_bad_arguments(kwargs: dict, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        data.load_digits(comm=SELF, **kwargs)


def test_bundled_integer_test_size_and_fresh_seed() -> None:
    X_train, X_test, _, _ = data.load_iris(shard=False, test_size=30)
    assert len(X_test) == 30 and len(X_train) == 120
    a = data.load_digits(shard=False, random_state=None).y_test
    b = data.load_digits(shard=False, random_state=None).y_test
    assert not np.array_equal(a, b)  # 450 labels in the same order twice would be a fixed seed


# ------------------------------------------------------------------------------------ generators

GENERATORS = {
    "make_blobs": lambda n, **kw: data.make_blobs(n, 3, 4, cluster_std=0.5, random_state=7, **kw),
    "make_classification": lambda n, **kw: data.make_classification(n, 6, 3, n_informative=3, random_state=7, **kw),
}


@pytest.mark.parametrize("name", sorted(GENERATORS))
@pytest.mark.parametrize("n", [0, 1, 5, 1023, 1024, 1025, 5000])
@pytest.mark.parametrize("size", [1, 2, 3, 4, 7])
def test_generators_shards_concatenate_to_the_full_data_at_any_size(name: str, n: int, size: int) -> None:
    gen = GENERATORS[name]
    X_full, y_full = gen(n, shard=False)
    assert X_full.shape == (n, X_full.shape[1]) and y_full.shape == (n,)
    parts = [gen(n, comm=FakeComm(r, size)) for r in range(size)]
    for r, (X, y) in enumerate(parts):
        start, stop = shard_bounds(n, rank=r, size=size)
        assert len(X) == len(y) == stop - start
    X_cat = np.concatenate([p[0] for p in parts])
    y_cat = np.concatenate([p[1] for p in parts])
    assert X_cat.dtype == X_full.dtype and y_cat.dtype == y_full.dtype == np.int64
    assert X_cat.tobytes() == X_full.tobytes() and y_cat.tobytes() == y_full.tobytes()


def test_make_blobs_distribution() -> None:
    X, y = data.make_blobs(30_000, 3, 4, cluster_std=[0.5, 1.0, 1.5, 2.0], random_state=1, shard=False)
    assert X.shape == (30_000, 3) and X.dtype == np.float64
    counts = np.bincount(y, minlength=4)
    assert counts.sum() == 30_000 and counts.min() > 7_000  # uniform cluster choice, ~7,500 each
    means = np.array([X[y == c].mean(axis=0) for c in range(4)])
    stds = np.array([X[y == c].std(axis=0).mean() for c in range(4)])
    assert np.all((-10.5 < means) & (means < 10.5))
    np.testing.assert_allclose(stds, [0.5, 1.0, 1.5, 2.0], rtol=0.05)
    # Rows come shuffled: every 1,024-row block holds every cluster.
    assert all(len(np.unique(y[i : i + 1024])) == 4 for i in range(0, 30_000, 1024))


def test_make_blobs_given_centers_and_dtype() -> None:
    centers = np.array([[0.0, 0.0], [100.0, 0.0], [0.0, 100.0]])
    X, y = data.make_blobs(9_000, centers=centers, cluster_std=0.0, dtype=np.float32, shard=False)
    assert X.dtype == np.float32 and X.shape == (9_000, 2)
    np.testing.assert_array_equal(X, centers[y].astype(np.float32))


def test_generators_are_deterministic_and_seed_dependent() -> None:
    a = data.make_blobs(2_000, random_state=5, shard=False)[0]
    b = data.make_blobs(2_000, random_state=5, shard=False)[0]
    c = data.make_blobs(2_000, random_state=6, shard=False)[0]
    d = data.make_blobs(2_000, random_state=None, shard=False)[0]
    assert a.tobytes() == b.tobytes() and not np.array_equal(a, c) and not np.array_equal(a, d)
    # More rows extend the data set: the first rows do not change.
    e = data.make_classification(3_000, random_state=5, shard=False)[0]
    f = data.make_classification(5_000, random_state=5, shard=False)[0]
    assert e.tobytes() == f[:3_000].tobytes()


def test_make_classification_model() -> None:
    X, y = data.make_classification(40_000, 10, 4, n_informative=3, class_sep=2.0, random_state=2, shard=False)
    assert X.dtype == np.float32 and X.shape == (40_000, 10)
    assert np.bincount(y, minlength=4).min() > 9_000
    means = np.array([X[y == c].mean(axis=0) for c in range(4)])
    # Informative means are distinct hypercube vertices (+-2); the rest is centred noise.
    np.testing.assert_allclose(np.abs(means[:, :3]), 2.0, atol=0.06)
    assert len({tuple(np.sign(m[:3])) for m in means}) == 4
    np.testing.assert_allclose(means[:, 3:], 0.0, atol=0.06)
    np.testing.assert_allclose(X[:, 3:].std(axis=0), 1.0, atol=0.03)
    # Label noise: with flip_y=1 labels no longer follow the class means.
    from sklearn.linear_model import LogisticRegression

    clean = LogisticRegression().fit(X[:20_000], y[:20_000]).score(X[20_000:], y[20_000:])
    Xn, yn = data.make_classification(40_000, 10, 4, n_informative=3, class_sep=2.0, flip_y=1.0, random_state=2,
                                      shard=False)
    noisy = LogisticRegression().fit(Xn[:20_000], yn[:20_000]).score(Xn[20_000:], yn[20_000:])
    assert clean > 0.9 and noisy < 0.35


@pytest.mark.parametrize(
    ("call", "exc", "match"),
    [
        (lambda: data.make_blobs(-1, comm=SELF), ValueError, "n_samples must be a non-negative integer; got -1"),
        (lambda: data.make_blobs(10.0, comm=SELF), TypeError, "n_samples must be a non-negative integer; got 10.0"),
        (lambda: data.make_blobs(10, centers=0, comm=SELF), ValueError, "centers must be a positive integer; got 0"),
        (lambda: data.make_blobs(10, centers=[1.0, 2.0], comm=SELF), ValueError, r"shape \(n_clusters, n_features\)"),
        (lambda: data.make_blobs(10, cluster_std=[1.0, 2.0], comm=SELF), ValueError,
         r"one per cluster \(shape \(3,\)\)"),
        (lambda: data.make_blobs(10, cluster_std=-1.0, comm=SELF), ValueError, "cluster_std must be a non-negative"),
        (lambda: data.make_blobs(10, center_box=(1, -1), comm=SELF), ValueError, "low <= high"),
        (lambda: data.make_blobs(10, dtype=np.int32, comm=SELF), TypeError, "floating-point dtype"),
        (lambda: data.make_classification(10, 5, n_informative=6, comm=SELF), ValueError,
         r"n_informative must be <= n_features \(5\)"),
        (lambda: data.make_classification(10, n_classes=1, comm=SELF), ValueError,
         "n_classes must be an integer >= 2; got 1"),
        (lambda: data.make_classification(10, n_classes=5, n_informative=2, comm=SELF), ValueError,
         r"2\*\*n_informative \(4\)"),
        (lambda: data.make_classification(10, flip_y=2, comm=SELF), ValueError, "flip_y must be between 0 and 1"),
        (lambda: data.make_classification(10, class_sep=float("nan"), comm=SELF), ValueError, "class_sep must be"),
    ],
)
def test_generators_reject_bad_arguments(call, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        call()


# -------------------------------------------------------------------------------------- load_npy


@pytest.mark.parametrize(
    "array",
    [
        np.arange(60, dtype=np.float64).reshape(20, 3),
        np.arange(7, dtype=np.int32),
        np.arange(24, dtype=np.float32).reshape(2, 3, 4),
        np.asfortranarray(np.arange(30, dtype=np.int16).reshape(10, 3)),
        np.zeros((0, 4)),
        np.array([b"ab", b"cd"], dtype="S2"),
    ],
    ids=["2d", "1d", "3d", "fortran", "empty", "bytes"],
)
def test_load_npy_on_one_rank_is_the_whole_array(tmp_path: Path, array: np.ndarray) -> None:
    path = tmp_path / "a.npy"
    np.save(path, array)
    got = data.load_npy(path, comm=SELF)
    assert got.dtype == array.dtype and got.flags.c_contiguous and got.flags.owndata
    np.testing.assert_array_equal(got, array)
    assert not isinstance(got, np.memmap)


def _write(path: Path, payload: bytes) -> Path:
    path.write_bytes(payload)
    return path


@pytest.mark.parametrize(
    ("make", "kwargs", "exc", "match"),
    [
        (lambda p: p / "missing.npy", {}, FileNotFoundError, r"No such file .*missing\.npy.* \[on the only rank\]"),
        (lambda p: p, {}, IsADirectoryError, "Is a directory"),
        (lambda p: _write(p / "t.npy", b"hello, world"), {}, ValueError, r"t\.npy' is not a valid \.npy file"),
        (lambda p: _write(p / "e.npy", b""), {}, ValueError, "is not a valid .npy file"),
        (lambda p: np.save(p / "s.npy", np.float64(3.0)) or p / "s.npy", {}, ValueError, "holds a 0-d array"),
        (lambda p: np.save(p / "o.npy", np.array([1, None], dtype=object)) or p / "o.npy", {}, ValueError,
         "holds Python objects"),
        (lambda p: np.save(p / "v.npy", np.arange(5.0)) or p / "v.npy", {"ndim": 2}, ValueError,
         r"must hold a 2-D array; got shape \(5,\)"),
        (lambda p: (_write(p / "c.npy", (p / "v.npy").read_bytes()[:-8])
                    if np.save(p / "v.npy", np.arange(5.0)) is None else None),
         {}, ValueError, "is truncated: its header promises 168 bytes but the file has 160"),
    ],
    ids=["missing", "directory", "text", "empty-file", "0-d", "objects", "ndim", "truncated"],
)
def test_load_npy_errors(tmp_path: Path, make, kwargs: dict, exc: type, match: str) -> None:
    path = make(tmp_path)
    with pytest.raises(exc, match=match):
        data.load_npy(path, comm=SELF, **kwargs)


def test_load_npy_argument_errors(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="load_npy needs a path"):
        data.load_npy(np.zeros(3), comm=SELF)
    with pytest.raises(ValueError, match="ndim must be a positive integer; got 0"):
        data.load_npy(tmp_path / "x.npy", ndim=0, comm=SELF)


# ---------------------------------------------------------------------------- shard_files, shard_dataset


def _touch(directory: Path, names: list[str]) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / n for n in names]
    for p in paths:
        p.write_bytes(p.name.encode())
    return paths


@pytest.fixture
def simulated(monkeypatch: pytest.MonkeyPatch):
    """shard_files as rank ``rank`` of ``size`` sees it, in one process: its two collective decisions
    are made locally (every simulated rank passes the same list), so the split and the checks that
    follow the agreement can be tested at any world size."""
    from contextlib import contextmanager

    @contextmanager
    def alone(*, comm=None, timeout=None):
        yield

    monkeypatch.setattr(data._files, "raise_together", alone)
    monkeypatch.setattr(data._files, "check_same", lambda value, what, *, comm=None, timeout=None: None)
    return lambda files, rank, size: data.shard_files(files, comm=FakeComm(rank, size))


@pytest.mark.parametrize(
    ("n", "size"), [(n, size) for n in (1, 2, 3, 4, 7, 8, 13, 100) for size in (1, 2, 3, 4, 7) if n >= size]
)
def test_shard_files_split_is_contiguous_balanced_and_in_rank_order(tmp_path: Path, simulated, n: int,
                                                                    size: int) -> None:
    files = sorted(str(p) for p in _touch(tmp_path, [f"part-{i:05d}.bin" for i in range(n)]))
    parts = [simulated(str(tmp_path / "part-*.bin"), r, size) for r in range(size)]
    assert [f for part in parts for f in part] == files
    for r, part in enumerate(parts):
        start, stop = shard_bounds(n, rank=r, size=size)
        assert part == files[start:stop] and len(part) >= 1
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


@pytest.mark.parametrize(("n", "size"), [(1, 2), (3, 4), (6, 7)])
def test_shard_files_fewer_files_than_ranks_is_an_error_with_the_fix(tmp_path: Path, simulated, n: int,
                                                                     size: int) -> None:
    files = _touch(tmp_path, [f"f{i}" for i in range(n)])
    plural = "file" if n == 1 else "files"
    for r in range(size):  # the same decision on every rank, before any file is opened
        with pytest.raises(ValueError, match=rf"at least as many files as ranks.*got {n} {plural} for {size} ranks\. "
                                             rf"Write the data as at least {size} files .*mpinb\.data\.load_npy"):
            simulated(files, r, size)


def test_shard_files_on_one_rank_sorts_and_expands(tmp_path: Path) -> None:
    names = ["b.rec", "a.rec", "c.rec", "a.txt", "part-10.rec", "part-02.rec"]
    paths = _touch(tmp_path, names)
    want = sorted(str(p) for p in paths if p.suffix == ".rec")
    assert want[0].endswith("a.rec") and want[-1].endswith("part-10.rec")
    got = data.shard_files(str(tmp_path / "*.rec"), comm=SELF)
    assert got == want and all(type(f) is str for f in got)
    # A list in any order, of Paths or strings (or a generator), gives the same sorted str list.
    shuffled = [paths[i] for i in (4, 2, 0, 5, 1)]
    assert data.shard_files(shuffled, comm=SELF) == want
    assert data.shard_files((str(p) for p in reversed(shuffled)), comm=SELF) == want
    assert data.shard_files(tmp_path / "*.rec", comm=SELF) == want  # a Path pattern
    # A path without wildcards is a pattern matching itself; ** descends into directories.
    assert data.shard_files(paths[0], comm=SELF) == [str(paths[0])]
    deep = _touch(tmp_path / "x" / "y", ["z.rec"])
    assert data.shard_files(str(tmp_path / "**" / "*.rec"), comm=SELF) == sorted(want + [str(deep[0])])


def test_shard_files_relative_pattern(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _touch(tmp_path / "shards", ["1.npz", "0.npz"])
    monkeypatch.chdir(tmp_path)
    assert data.shard_files("shards/*.npz", comm=SELF) == ["shards/0.npz", "shards/1.npz"]
    with pytest.raises(ValueError, match=rf"no files matching 'nope/\*\.npz' \(relative to '{tmp_path}'\); "
                                         r"check the pattern, and that every rank sees the directory\. "
                                         r"\[on the only rank\]"):
        data.shard_files("nope/*.npz", comm=SELF)


def test_shard_files_errors(tmp_path: Path) -> None:
    a, b, c, d = _touch(tmp_path, ["a", "b", "c", "d"])
    (tmp_path / "sub").mkdir()
    cases = [
        (str(tmp_path / "*.none"), ValueError, r"found no files matching '.*\*\.none'; check the pattern"),
        ([], ValueError, r"needs at least one file; got an empty list\. \[on the only rank\]"),
        ([a, b, str(a), c, c], ValueError, rf"each file once.*'{a}', '{c}' are listed more than once"),
        (42, TypeError, r"a glob pattern \(str or os\.PathLike\) or an iterable of paths; got int"),
        (b"*.rec", TypeError, "or an iterable of paths; got bytes"),
        ([a, 3], TypeError, r"str or os\.PathLike paths; item 1 is 3"),
        ([a, tmp_path / "gone"], FileNotFoundError,
         rf"cannot read 1 of this rank's 2 files: '{tmp_path}/gone' \(No such file or directory\)\. "
         r"\[on the only rank\]"),
        ([a, tmp_path / "sub"], IsADirectoryError, r"'.*/sub' \(is a directory\)"),
        ([tmp_path / f"m{i}" for i in range(5)] + [d], FileNotFoundError,
         r"cannot read 5 of this rank's 6 files: '.*m0' \(No such file or directory\), "
         r"'.*m1' .*, '.*m2' .* and 2 more\."),
    ]
    for files, exc, match in cases:
        with pytest.raises(exc, match=match):
            data.shard_files(files, comm=SELF)


def test_shard_files_unreadable(tmp_path: Path) -> None:
    import os

    (locked,) = _touch(tmp_path, ["locked"])
    locked.chmod(0)
    try:
        if os.access(locked, os.R_OK):
            pytest.skip("running as a user who can read anything")
        with pytest.raises(PermissionError, match=r"'.*locked' \(permission denied\)"):
            data.shard_files([locked], comm=SELF)
    finally:
        locked.chmod(0o600)


def test_shard_dataset_rejects_non_datasets_without_importing_tensorflow() -> None:
    code = (
        "import sys, numpy as np, mpinb.data as d\n"
        "for bad in ([1, 2], np.arange(3), iter(range(3))):\n"
        "    try:\n"
        "        d.shard_dataset(bad)\n"
        "    except TypeError as err:\n"
        "        print(err)\n"
        "print('tensorflow' in sys.modules, 'mpi4py.MPI' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0].startswith("shard_dataset needs a tf.data.Dataset; got list. For NumPy arrays use mpinb.shard")
    assert "got numpy.ndarray" in out[1] and "got range_iterator" in out[2] and "mpinb.data.shard_files" in out[2]
    assert out[3] == "False False"




@pytest.mark.parametrize("n", [4, 5, 17])
@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_shard_dataset_shards_are_disjoint_and_cover_the_dataset(tf, n: int, size: int) -> None:
    ds = tf.data.Dataset.range(n)
    parts = [[int(v) for v in data.shard_dataset(ds, comm=FakeComm(r, size)).as_numpy_iterator()] for r in range(size)]
    assert sorted(v for p in parts for v in p) == list(range(n))
    assert all(p == list(range(r, n, size)) for r, p in enumerate(parts))
    assert data.shard_dataset(ds, comm=SELF) is ds


def test_shard_dataset_element_count_checks(tf) -> None:
    ds = tf.data.Dataset.range(10)
    with pytest.raises(ValueError, match=r"at least one element per rank; the dataset has 3 elements for 4 ranks\. "
                                         r"If it is batched, shard before batch\(\)"):
        data.shard_dataset(ds.batch(4), comm=FakeComm(0, 4))
    with pytest.raises(ValueError, match="has 0 elements for 1 ranks"):
        data.shard_dataset(ds.take(0), comm=SELF)
    # Unknown (filter) and infinite (repeat) cardinalities are not checked.
    odd = data.shard_dataset(ds.filter(lambda x: x % 2 == 1), comm=FakeComm(1, 2))
    assert [int(v) for v in odd.as_numpy_iterator()] == [3, 7]
    endless = data.shard_dataset(ds.repeat(), comm=FakeComm(2, 4))
    assert [int(v) for v in endless.take(4).as_numpy_iterator()] == [2, 6, 0, 4]
    with pytest.raises(TypeError, match=r"needs a tf\.data\.Dataset; got tensorflow\."):
        data.shard_dataset(tf.constant([1, 2]), comm=SELF)
