"""Where the client meets what it hosts (issue 49): a rank killed by a native abort, more ranks than
cores and several clusters for one ``%%px``, a full disk under the engines' logs. Cells go through a
real IPython shell's ``%%px``."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from ipyparallel.error import CompositeError

import mpinb

CHECK = (b"2026-12-07 13:00:00.1 F tensorflow/core/framework/tensor.cc:896] Check failed: "
         b"dtype() == expected_dtype (1 vs. 3)")
_SAID = CHECK + b"\n"
# The last rank writes a native library's last words and aborts; the others wait in a cell.
ABORT = ("import os, time, mpinb\nrank = mpinb.world().rank\n"
         f"if rank == mpinb.world().size - 1:\n    os.write(2, {_SAID!r})\n    os.abort()\ntime.sleep(30)\n")


@pytest.fixture
def shell() -> Iterator[Any]:
    """A real IPython shell, so that ``%%px`` exists (clusters activate it as in a notebook)."""
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    try:
        yield ip
    finally:
        InteractiveShell.clear_instance()


def _cell(ip: Any, code: str) -> tuple[Any, str]:
    """Run ``code`` in ``ip``; its result and what it printed (both streams)."""
    said = io.StringIO()
    with contextlib.redirect_stderr(said), contextlib.redirect_stdout(said):
        result = ip.run_cell(code)
    return result, said.getvalue()


def _names_the_abort(text: str, rank: int, pid: int) -> None:
    assert re.search(rf"^(mpinb: )?rank {rank} \(engine \d+, pid {pid}\) died \(SIGABRT\); MPI ended the other "
                     "ranks", text, re.M), text
    assert f"Rank {rank}'s last lines on stderr:\n    " + CHECK.decode() in text, text
    assert "    Fatal Python error: Aborted (at line 5 of its cell)" in text, text
    others = "|".join(str(r) for r in range(rank))
    assert not re.search(rf"rank ({others}) \(engine", text), text  # the rank that aborted, not one MPI ended


@pytest.mark.parametrize("n", [2, 3])
def test_a_native_abort_is_named_with_its_signal_and_last_words(shell: Any, n: int) -> None:
    last = n - 1
    with mpinb.MPICluster(n=n) as cluster:
        pid = cluster._engine_pids[last]
        result, _ = _cell(shell, "%%px\n" + ABORT)
        err = result.error_in_exec
        assert isinstance(err, CompositeError), repr(err)
        _names_the_abort("\n".join(err.render_traceback()), last, pid)
        _names_the_abort(cluster.deaths() or "", last, pid)
        if n == 2:
            return
        # view.execute says the same, on fresh engines.
        cluster.restart()
        pid = cluster._engine_pids[last]
        with pytest.raises(CompositeError) as info:
            cluster.view.execute(ABORT, block=True)
        _names_the_abort("\n".join(info.value.render_traceback()), last, pid)


def test_ranks_beyond_the_cores_and_which_cluster_px_runs_on(shell: Any, monkeypatch, capsys) -> None:
    import mpinb.client.launch

    monkeypatch.setattr(mpinb.client.launch, "usable_cores", lambda: 1)
    first = mpinb.MPICluster(n=2)
    try:
        said = capsys.readouterr().err
        assert re.search(r"mpinb: starting 2 ranks on the 1 core of this machine \(2 ranks a core\): each rank "
                         r"computes at about 1/2 of a core's speed.*MPIR_CVAR_ENABLE_HEAVY_YIELD=1, "
                         r"MPIR_CVAR_POLLS_BEFORE_YIELD=1.*MPICluster\(n=1\) gives each rank a core of its own",
                         said), said
        assert re.search(r"mpinb: the 2 ranks started in [\d.]+ s; they run as \d+ processes holding [\d.]+ GiB",
                         said), said
        shell.user_ns["first"] = first
        _, said = _cell(shell, "%%px\nimport mpinb\nsize = mpinb.world().size")
        assert first.pull("size") == [2, 2]

        second = mpinb.MPICluster(n=1)  # as many ranks as cores: nothing said about cores
        try:
            said = capsys.readouterr().err
            assert "core" not in said, said
            assert re.search(r"mpinb: %%px now runs on the MPICluster n=1, started \d\d:\d\d:\d\d; first "
                             r"\(MPICluster n=2, started [\d:]+\) keeps running: first.activate\(\) points %%px "
                             r"back at it", said), said
            shell.user_ns["second"] = second
            result, _ = _cell(shell, "%%px\nimport mpinb\nsize = mpinb.world().size")
            assert result.error_in_exec is None, result.error_in_exec
            assert second.pull("size") == [1]
        finally:
            second.stop()
        said = capsys.readouterr().err
        assert re.search(r"mpinb: %%px runs on first \(MPICluster n=2, started [\d:]+\) again: second "
                         r"\(MPICluster n=1, started [\d:]+\) stopped", said), said
        result, _ = _cell(shell, "%%px\nback = mpinb.world().size")
        assert result.error_in_exec is None, result.error_in_exec
        assert first.pull("back") == [2, 2]
    finally:
        first.stop()
    result, _ = _cell(shell, "%%px\nx = 1")
    from IPython.core.error import UsageError

    assert type(result.error_in_exec) is UsageError, repr(result.error_in_exec)  # its message, no traceback
    assert re.match(r"%%px runs on first \(MPICluster n=2, .*\), which is stopped, and no other MPICluster is running: "
                    r"start one", str(result.error_in_exec)), result.error_in_exec


@pytest.fixture
def full_disk() -> Iterator[str]:
    """A 2 MiB tmpfs for the cluster's profile (filled by the test), unmounted after."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    folder = tempfile.mkdtemp(prefix="mpinb-full-")
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", folder], check=False).returncode:
        os.rmdir(folder)
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", folder], check=False)
        os.rmdir(folder)


def _fill(folder: str) -> None:
    fd = os.open(os.path.join(folder, "filler"), os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"x" * 65536)
    except OSError:
        pass
    finally:
        os.close(fd)


def test_output_a_full_disk_cannot_keep_is_dropped_and_said(shell: Any, full_disk: str) -> None:
    with mpinb.MPICluster(n=2, profile_dir=os.path.join(full_disk, "profile")) as cluster:
        _fill(full_disk)
        # 240 kB on each rank's stderr, as a print loop or a failing library writes it.
        result, said = _cell(shell, "%%px\nimport os\nfor i in range(4000):\n    os.write(2, b'x' * 59 + b'\\n')\n"
                                    "done = True")
        assert result.error_in_exec is None, result.error_in_exec
        assert cluster.pull("done") == [True, True]
        assert re.search(r"mpinb: [\d.]+ KiB of the engines' output could not be written to "
                         rf"{re.escape(full_disk)}/profile/log/ipengine-\S+\.log \(No space left on device; the "
                         rf"filesystem at {re.escape(full_disk)} is 100% full: 2.0 MiB used of 2.0 MiB, 0 B free\)",
                         said), said
        assert cluster.healthy(timeout=10)
        os.unlink(os.path.join(full_disk, "filler"))
        result, _ = _cell(shell, "%%px\nimport os\nos.write(2, b'after\\n')\nagain = True")
        assert result.error_in_exec is None, result.error_in_exec
        assert cluster.pull("again") == [True, True]
    # A disk full before the start: the error says where and how full (ipyparallel's said neither).
    _fill(full_disk)
    with pytest.raises(OSError, match=rf"MPICluster could not write the cluster's files in {re.escape(full_disk)}/"
                                      r"profile.*: No space left on device \(the filesystem at .* is 100% full"):
        mpinb.MPICluster(n=2, profile_dir=os.path.join(full_disk, "profile"))
