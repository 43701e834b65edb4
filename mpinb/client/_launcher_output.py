"""What a launcher (``mpiexec``, ``srun``) and the engines under it printed, read from its output file.

Client. Read as bytes decoded with replacement: a launcher may print what is not UTF-8, and a
report of why engines did not start must not fail on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["has_ended", "last_lines", "output_of", "read_output", "relays_of", "tail"]


def read_output(path: str | None) -> str:
    """The whole output file at ``path`` ("" when there is none)."""
    if not path:
        return ""
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def tail(text: str, lines: int = 4) -> str:
    """The last ``lines`` non-blank lines of ``text`` on one line, at most 600 characters."""
    kept = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " | ".join(kept[-lines:])[-600:]


def last_lines(launchers: Sequence[Any], lines: int = 4) -> str:
    """The last lines every launcher's output file holds, or "nothing"."""
    said = " | ".join(tail(read_output(getattr(launcher, "output_file", None)), lines) for launcher in launchers)
    return said.strip(" |") or "nothing"


def has_ended(launcher: Any) -> bool:
    """Whether ``launcher``'s process (srun, mpiexec) ended. ipyparallel reads the output of an
    ended launcher as UTF-8 and raises on other bytes (a dying engine's or MPI's): the process
    ended all the same, and its output is read here, undecodable bytes replaced."""
    poll = getattr(launcher, "poll", None)
    if poll is None:
        return False
    try:
        return poll() is not None
    except UnicodeDecodeError:
        launcher._output = read_output(getattr(launcher, "output_file", None))
        return True


def output_of(launcher: Any) -> str:
    """All that ``launcher`` printed so far ("" before its output file exists)."""
    try:
        return launcher.get_output(remove=False) or ""
    except UnicodeDecodeError:
        return read_output(getattr(launcher, "output_file", None))
    except Exception:  # noqa: BLE001 - no output file (yet)
        return ""


def relays_of(cluster: Any) -> list[Any]:
    """The output relays (:class:`mpinb.client._engine_output.EngineOutput`) of ``cluster``'s engine
    launchers (an ``ipyparallel.Cluster``); none for launchers that write their files themselves."""
    if cluster is None:
        return []
    return [r for launcher in list(cluster.engines.values()) if (r := getattr(launcher, "relay", None)) is not None]
