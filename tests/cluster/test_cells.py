"""Cell-aware ranks (issue 21), on a real MPI engine cluster, with the default settings: no deadline.

A rank that ends its cell -- with an error, or by returning -- while the others wait for it in an
mpinb collective makes them raise within a second, naming it and what it raised; a queued cell
never pairs with a stale collective; a late rank's stale call raises instead of pairing with the
others' next one; a cell sent to some engines only is refused at once; a failure in the middle of
``KMeans.fit`` on one rank ends every rank's wait. After every trial, a collective on every rank
gives the right value and the engines' variables are intact. 2 and 4 ranks, one trial each
(``MPINB_CELL_TRIALS`` for more): the orderings are explored by the model tier (``tests/model``).
The orderings these trials meet by chance -- a rank already in its next cell's collective when the
others reach the one it left, or only after they gave it up -- are forced one by one on mpiexec
ranks in ``tests/mpi/test_cells.py``.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from ipyparallel.error import CompositeError

import mpinb
from mpinb.interrupt import INTERRUPT_GRACE
from support.cells import ATTEMPT, errors_by_rank, names_the_dead_rank

TRIALS = int(os.environ.get("MPINB_CELL_TRIALS", "1"))
# Seconds: "at once, not at a deadline or never". The promised 1 s is checked in virtual time by the
# model tier, where load cannot break it; here it only has to be far below any deadline or hang.
PROMPT = 5.0
HANG = 20.0  # a cell still running this long counts as hung


SETUP = """
import time
import numpy as np
import mpinb
import mpinb.kmeans._lloyd
from mpinb.data import make_blobs

mpinb.set_collective_timeout(None)
rank = mpinb.world().rank
X, _ = make_blobs(20_000, n_features=4, centers=8, random_state=0)
mpinb.KMeans(8, n_init=1, random_state=0).fit(X)  # import everything before the timed trials
""" + ATTEMPT

# Rank 1 raises in the user's own code before a collective the others entered.
ERROR_FIRST = """
record = None
if rank == 1:
    1 / 0
attempt(lambda: float(mpinb.allreduce([np.full(3, rank + 1.0)])[0][0]))
"""

# Rank 1 returns early: its cell ends normally, without the collective.
RETURN_EARLY = """
record = None
if rank != 1:
    attempt(lambda: float(mpinb.allreduce([np.full(3, rank + 1.0)])[0][0]))
"""

# Rank 1 returns early; the others try twice in the same cell (the second time, every rank must
# first move to a fresh communicator, which rank 1 joins only in its next cell).
TWICE = """
record = None
def _twice():
    out = []
    for _ in range(2):
        try:
            mpinb.allreduce([1])
            out.append("ok")
        except mpinb.CollectiveAbandoned:
            out.append("abandoned")
    return out
if rank != 1:
    attempt(_twice)
"""

# The next cell, queued right behind a failed one.
QUEUED = "z = float(mpinb.allreduce([np.full(3, 10.0 + rank)])[0][0])"

# Under a deadline, rank 1 is late for `a`; the others give up on it and go on to `b`.
LATE = """
record = None
def _late():
    mpinb.set_collective_timeout(0.5)
    try:
        if rank == 1:
            time.sleep(1.5)
        try:
            a = float(mpinb.allreduce([np.full(1, rank + 1.0)])[0][0])
        except (mpinb.CollectiveTimeout, mpinb.CollectiveAbandoned) as err:
            a = type(err).__name__
        mpinb.set_collective_timeout(None)
        b = float(mpinb.allreduce([np.full(1, 10.0 * (rank + 1))])[0][0])
        return a, b
    finally:
        mpinb.set_collective_timeout(None)
attempt(_late)
"""


def _third_assignment_on_rank_1(does: str, rank_1_in_attempt: bool) -> str:
    """A KMeans.fit cell in which rank 1's third assignment step of Lloyd's loop ``does`` something."""
    fit = "mpinb.KMeans(8, n_init=1, random_state=0, max_iter=50, tol=0).fit(X)"
    run_rank_1 = f"attempt(lambda: {fit})" if rank_1_in_attempt else fit
    return f"""
record = None
_assign = mpinb.kmeans._lloyd.assign
calls = 0
def _patched(*args, **kwargs):
    global calls
    calls += 1
    if calls == 3:
        {does}
    return _assign(*args, **kwargs)
try:
    if rank == 1:
        mpinb.kmeans._lloyd.assign = _patched
        {run_rank_1}
    else:
        attempt(lambda: {fit})
finally:
    mpinb.kmeans._lloyd.assign = _assign
"""


# Rank 1 runs out of memory in the third assignment step of Lloyd's loop; the error ends its cell.
KMEANS = _third_assignment_on_rank_1('raise MemoryError("no room for the distances")', rank_1_in_attempt=False)

CHECK = "total = float(mpinb.allreduce([np.full(2, rank + 1.0)])[0][0])"


class Engines:
    def __init__(self, cluster: Any, n: int) -> None:
        self.cluster, self.n = cluster, n
        self.expected = n * (n + 1) / 2  # sum of rank + 1

    def run(self, code: str, *, fails_on: set[int] = frozenset()) -> list[dict[str, Any] | None]:
        """Run one cell on every rank, require it to fail exactly on ``fails_on``, return each rank's ``record``."""
        ar = self.cluster.view.execute(code, block=False)
        failed = self.wait(ar)
        assert failed == fails_on, (f"the cell failed on ranks {sorted(failed)}, not {sorted(fails_on)}: "
                                    f"{self.last_errors}")
        return self.cluster.pull("record")

    def wait(self, ar: Any) -> set[int]:
        """Wait for a cell on every rank; the ranks whose engines raised out of it."""
        self.last_errors = errors_by_rank(self.cluster, ar, HANG)
        return set(self.last_errors)

    def recovered(self, marker: str) -> None:
        """The next collective gives the right value on every rank, and the engines kept their variables."""
        self.run(CHECK)
        assert self.cluster.pull("total") == [self.expected] * self.n
        assert self.cluster.pull("marker") == [marker] * self.n


# One odd world (a middle rank, an uneven tree): the orderings at every size are the model tier's.
@pytest.fixture(scope="module", params=[3], ids=lambda n: f"{n}ranks")
def engines(request: pytest.FixtureRequest) -> Iterator[Engines]:
    with mpinb.MPICluster(n=request.param) as cluster:
        cluster.view.execute(SETUP)
        yield Engines(cluster, request.param)


def _mark(engines: Engines, scenario: str, trial: int) -> str:
    marker = f"{scenario}/{trial}"
    engines.cluster.view.execute(f"marker = {marker!r}")
    return marker


def _prompt_errors(records: list[Any], skip: set[int], expect: str) -> None:
    """Every rank but ``skip`` raised CollectiveAbandoned naming rank 1 and ``expect``, within PROMPT."""
    for rank, rec in enumerate(records):
        if rank in skip:
            continue
        said = f"rank {rank}: {rec}"
        assert rec is not None and rec["raised"] == "CollectiveAbandoned", said
        assert "rank 1 " in rec["message"] and expect in rec["message"], said
        assert rec["ended"] - rec["began"] < PROMPT, f"rank {rank} waited {rec['ended'] - rec['began']:.2f} s"


# A rank that leaves its cell without entering the collective the others wait in: the cell, the
# ranks whose engines raise out of it, and what the others must say rank 1 did.
LEFT_THE_CELL = {
    "error-first": (ERROR_FIRST, {1}, "ended its cell (raised ZeroDivisionError: division by zero)"),
    "early-return": (RETURN_EARLY, set(), "ended its cell (ended normally)"),
    "kmeans-memory": (KMEANS, {1}, "ended its cell (raised MemoryError: no room for the distances)"),
}


@pytest.mark.parametrize("trial", range(TRIALS))
@pytest.mark.parametrize("scenario", list(LEFT_THE_CELL))
def test_a_rank_that_leaves_its_cell_ends_the_others_wait_at_once(engines: Engines, scenario: str, trial: int) -> None:
    code, fails_on, said = LEFT_THE_CELL[scenario]
    marker = _mark(engines, scenario, trial)
    records = engines.run(code, fails_on=fails_on)
    _prompt_errors(records, {1}, said)
    engines.recovered(marker)


@pytest.mark.parametrize("trial", range(max(1, TRIALS // 2)))
def test_a_second_try_in_the_same_cell_does_not_wait_for_a_rank_that_left(engines: Engines, trial: int) -> None:
    marker = _mark(engines, "twice", trial)
    records = engines.run(TWICE)
    for rank, rec in enumerate(records):
        if rank != 1:
            assert rec["value"] == ["abandoned", "abandoned"], f"rank {rank}: {rec}"
            assert rec["ended"] - rec["began"] < 2 * PROMPT, f"rank {rank}: {rec}"
    engines.recovered(marker)


@pytest.mark.parametrize("trial", range(TRIALS))
def test_a_cell_queued_behind_a_failed_one_gets_the_right_values(engines: Engines, trial: int) -> None:
    marker = _mark(engines, "queued", trial)
    failed = engines.cluster.view.execute(ERROR_FIRST, block=False)
    queued = engines.cluster.view.execute(QUEUED, block=False)  # submitted before the first one ends
    assert engines.wait(failed) == {1}
    assert engines.wait(queued) == set(), f"the queued cell failed: {engines.last_errors}"
    right = sum(10.0 + r for r in range(engines.n))
    assert engines.cluster.pull("z") == [right] * engines.n
    engines.recovered(marker)


@pytest.mark.parametrize("trial", range(TRIALS))
def test_a_late_rank_never_pairs_with_the_next_collective(engines: Engines, trial: int) -> None:
    marker = _mark(engines, "late", trial)
    records = engines.run(LATE)
    for rank, rec in enumerate(records):
        assert rec["raised"] is None, f"rank {rank}: {rec}"
        a, b = rec["value"]
        # `a` was abandoned (never a number paired from another call); `b` pairs only with `b`.
        assert a in ("CollectiveTimeout", "CollectiveAbandoned"), f"rank {rank}: a = {a}"
        assert b == 10 * engines.expected, f"rank {rank}: b = {b}, right: {10 * engines.expected}"
    engines.recovered(marker)


def test_a_cell_sent_to_some_engines_only_is_refused_at_once(engines: Engines) -> None:
    marker = _mark(engines, "subset", 0)
    ids = engines.cluster.ids_by_rank
    some = ids[: engines.n // 2]
    view = engines.cluster.client.direct_view(targets=some)
    ar = view.execute("record = None\nattempt(lambda: mpinb.allreduce([1]))", block=False)
    ar.get(timeout=HANG)
    records = view.pull("record", block=True)
    away = list(range(len(some), engines.n))
    for rec in records:
        assert rec["raised"] == "CollectiveAbandoned", rec
        assert "not running it" in rec["message"] and f"{away[0]} (engine {ids[away[0]]})" in rec["message"], rec
        assert rec["ended"] - rec["began"] < PROMPT, rec  # without waiting for the ranks away
    engines.recovered(marker)


def test_tracebacks_show_the_users_frames_without_mpinbs(engines: Engines) -> None:
    marker = _mark(engines, "traceback", 0)
    ar = engines.cluster.view.execute("if rank == 1:\n    1 / 0\ntotal = mpinb.allreduce([1])", block=False)
    engines.wait(ar)
    with pytest.raises(CompositeError) as info:
        ar.get(timeout=0)
    shown = {name: tb for name, _, tb, _ in info.value.elist}
    assert set(shown) == {"ZeroDivisionError", "CollectiveAbandoned"}, set(shown)
    frames = [line for line in shown["CollectiveAbandoned"].splitlines() if "line " in line]
    assert frames and not any("mpinb" in line and "_collective" in line
                              for line in shown["CollectiveAbandoned"].splitlines())
    assert len(shown["CollectiveAbandoned"].splitlines()) < 20, shown["CollectiveAbandoned"]
    engines.recovered(marker)


def test_a_long_wait_says_whom_it_waits_for_and_where_they_are(engines: Engines) -> None:
    marker = _mark(engines, "notice", 0)
    code = (
        "import os\nos.environ['MPINB_WAIT_NOTICE'] = '0.5'\n"
        "def crunch():\n    time.sleep(1.5)\n"
        "try:\n"
        "    if rank == 1:\n        crunch()\n"
        "    mpinb.allreduce([1])\n"
        "finally:\n    del os.environ['MPINB_WAIT_NOTICE']\n"
    )
    ar = engines.cluster.view.execute(code, block=False)
    assert engines.wait(ar) == set()
    said = ar.stderr[0]
    assert re.search(r"mpinb: rank 0 has waited \d+ s in allreduce #\d+ for rank 1 \(.*it is computing outside "
                     r"mpinb, at crunch, line 4 of its cell", said), said
    assert said.count("has waited") == 1, said  # once, then not again for 30 s
    engines.recovered(marker)


def test_a_waiting_px_cell_is_never_silent(engines: Engines) -> None:
    """A blocking, non-streaming %%px cell in a real IPython shell prints the engines' waiting
    notices while it runs, not only when it ends."""
    import io
    import sys

    from IPython.core.interactiveshell import InteractiveShell

    from mpinb.client._ipp import px_magics

    class Stamped(io.StringIO):
        def __init__(self) -> None:
            super().__init__()
            self.lines: list[tuple[float, str]] = []

        def write(self, text: str) -> int:
            self.lines += [(time.monotonic(), line) for line in text.splitlines() if line]
            return super().write(text)

    marker = _mark(engines, "live", 0)
    shell = InteractiveShell.instance()
    magics = px_magics(shell, engines.cluster.view)
    magics.stream_output = False
    shell.magics_manager.register(magics)
    cell = ("%%px\nimport os\nos.environ['MPINB_WAIT_NOTICE'] = '0.5'\n"
            "if rank == 1:\n    time.sleep(2.5)\nmpinb.allreduce([1])\ndel os.environ['MPINB_WAIT_NOTICE']\n")
    stamped, saved = Stamped(), sys.stderr
    sys.stderr = stamped
    try:
        result = shell.run_cell(cell)
        ended = time.monotonic()
    finally:
        sys.stderr = saved
    assert result.error_in_exec is None, result.error_in_exec
    live = [(t, line) for t, line in stamped.lines if line.startswith("[stderr:0] mpinb: rank 0 has waited")]
    assert live and live[0][0] < ended - 1.0, stamped.lines  # seen a second or more before the cell ended
    engines.recovered(marker)


def test_outside_ipython_cells_change_nothing(engines: Engines) -> None:
    # Collectives run through apply (not a cell) pair as before, with the same values.
    def _total() -> float:
        import numpy as np

        import mpinb

        return float(mpinb.allreduce([np.ones(1)])[0][0])

    _total.__module__ = "__main__"  # shipped by value: the engines cannot import this test module
    marker = _mark(engines, "apply", 0)
    assert engines.cluster.view.apply_sync(_total) == [float(engines.n)] * engines.n
    engines.recovered(marker)


# Rank 1 computes for a while inside KMeans.fit (outside any collective); the others wait for it
# in Lloyd's loop, where Ctrl-C only sets the collective stop flag.
KMEANS_STALL = _third_assignment_on_rank_1(f"time.sleep({INTERRUPT_GRACE + 4.0})", rank_1_in_attempt=True)


@pytest.mark.parametrize("trial", range(max(1, TRIALS // 4)))
def test_the_first_interrupt_ends_every_wait_inside_kmeans_fit(engines: Engines, trial: int) -> None:
    marker = _mark(engines, "kmeans-interrupt", trial)
    ar = engines.cluster.view.execute(KMEANS_STALL, block=False)
    time.sleep(1.5)  # rank 1 sleeps in its third assignment, the others wait in the Lloyd iteration
    sent = time.time()
    engines.cluster.interrupt()
    engines.wait(ar)
    records = engines.cluster.pull("record")
    for rank, rec in enumerate(records):
        if rank == 1:  # it comes back late for a collective the others left: it learns so at once
            assert rec["raised"] in ("KeyboardInterrupt", "CollectiveAbandoned"), rec
            continue
        assert rec["raised"] == "KeyboardInterrupt", f"rank {rank}: {rec}"
        assert rec["ended"] - sent < INTERRUPT_GRACE + 2.0, (f"rank {rank} stopped {rec['ended'] - sent:.2f} s "
                                                             "after one interrupt")
    engines.recovered(marker)


def test_a_cell_sent_right_after_the_stop_button_runs_on_every_rank(engines: Engines) -> None:
    """ipykernel aborts the requests queued behind a failed one that was not silent (``%%px`` cells
    are not): the cell sent at once after an interrupt came back "aborted", with no output and no
    error, and never ran."""
    marker = _mark(engines, "after-stop", 0)
    stopped = engines.cluster.view.execute("if rank == 1:\n    time.sleep(4)\nmpinb.allreduce([np.ones(1)])",
                                           silent=False, block=False)  # as %%px sends it
    time.sleep(1.0)  # the ranks but 1 wait in the collective, rank 1 sleeps
    engines.cluster.interrupt()
    after = engines.cluster.view.execute("flag = float(mpinb.allreduce([np.full(1, rank + 1.0)])[0][0])",
                                         block=False)
    assert engines.wait(stopped) == set(range(engines.n)), engines.last_errors
    # Each rank's error says where it was: rank 1 at its own line, the others in the collective,
    # waiting for rank 1 (Python's own message is empty). The interrupt reaches the engines one by
    # one, so a waiting rank may first read that another waiting rank gave up; then it says so.
    said = engines.last_errors
    assert said[1].startswith("KeyboardInterrupt: interrupted on rank 1 ") and \
        "at line 2 of its cell (`time.sleep(4)`)" in said[1], said
    for rank in set(range(engines.n)) - {1}:
        interrupted = said[rank].startswith(f"KeyboardInterrupt: interrupted on rank {rank} ") and \
            "allreduce #" in said[rank] and "rank 1 (" in said[rank]
        told = re.match(rf"CollectiveAbandoned: allreduce #\d+ stopped on rank {rank}: rank \d gave up on "
                        r"allreduce #\d+ \(was interrupted \(KeyboardInterrupt\)\)", said[rank])
        assert interrupted or told, said
    assert engines.wait(after) == set(), engines.last_errors
    assert engines.cluster.pull("flag") == [engines.expected] * engines.n
    engines.recovered(marker)


def _fails_on_rank_1_before_a_collective() -> tuple[str, str, float]:
    import time

    import numpy as np

    import mpinb

    began = time.time()
    if mpinb.world().rank == 1:
        raise ZeroDivisionError("rank 1 failed first")
    try:
        mpinb.allreduce([np.ones(1)])
    except Exception as err:  # noqa: BLE001 - what the others were told
        return type(err).__name__, str(err), time.time() - began
    return "nothing", "", time.time() - began


def _sum_of_ranks(*_: object) -> float:
    import numpy as np

    import mpinb

    return float(mpinb.allreduce([np.full(1, mpinb.world().rank + 1.0)])[0][0])


# Sent by value (ipyparallel pickles functions of other modules by reference).
_fails_on_rank_1_before_a_collective.__module__ = _sum_of_ranks.__module__ = "__main__"


def test_a_function_sent_with_apply_is_a_cell(engines: Engines) -> None:
    """A function that raises on rank 1 before a collective the others entered ends their wait at
    once, naming rank 1; the next apply, and a map, pair with each other on every rank."""
    view = engines.cluster.view
    results = view.apply_async(_fails_on_rank_1_before_a_collective).get(timeout=HANG, return_exceptions=True)
    by_rank = dict(zip(engines.cluster.ids_by_rank, range(engines.n), strict=True))
    for engine, result in zip(view.targets if isinstance(view.targets, list) else engines.cluster.client.ids,
                              results, strict=True):
        rank = by_rank[engine]
        if rank == 1:
            assert "ZeroDivisionError" in repr(result), result
            continue
        assert not isinstance(result, Exception), f"rank {rank}: {result!r} {getattr(result, 'traceback', '')}"
        name, message, waited = result
        assert name == "CollectiveAbandoned" and "rank 1 ended its cell (raised ZeroDivisionError" in message, result
        assert waited < PROMPT, f"rank {rank} waited {waited:.1f} s"
    assert view.apply_async(_sum_of_ranks).get(timeout=HANG) == [engines.expected] * engines.n
    assert view.map_sync(_sum_of_ranks, range(engines.n)) == [engines.expected] * engines.n


def test_the_stop_button_shows_every_ranks_error(engines: Engines) -> None:
    """A blocking %%px in a real IPython shell, interrupted as the Stop button does (SIGINT to the
    kernel): the engines are signalled, and the cell raises every rank's error, grouped."""
    import signal
    import threading

    from IPython.core.interactiveshell import InteractiveShell

    from mpinb.client._ipp import px_magics

    marker = _mark(engines, "stop", 0)
    shell = InteractiveShell.instance()
    magics = px_magics(shell, engines.cluster.view)
    magics.stream_output = False
    shell.magics_manager.register(magics)
    cell = "%%px\nif rank == 1:\n    1 / 0\ntime.sleep(30)\n"
    timer = threading.Timer(1.5, lambda: os.kill(os.getpid(), signal.SIGINT))
    # As in a notebook's kernel: Python leaves SIGINT ignored when it started ignored (a job run in
    # the background of a script), and then nothing would reach the magic.
    saved = signal.signal(signal.SIGINT, signal.default_int_handler)
    began = time.monotonic()
    timer.start()
    try:
        result = shell.run_cell(cell)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, saved)
    took = time.monotonic() - began
    err = result.error_in_exec
    assert isinstance(err, CompositeError), repr(err)
    names = sorted({name for name, *_ in err.elist})
    assert names == ["KeyboardInterrupt", "ZeroDivisionError"], names
    assert took < 1.5 + 5.0, f"the stopped cell took {took:.1f} s"
    engines.recovered(marker)


KERAS_SETUP = """
import time
import numpy as np
import keras
import mpinb
import mpinb.keras as mk

rank = mpinb.world().rank
rng = np.random.default_rng(rank)
X = rng.normal(size=(256, 16)).astype("float32")
y = rng.integers(0, 3, 256)

def model():
    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((16,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)])
    m.compile(optimizer=keras.optimizers.SGD(0.01), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m

mk.fit(model(), X, y, batch_size=32, epochs=1, verbose=0)  # trace once before the timed trials
""" + ATTEMPT

# Rank 1's rows have 17 features: its train step raises inside Keras; the others wait in the
# gradient exchange, on a TensorFlow thread.
KERAS_SHAPE = """
record = None
if rank == 1:
    mk.fit(model(), rng.normal(size=(256, 17)).astype("float32"), y, batch_size=32, epochs=2, verbose=0)
else:
    attempt(lambda: mk.fit(model(), X, y, batch_size=32, epochs=2, verbose=0))
"""

# Rank 1 sleeps in a callback; the others wait in the exchange on TensorFlow's thread; one interrupt.
KERAS_STALL = f"""
record = None
class _Sleep(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        if batch == 2 and rank == 1:
            time.sleep({INTERRUPT_GRACE + 4.0})
attempt(lambda: mk.fit(model(), X, y, batch_size=32, epochs=2, verbose=0, callbacks=[_Sleep()]))
"""


@pytest.fixture(scope="module")
def keras_engines() -> Iterator[Engines]:
    with mpinb.MPICluster(n=2) as cluster:
        cluster.view.execute(KERAS_SETUP)
        yield Engines(cluster, 2)


@pytest.mark.parametrize("trial", range(TRIALS))
def test_a_failure_in_one_ranks_train_step_ends_every_wait(keras_engines: Engines, trial: int) -> None:
    marker = _mark(keras_engines, "keras-shape", trial)
    records = keras_engines.run(KERAS_SHAPE, fails_on={1})
    rec = records[0]
    assert rec["raised"] == "CollectiveAbandoned", rec
    assert "rank 1 ended its cell (raised ValueError:" in rec["message"] and "17" in rec["message"], rec
    assert rec["ended"] - rec["began"] < 5.0, rec  # fit's start-up included; the wait itself ends in 50 ms
    keras_engines.recovered(marker)


@pytest.mark.parametrize("trial", range(1))
def test_the_first_interrupt_ends_the_wait_on_tensorflows_thread(keras_engines: Engines, trial: int) -> None:
    marker = _mark(keras_engines, "keras-interrupt", trial)
    ar = keras_engines.cluster.view.execute(KERAS_STALL, block=False)
    time.sleep(2.0)
    sent = time.time()
    keras_engines.cluster.interrupt()
    keras_engines.wait(ar)
    records = keras_engines.cluster.pull("record")
    assert records[0]["raised"] == "KeyboardInterrupt", records[0]
    assert records[0]["ended"] - sent < INTERRUPT_GRACE + 2.5, (f"rank 0 stopped {records[0]['ended'] - sent:.2f} s "
                                                                "after the interrupt")
    assert records[1]["raised"] in ("KeyboardInterrupt", "CollectiveAbandoned"), records[1]
    keras_engines.recovered(marker)


def test_a_killed_rank_is_named_and_restart_replays_the_setup() -> None:
    import signal

    from mpinb.client._ipp import _require_engines

    with mpinb.MPICluster(n=2) as cluster:
        cluster.on_start("import numpy as np, mpinb\nsetup_ran = mpinb.world().rank + 100")
        assert cluster.pull("setup_ran") == [100, 101]
        cluster.view.execute("import time\nrank = mpinb.world().rank")
        ar = cluster.view.execute("mpinb.allreduce([1]) if rank == 0 else time.sleep(30)", block=False)
        time.sleep(0.5)
        pid = cluster._engine_pids[1]
        os.kill(pid, signal.SIGKILL)
        ar.wait(timeout=HANG)
        assert ar.ready(), "the cell outlived the killed rank"
        with pytest.raises(CompositeError) as info:
            ar.get(timeout=0)
        assert {name for name, *_ in info.value.elist} == {"EngineError"}
        deaths = None
        for _ in range(50):  # mpiexec writes its report as the job ends
            deaths = cluster.deaths()
            if deaths:
                break
            time.sleep(0.1)
        # The signal comes from mpiexec's report, which it writes only if it ends the job itself.
        assert names_the_dead_rank(deaths, 1, cluster.ids_by_rank[1], pid), deaths
        # view.execute's error says the same, and names the engines by rank.
        shown = "\n".join(info.value.render_traceback())
        said = [line.split("mpinb: ", 1)[1] for line in shown.splitlines() if "mpinb: " in line and " died" in line]
        assert said and names_the_dead_rank(said[0], 1, cluster.ids_by_rank[1], pid), shown
        assert "EngineError on rank" in shown, shown
        health = cluster.healthy(timeout=2)
        assert not health and 1 in health.dead, health
        with pytest.raises(RuntimeError, match=r"the engines of ranks? .*are gone.*cluster.restart\(\)"):
            _require_engines(cluster.view)
        cluster.restart()
        assert cluster.pull("setup_ran") == [100, 101]  # on_start ran again on the fresh engines
        assert cluster.healthy(timeout=5)
