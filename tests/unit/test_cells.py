"""The pieces of cell-aware collectives that need no MPI: cell records on the board, where a rank is
in its code, the one-line error description, short tracebacks, and the client's cell stamps."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from mpinb import _frames
from mpinb._collective import board as _board
from mpinb._collective.cells import CELL_KEY, TARGETS_KEY, describe_error
from mpinb._hidden_frames import without_mpinb_frames
from mpinb.client._ipp import stamp_cells


def test_describe_error_is_one_line_without_terminal_colours() -> None:
    assert describe_error(None) == "ended normally"
    assert describe_error(ZeroDivisionError("division by zero")) == "raised ZeroDivisionError: division by zero"
    keras_like = ValueError("Exception encountered.\n\n\x1b[1mInput 0 is incompatible\x1b[0m\n")
    assert describe_error(keras_like) == "raised ValueError: Exception encountered. Input 0 is incompatible"
    long = describe_error(RuntimeError("x" * 1000), limit=50)
    prefix = "raised RuntimeError: "
    assert long.startswith(prefix) and long.endswith("…") and len(long) == len(prefix) + 50
    assert describe_error(KeyboardInterrupt()) == "raised KeyboardInterrupt"


def test_a_cell_record_written_on_one_board_is_read_on_another() -> None:
    mine, peer = _board.Board(), _board.Board()
    try:
        peer.open_peers({0: mine.path}, leader=1)
        assert peer.read_cell(0).cell == 0 and not peer.read_cell(0).running
        mine.cell_begin(41)
        seen = peer.read_cell(0)
        assert (seen.cell, seen.running, seen.ended_cell) == (41, True, 0)
        mine.cell_end(41, 2, 7, "raised ZeroDivisionError: division by zero")
        mine.cell_begin(42)
        seen = peer.read_cell(0)
        assert (seen.cell, seen.running, seen.ended_cell, seen.ended_gen, seen.ended_index) == (42, True, 41, 2, 7)
        assert seen.text == "raised ZeroDivisionError: division by zero"
        assert 0 < time.time_ns() - seen.ended_ns < 5e9
        mine.cell_end(42, 2, 7, "é" * 400)  # longer than the row holds: cut, still readable
        assert peer.read_cell(0).text.startswith("é" * 100)
    finally:
        mine.unlink()
        peer.unlink()


def _remove_board_files(path: str) -> None:
    """A killed child's board (``path``) and where file (named in its row), which it had no chance
    to unlink."""
    with open(path, "rb") as row:
        words = memoryview(row.read()).cast("q")
    token = bytes(words[_board._WHERE_NAME].cast("B"))
    for leftover in (path, os.path.join(os.path.dirname(path), "mpinb-where-" + token.hex())):
        if any(token) or leftover == path:
            try:
                os.unlink(leftover)
            except FileNotFoundError:
                pass


def test_ask_where_names_the_function_another_process_is_in(tmp_path) -> None:
    child = tmp_path / "child.py"
    child.write_text(textwrap.dedent("""
        import time
        from mpinb._collective import board
        b = board.Board()
        print(b.path, flush=True)
        def crunch_numbers():
            time.sleep(30)
        crunch_numbers()
    """))
    proc = subprocess.Popen([sys.executable, str(child)], stdout=subprocess.PIPE, text=True)
    me = _board.Board()
    try:
        path = proc.stdout.readline().strip()
        me.open_peers({1: path}, leader=0)
        time.sleep(0.2)  # into the sleep
        found = me.ask_where([1])
        assert found == {1: "crunch_numbers (child.py:7)"}, found
        assert proc.poll() is None, "the signal must not end the process"
    finally:
        proc.kill()
        proc.wait()
        me.unlink()
        _remove_board_files(path)


_ASKER = """
import sys, time
from mpinb._collective import board
path, start, rounds = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
me = board.Board()
me.open_peers({1: path}, leader=0)
for i in range(rounds):
    while time.time() < start + 0.1 * i:  # every asker asks at the same moment
        pass
    print(me.ask_where([1]).get(1), flush=True)
me.unlink()
"""


def test_ranks_asking_one_process_at_once_all_get_its_answer(tmp_path) -> None:
    """Every waiting rank on a host asks a late rank at about the same moment: each must get the
    answer (an asker's truncation must not cut another's, nor a signal be lost while the late
    rank's handler still writes), even with threads that make each answer long."""
    child = tmp_path / "child.py"
    child.write_text(textwrap.dedent("""
        import threading, time
        from mpinb._collective import board
        b = board.Board()
        def deep(n):
            return deep(n - 1) if n else time.sleep(60)
        for _ in range(8):
            threading.Thread(target=deep, args=(30,), daemon=True).start()
        print(b.path, flush=True)
        def crunch_numbers():
            time.sleep(60)
        crunch_numbers()
    """))
    (tmp_path / "asker.py").write_text(_ASKER)
    proc = subprocess.Popen([sys.executable, str(child)], stdout=subprocess.PIPE, text=True)
    askers = []
    try:
        path = proc.stdout.readline().strip()
        start = time.time() + 1.0
        askers = [subprocess.Popen([sys.executable, str(tmp_path / "asker.py"), path, str(start), "8"],
                                   stdout=subprocess.PIPE, text=True) for _ in range(4)]
        answers = [a.communicate(timeout=60)[0].split("\n")[:-1] for a in askers]
        assert answers == [["crunch_numbers (child.py:11)"] * 8] * 4, answers
    finally:
        for a in askers:
            a.kill()
        proc.kill()
        proc.wait()
        _remove_board_files(path)


def test_an_answer_cut_short_or_still_being_written_is_never_misread() -> None:
    main = 0x7F00AA
    own = os.path.join(_frames._OWN, "_collective", "wait.py")

    def dump(*frames: str) -> str:
        other = 'Thread 0x00000000000000bb (most recent call first):\n  File "/x/threading.py", line 5 in run\n\n'
        lines = "".join(f'  File "{file}", line {line} in {func}\n' for file, line, func in frames)
        return other + f"Current thread 0x{main:016x} (most recent call first):\n" + lines

    answer = dump((own, 3, "poll"), ("/work/cell.py", 7, "crunch"), ("/work/cell.py", 9, "<module>"))
    assert _board._innermost(answer, main) == "crunch (cell.py:7), in mpinb's poll"
    assert _board._innermost(answer[:answer.index("cell.py")], main) is None  # the line is not whole yet
    assert _board._innermost(answer[answer.index("poll"):], main) is None  # its header was cut away
    # A tail cut short, then a whole answer (faulthandler writes dumps one after the other).
    assert _board._innermost(answer[answer.index("poll"):] + answer, main) == "crunch (cell.py:7), in mpinb's poll"
    assert _board._innermost(dump((own, 3, "poll")) + "\n", main) == "inside mpinb"
    assert _board._innermost(dump((own, 3, "poll")), main) is None  # more frames may follow


def test_ask_where_never_signals_a_process_that_is_gone() -> None:
    me, gone = _board.Board(), _board.Board()
    try:
        me.open_peers({1: gone.path}, leader=0)
        words = me.peers[1]
        words_view = memoryview(gone._own_map).cast("q")
        words_view[6] = 2**22 + 12345  # a PID no process has: the start time cannot match
        assert me.ask_where([1], timeout=0.05) == {}
        assert int(words[6]) == 2**22 + 12345
    finally:
        me.unlink()
        gone.unlink()


def _raise_inside_mpinb() -> None:
    from mpinb import deadline

    deadline.resolve(-1)  # raises ValueError inside mpinb.deadline


def test_short_tracebacks_keep_the_users_frames_only() -> None:
    with pytest.raises(ValueError) as info:
        _raise_inside_mpinb()
    full = info.value.__traceback__
    names = []
    tb = without_mpinb_frames(full)
    while tb is not None:
        names.append((tb.tb_frame.f_globals["__name__"], tb.tb_frame.f_code.co_name))
        tb = tb.tb_next
    assert names and all(not module.startswith("mpinb.") for module, _ in names), names
    assert ("test_cells", "_raise_inside_mpinb") in [(m.rsplit(".", 1)[-1], f) for m, f in names]
    assert full.tb_frame is not None  # the original is untouched


class _FakeClient:
    def __init__(self) -> None:
        self.sent: list[dict] = []

    def _build_targets(self, targets):
        ids = list(targets)
        return [f"ident-{i}".encode() for i in ids], ids

    def send_execute_request(self, socket, code, silent=True, metadata=None, ident=None):
        self.sent.append(dict(metadata or {}))

    def send_apply_request(self, socket, f, args=None, kwargs=None, metadata=None, track=False, ident=None):
        self.sent.append(dict(metadata or {}))

    def apply(self, targets):  # what DirectView.apply does: one metadata dict too
        idents, _ = self._build_targets(targets)
        metadata = {"label": None}
        for ident in idents:
            self.send_apply_request(None, print, [], {}, metadata=metadata, ident=ident)

    def execute(self, targets):  # what DirectView.execute does: one metadata dict for every engine
        idents, _ = self._build_targets(targets)
        metadata = {"label": None}
        for ident in idents:
            self.send_execute_request(None, "x = 1", metadata=metadata, ident=ident)


def test_one_execute_call_stamps_one_cell_id_and_its_targets() -> None:
    client = _FakeClient()
    stamp_cells(client)
    stamp_cells(client)  # idempotent
    client.execute([3, 1, 2])
    client.execute([0])
    first, second = client.sent[:3], client.sent[3:]
    assert len({m[CELL_KEY] for m in first}) == 1 and all(m[TARGETS_KEY] == [3, 1, 2] for m in first)
    assert second[0][TARGETS_KEY] == [0] and second[0][CELL_KEY] > first[0][CELL_KEY]
    client.send_execute_request(None, "y = 2")  # no shared dict: left for the engines to count
    assert CELL_KEY not in client.sent[-1]
    client.apply([2, 0])  # an apply is a cell too
    applied = client.sent[-2:]
    assert len({m[CELL_KEY] for m in applied}) == 1 and all(m[TARGETS_KEY] == [2, 0] for m in applied)
    assert applied[0][CELL_KEY] > second[0][CELL_KEY]


def test_an_applied_function_runs_as_a_cell_and_ends_it_with_its_error() -> None:
    from mpinb._collective import cells

    seen: list[tuple[str, int, object]] = []
    cells.on_cell(lambda event, cell, error: seen.append((event, cell.id, error)))
    try:
        assert cells._as_cell(lambda a, b=1: (cells.current().id, a + b))(1, b=2)[1] == 3
        assert [event for event, *_ in seen] == ["begin", "end"] and seen[0][1] > 0 and seen[1][2] is None
        with pytest.raises(ZeroDivisionError):
            cells._as_cell(lambda: 1 / 0)()
        assert seen[-1][0] == "end" and isinstance(seen[-1][2], ZeroDivisionError)
        assert cells.current().id == 0
    finally:
        cells._listeners.pop()


def test_the_first_engine_to_end_is_the_one_named_with_mpis_signal() -> None:
    from mpinb.client._ipp import engine_deaths

    log = ("[KernelNanny.3] Pipe closed, parent 4712 has status: zombie\n"
           "[KernelNanny.0] Pipe closed, parent 4711 has status: zombie\n"
           "=   PID 4711 RUNNING AT vm\n=   EXIT CODE: 9\n"
           "YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Killed (signal 9)\n")
    # Hydra's report is about the process it names (PID 4711): not the one that ended first (issue
    # 49: a SIGABRTed rank 2 was reported with the SIGTERM MPI sent rank 0).
    assert engine_deaths(log) == [(3, 4712, "its process ended")]
    assert engine_deaths(log.replace("PID 4711", "PID 4712")) == [(3, 4712, "SIGKILL")]
    assert engine_deaths(log.split("=")[0]) == [(3, 4712, "its process ended")]
    assert engine_deaths("nothing died") == []
    # The kernel's order, where this host saw it, outranks the nannies' (they race on a loaded host).
    assert engine_deaths(log, first_pid=4711) == [(0, 4711, "SIGKILL")]
    assert engine_deaths(log, first_pid=999) == [(3, 4712, "its process ended")]
    # ...even before the first's own nanny line has come through the launcher's output.
    rank0_only = log.split("\n", 1)[1]
    assert engine_deaths(rank0_only, first_pid=4712, first_engine=3) == [(3, 4712, "its process ended")]
    assert engine_deaths(rank0_only, first_pid=4712) == [(0, 4711, "SIGKILL")]  # no engine id: the nannies' word


def test_an_interrupt_while_ipython_shows_a_cells_error_keeps_that_error(capsys) -> None:
    """The Stop button's signal can land on a rank whose cell has just failed (it read that another
    rank gave up): raising there replaced the error that said why by an interrupt inside IPython's
    traceback formatter."""
    import signal

    from IPython.core.interactiveshell import InteractiveShell

    from mpinb._collective.cells import interrupted

    shell = InteractiveShell.instance()
    render = shell.InteractiveTB.structured_traceback

    def signalled_while_rendering(*args, **kwargs):
        signal.raise_signal(signal.SIGINT)
        return render(*args, **kwargs)

    saved = signal.signal(signal.SIGINT, interrupted)
    try:
        shell.InteractiveTB.structured_traceback = signalled_while_rendering
        result = shell.run_cell("raise ValueError('rank 0 gave up on allreduce #3')")
        # A cell's own code is still interrupted, and says where.
        with pytest.raises(KeyboardInterrupt, match="interrupted .*at "):
            signal.raise_signal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, saved)
        del shell.InteractiveTB.structured_traceback
        InteractiveShell.clear_instance()
    shown = capsys.readouterr()
    assert isinstance(result.error_in_exec, ValueError)
    assert "rank 0 gave up on allreduce #3" in shown.out + shown.err
    assert "KeyboardInterrupt" not in shown.out + shown.err, shown


def test_the_rank_panel_counts_the_user_s_cells_not_the_client_s_own_calls() -> None:
    # cluster.pull (ipyparallel's getter) and healthy() (mpinb's probe) run as cells, so that their
    # collectives are checked like any; the panel's "cell N" counts only the user's.
    from mpinb import _progress
    from mpinb._collective import cells
    from mpinb._engine import rank as rank_here

    seen: list[bool] = []
    cells.on_cell(lambda event, cell, error: seen.append(cell.plumbing) if event == "begin" else None)
    before = _progress._state.cells
    try:
        cells._as_cell(rank_here)()
        def getter() -> int:  # as ipyparallel's own pull getter is
            return 1

        getter.__module__ = "ipyparallel.util"
        cells._as_cell(getter)()
        for cell in (cells.Cell(1, plumbing=True), cells.Cell(2)):
            _progress._on_cell("begin", cell, None)
        cells._as_cell(lambda: 1)()  # the user's own function
    finally:
        cells._listeners.pop()
    assert seen == [True, True, False]
    assert _progress._state.cells == before + 1
