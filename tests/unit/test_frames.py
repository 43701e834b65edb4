"""Where a rank is in its own code: the user's line, and the library call beside it."""

from __future__ import annotations

import os
import sysconfig

from mpinb import _frames
from mpinb._frames import Frame

LIBRARY = os.path.join(sysconfig.get_paths()["purelib"], "numpy", "linalg", "_linalg.py")
MPINB = os.path.join(_frames._OWN, "comm.py")
CELL = "/tmp/ipykernel_4242/3068021854.py"


def test_a_rank_in_c_code_is_named_by_the_users_line_and_the_library_call() -> None:
    frames = [Frame(LIBRARY, 1655, "eigh"), Frame(CELL, 3, "<module>")]
    assert _frames.describe(frames) == "line 3 of its cell, in eigh (_linalg.py:1655)"
    assert _frames.describe(frames, "w = np.linalg.eigh(a)") == \
        "line 3 of its cell (`w = np.linalg.eigh(a)`), in eigh (_linalg.py:1655)"


def test_a_function_of_the_user_is_named_with_its_file_or_its_cell() -> None:
    script = "/home/me/train.py"
    assert _frames.describe([Frame(script, 12, "step"), Frame(script, 30, "<module>")]) == "step (train.py:12)"
    assert _frames.describe([Frame(CELL, 5, "step"), Frame(CELL, 9, "<module>")]) == "step, line 5 of its cell"


def test_a_call_into_mpinb_names_the_public_function_the_user_called() -> None:
    inner = os.path.join(_frames._OWN, "_collective", "wait.py")
    frames = [Frame(inner, 80, "poll"), Frame(MPINB, 40, "allreduce"), Frame(CELL, 2, "<module>")]
    assert _frames.describe(frames) == "line 2 of its cell, in mpinb's allreduce"
    assert _frames.describe(frames[:2]) == "inside mpinb"
    assert _frames.describe([]) is None


def test_without_a_users_frame_the_innermost_library_call_is_named() -> None:
    loop = os.path.join(sysconfig.get_paths()["stdlib"], "selectors.py")
    assert _frames.describe([Frame(loop, 468, "select"), Frame("<frozen runpy>", 88, "_run_code")]) == \
        "select (selectors.py:468)"


def test_a_live_frame_and_its_source_line_are_read() -> None:
    import sys

    frames = _frames.frames_of(sys._getframe())
    assert frames[0].func == "test_a_live_frame_and_its_source_line_are_read"
    assert _frames.user_source(frames) == "frames = _frames.frames_of(sys._getframe())"
