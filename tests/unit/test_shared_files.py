"""The files a rank keeps in ``/dev/shm`` (its status-board row and its where file) against another
account of the same machine: a name planted before the rank creates its file (a symlink to one of
the owner's files, a file the other account can read, a FIFO) is never opened or written, and a
rank never opens a neighbour's file that is not a private file of its own account.

The planting is done as ``nobody`` for real (``subprocess`` with ``user=``), so these run as root.
Random names cannot be guessed, so the tests make the rank draw the planted name first.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import textwrap
import time
import uuid

import numpy as np
import pytest

from mpinb._collective import board as _board

pytestmark = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0 or not os.path.isdir("/dev/shm"),
    reason="plants files as another account: needs root and /dev/shm",
)

_FOLDER = "/dev/shm"


def _nobody() -> str:
    try:
        pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no account 'nobody' to plant files as")
    return "nobody"


def _as_nobody(*command: str) -> None:
    subprocess.run(list(command), user=_nobody(), check=True, timeout=30)


def _plant(kind: str, path: str, target: str) -> None:
    if kind == "symlink":
        _as_nobody("ln", "-s", target, path)
    elif kind == "readable file":
        _as_nobody("sh", "-c", f"umask 0 && : > {path}")
    else:
        _as_nobody("mkfifo", "-m", "666", path)


# A rank that makes its board and where file with the planted hex drawn first (for both names), then
# answers a where-signal (faulthandler writes its stacks into its where file) and says what it made.
_RANK = """
import os, signal, sys, time, uuid
planted = uuid.UUID(sys.argv[1])
draws = iter([planted, planted])
real = uuid.uuid4
uuid.uuid4 = lambda: next(draws, None) or real()
from mpinb._collective import board
b = board.Board()
os.kill(os.getpid(), signal.SIGUSR2)
time.sleep(0.2)
st = os.stat(b._where)
print(b.path, b._where, oct(st.st_mode & 0o777), st.st_uid, os.path.getsize(b._where), flush=True)
b.unlink()
"""


@pytest.mark.parametrize("kind", ["symlink", "readable file", "fifo"])
def test_a_name_planted_by_another_account_is_never_used(tmp_path, kind) -> None:
    secret = tmp_path / "secret"
    secret.mkdir(mode=0o700)
    victim = secret / "victim"
    victim.write_text("precious\n")
    planted = uuid.uuid4()
    paths = [os.path.join(_FOLDER, f"mpinb-{what}-{planted.hex}") for what in ("board", "where")]
    try:
        for path in paths:
            _plant(kind, path, str(victim))
        script = tmp_path / "rank.py"
        script.write_text(textwrap.dedent(_RANK))
        done = subprocess.run([sys.executable, str(script), str(planted)], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr[-2000:]
        board_path, where_path, mode, owner, size = done.stdout.split()
        assert board_path not in paths and where_path not in paths  # another name, not the planted one
        assert (mode, int(owner)) == ("0o600", 0)
        assert int(size) > 0, "the rank's own where file got its stack dump"
        assert victim.read_text() == "precious\n"
        assert not list(secret.iterdir())[1:], "nothing created in the owner's private folder"
        if kind == "readable file":
            assert os.path.getsize(paths[1]) == 0 and os.path.getsize(paths[0]) == 0
    finally:
        for path in paths:
            if os.path.lexists(path):
                os.unlink(path)


def _fake_row(path: str, pid: int, started: int, token: bytes) -> None:
    """A board row as a rank writes it: its PID, its start time and its where file's name."""
    words = np.zeros(_board._WORDS, dtype=np.int64)
    words[_board._PID], words[_board._STARTED] = pid, started
    words[_board._WHERE_NAME] = np.frombuffer(token, dtype=np.int64)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(words.tobytes())


def test_a_neighbours_file_that_is_not_a_private_file_of_this_account_is_not_opened(tmp_path) -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    me = _board.Board()
    token = uuid.uuid4().bytes
    row = os.path.join(_FOLDER, f"mpinb-board-{uuid.uuid4().hex}")
    where = os.path.join(_FOLDER, f"mpinb-where-{token.hex()}")
    link = os.path.join(_FOLDER, f"mpinb-board-{uuid.uuid4().hex}")
    try:
        deadline = time.monotonic() + 10
        while not (started := _board._started(sleeper.pid)) and time.monotonic() < deadline:
            time.sleep(0.01)
        _fake_row(row, sleeper.pid, started, token)
        _plant("readable file", where, "")  # the row names a file nobody made and can read
        _as_nobody("ln", "-s", row, link)  # and another rank's row path is nobody's symlink to it
        me.open_peers({1: row, 2: link}, leader=0)
        assert 1 in me.peers and 2 not in me.peers
        assert (sleeper.pid, started) not in _board._peer_where
        assert me.ask_where([1], timeout=0.3) == {}
        assert os.path.getsize(where) == 0
    finally:
        sleeper.kill()
        sleeper.wait()
        me.unlink()
        for path in (row, where, link):
            if os.path.lexists(path):
                os.unlink(path)
