"""Where a rank is in its own code: the user's innermost line, and the library call it is inside. Local.

Texts that say where a rank was (a waiting notice, the Stop button's ``KeyboardInterrupt``) name
the line the user wrote -- "line 3 of its cell" -- and, beside it, the library function it had
called (``eigh (_linalg.py:1655)``): the library's frame alone does not tell a user which of their
calls it was, and the user's line alone does not tell that the rank is in C code.
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
import types
from collections.abc import Iterable
from typing import NamedTuple

__all__ = ["Frame", "describe", "frames_of", "is_cell", "kind", "user_source"]

_OWN = os.path.dirname(os.path.abspath(__file__)) + os.sep  # the mpinb package
# Where installed code lives: the standard library and every site-packages of this interpreter.
_LIBRARIES = tuple(sorted({
    os.path.abspath(p) + os.sep
    for p in [*(sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")),
              *(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))]
    if p
}))
# The names IPython and ipykernel give a cell's code: ``/tmp/ipykernel_4242/3068021854.py``,
# ``<ipython-input-3-...>``, ``<cell line: 3>``.
_CELL = re.compile(r"(^|[/\\])ipykernel_\d+[/\\]\d+\.py$|^<ipython-input-|^<cell")


class Frame(NamedTuple):
    file: str
    line: int
    func: str


def is_cell(file: str) -> bool:
    """Whether ``file`` is the name IPython gave a notebook cell's code."""
    return bool(_CELL.search(file))


def kind(file: str) -> str:
    """``"mpinb"``, ``"library"`` (the standard library, site-packages) or ``"user"``."""
    if file.startswith(_OWN):
        return "mpinb"
    if file.startswith("<frozen ") or (not is_cell(file) and file.startswith(_LIBRARIES)):
        return "library"
    return "user"


def _site(frame: Frame, source: str = "") -> str:
    shown = f" (`{source}`)" if source else ""
    if is_cell(frame.file):
        where = f"line {frame.line} of its cell" if frame.func == "<module>" else \
            f"{frame.func}, line {frame.line} of its cell"
        return where + shown
    return f"{frame.func} ({os.path.basename(frame.file)}:{frame.line}){shown}"


def describe(frames: Iterable[Frame], source: str = "") -> str | None:
    """``frames`` innermost first, as one phrase: the user's innermost line, and the innermost call
    outside mpinb beside it where that is a library's -- ``"line 3 of its cell, in eigh
    (_linalg.py:1655)"``. ``"inside mpinb"`` when every frame is mpinb's; ``None`` for no frames.
    ``source`` is the user's line's text, where the caller could read it."""
    frames = list(frames)
    if not frames:
        return None
    outside = next((f for f in frames if kind(f.file) != "mpinb"), None)
    user = next((f for f in frames if kind(f.file) == "user"), None)
    if outside is None:
        return "inside mpinb"
    if user is None:
        return _site(outside)
    inner = frames.index(user)
    if outside is user:
        called = frames[inner - 1] if inner and kind(frames[inner - 1].file) == "mpinb" else None
        return _site(user, source) + (f", in mpinb's {called.func}" if called is not None else "")
    return f"{_site(user, source)}, in {outside.func} ({os.path.basename(outside.file)}:{outside.line})"


def frames_of(frame: types.FrameType | None) -> list[Frame]:
    """A live frame and its callers, innermost first."""
    out = []
    while frame is not None:
        out.append(Frame(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return out


def user_source(frames: list[Frame]) -> str:
    """The text of the user's innermost line (this process's own frames only: IPython keeps a
    cell's source in ``linecache``); empty when it cannot be read."""
    import linecache

    user = next((f for f in frames if kind(f.file) == "user"), None)
    return "" if user is None else linecache.getline(user.file, user.line).strip()[:120]
