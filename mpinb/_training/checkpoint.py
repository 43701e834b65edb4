"""The checkpoint record: a model file written atomically, and ``<file>.json`` saying which epoch
it holds, so that a resumed run starts from the epoch after it.

Local: rank 0 runs these (through :func:`mpinb.on_root`, which gives the outcome to every rank).
The framework's glue supplies the functions that write and read the model itself.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

__all__ = ["record_path", "saved_epoch", "save_atomically"]


def record_path(filepath: str) -> str:
    """Where the epoch record of the checkpoint ``filepath`` lives."""
    return f"{filepath}.json"


def save_atomically(write: Callable[[str], None], filepath: str, epoch: int) -> None:
    """``write(path)`` to a temporary file beside ``filepath``, rename it, then record ``epoch``.

    A crash never leaves a half-written checkpoint, nor a record that names an epoch the file does
    not hold yet: the file is complete before the record changes.
    """
    directory = os.path.dirname(os.path.abspath(filepath))
    os.makedirs(directory, exist_ok=True)
    stem, ext = os.path.splitext(filepath)
    tmp = f"{stem}.tmp-{os.getpid()}{ext}"  # the same extension: a writer may choose its format by it
    write(tmp)
    os.replace(tmp, filepath)
    record = {"epoch": int(epoch), "saved_at": time.time()}
    path = record_path(filepath)
    with open(f"{path}.tmp", "w") as fh:
        json.dump(record, fh)
    os.replace(f"{path}.tmp", path)


def saved_epoch(filepath: str) -> int | None:
    """The epoch the checkpoint ``filepath`` holds, or ``None`` when there is no checkpoint yet."""
    if not os.path.exists(filepath):
        return None
    path = record_path(filepath)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{filepath} exists but its epoch record {path} does not; "
                                "was it written by RootCheckpoint?")
    with open(path) as fh:
        return int(json.load(fh)["epoch"])
