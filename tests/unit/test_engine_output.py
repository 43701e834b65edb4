"""The client's relay of mpiexec's output (mpinb.client._engine_output), without a cluster: a disk that
refuses every write (/dev/full), ranks' lines as Hydra tags them, a fatal signal's dump."""

from __future__ import annotations

import os
import time

import pytest

pytest.importorskip("ipyparallel")

from mpinb.client._engine_output import EngineOutput, disk_usage  # noqa: E402


def _feed(relay: EngineOutput, data: bytes) -> None:
    os.write(relay.write_end, data)


def _settle(relay: EngineOutput, done) -> None:
    for _ in range(200):
        if done():
            return
        time.sleep(0.01)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_disk_that_refuses_writes_drops_the_output_and_says_so_once() -> None:
    relay = EngineOutput("/dev/full")
    try:
        _feed(relay, b"[0] x\n" * 50_000)  # 300 kB: more than a pipe holds, never blocked
        _settle(relay, lambda: relay.dropped >= 300_000)
        assert relay.dropped == 300_000
        note = relay.news()
        assert note is not None
        assert note.startswith("293.0 KiB of the engines' output could not be written to /dev/full"), note
        assert "No space left on device" in note, note
        assert relay.news() is None  # said once, not at every request
    finally:
        relay.close()


def test_output_reaches_the_file_and_each_ranks_last_words_are_kept(tmp_path) -> None:
    path = tmp_path / "engines.log"
    relay = EngineOutput(str(path))
    try:
        _feed(relay, b"[1] 2026-12-07 13:21:24.126 [IPEngine.1.1] Handling execute_request: abc\n"
                     b"[1] early\n[0] rank zero says\n"
                     b"[1] 2026-12-07 13:00:00.1 F tensor.cc:896] Check failed: dtype() == expected_dtype\n"
                     b"[1] Fatal Python error: Aborted\n[1] \n[1] Current thread 0x00007f (most recent call first):\n"
                     b"[1]   File [1] \"/tmp/x/ipykernel_7/123.py\", line 5 in <module>\n"
                     b"[1] late native line\n"
                     b"[1] 2026-12-07 13:21:24.158 [KernelNanny.1] Pipe closed, parent 7 has status: zombie\n")
        _settle(relay, lambda: b"KernelNanny" in path.read_bytes())
        assert path.read_bytes().count(b"\n") == 10
        signal, lines = relay.last_words(1)
        assert signal == "SIGABRT"
        assert lines == ["early", "2026-12-07 13:00:00.1 F tensor.cc:896] Check failed: dtype() == expected_dtype",
                         "late native line", "Fatal Python error: Aborted (at line 5 of its cell)"], lines
        assert relay.last_words(0) == (None, ["rank zero says"])
        assert "Pipe closed" in relay.recent()
        assert relay.news() is None
    finally:
        relay.close()


def test_disk_usage_names_the_mount_point_and_how_full(tmp_path) -> None:
    said = disk_usage(str(tmp_path / "log" / "x.log"))
    assert said.startswith("the filesystem at /") and "% full: " in said and " free" in said, said
