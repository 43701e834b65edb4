"""Short tracebacks on engines: mpinb's own frames are left out of what a cell shows. Local.

An error raised inside an mpinb collective arrives with 60-270 lines of mpinb internals between the
user's call and the message; the user needs their own frames and the message. On an IPython engine,
:func:`install` makes the shell show every traceback without frames from mpinb's modules (and
without those of the chained exceptions). ``MPINB_DEBUG=1`` in the engines' environment shows
everything.
"""

from __future__ import annotations

import os
import types
from typing import Any

__all__ = ["install", "without_mpinb_frames"]

_PACKAGE = __name__.split(".")[0]


def install(shell: Any) -> None:
    """Have ``shell`` show tracebacks without mpinb's frames (idempotent; nothing with MPINB_DEBUG=1)."""
    if os.environ.get("MPINB_DEBUG", "") not in ("", "0") or getattr(shell, "_mpinb_short_tracebacks", False):
        return
    shell.set_custom_exc((BaseException,), _show)
    shell._mpinb_short_tracebacks = True


def without_mpinb_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The traceback ``tb`` without the frames of mpinb's modules (rebuilt; ``tb`` is unchanged)."""
    kept = []
    while tb is not None:
        if not tb.tb_frame.f_globals.get("__name__", "").startswith(_PACKAGE + "."):
            kept.append(tb)
        tb = tb.tb_next
    rebuilt = None
    for entry in reversed(kept):
        rebuilt = types.TracebackType(rebuilt, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return rebuilt


def _show(shell: Any, kind: type[BaseException], value: BaseException, tb: Any, tb_offset: Any = None) -> None:
    seen: set[int] = set()
    chained: BaseException | None = value
    while chained is not None and id(chained) not in seen:  # the causes show their frames too
        seen.add(id(chained))
        if chained is not value and chained.__traceback__ is not None:
            chained.__traceback__ = without_mpinb_frames(chained.__traceback__)
        chained = chained.__cause__ or (None if chained.__suppress_context__ else chained.__context__)
    shell.showtraceback((kind, value, without_mpinb_frames(tb) or tb), tb_offset=tb_offset,
                        running_compiled_code=True)
