"""Importing TensorFlow without its start-up log lines on every rank.

TensorFlow's C++ side logs a few INFO lines when it loads (oneDNN, CPU features), written by absl
straight to file descriptor 2 before its logging is set up, so ``TF_CPP_MIN_LOG_LEVEL`` no longer
hides them (TensorFlow 2.16 and later). On N engines that is 2N lines in every ``%%px`` cell that
first imports it. Unless the user set ``TF_CPP_MIN_LOG_LEVEL`` (then they want TensorFlow's own
choice), the import runs with descriptor 2 sent to a temporary file, and everything but those INFO
lines and absl's notice about them is written back to stderr.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["import_tensorflow", "quiet_future_import"]

# absl's line format: severity letter, MMDD, time, thread id, file:line] message.
_INFO = re.compile(r"^I\d{4} [\d:.]+ +\d+ [\w./-]+:\d+\] ")
_NOTICE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"


def import_tensorflow() -> None:
    """Import TensorFlow once, quietly unless the user asked for its logs (local)."""
    if "tensorflow" in sys.modules:
        return
    with _quiet():
        import tensorflow  # noqa: F401


def quiet_future_import() -> None:
    """Make a later ``import tensorflow`` in this process quiet too, however it is spelled
    (``import keras`` loads it as well). Local; ``mpinb.MPICluster`` runs it on the engines it starts."""
    if "tensorflow" not in sys.modules and not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


@contextmanager
def _quiet() -> Iterator[None]:
    if "TF_CPP_MIN_LOG_LEVEL" in os.environ:
        yield
        return
    # Also for TensorFlow's later C++ messages: warnings and errors still show, INFO does not.
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "1"
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            text = capture.read().decode(errors="replace")
            kept = [line for line in text.splitlines() if line.strip() != _NOTICE and not _INFO.match(line)]
            if kept:
                print("\n".join(kept), file=sys.stderr, flush=True)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds ``tensorflow`` as the import system would, and runs its loading in :func:`_quiet`."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)  # once is enough, and the search below must not find us again
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def create_module(self, spec: Any) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        with _quiet():
            self.inner.exec_module(module)

    def __getattr__(self, name: str) -> Any:
        # Everything else (resource readers, get_filename, ...) is the real loader's.
        return getattr(self.inner, name)
