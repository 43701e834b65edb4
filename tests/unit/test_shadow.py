"""A folder named ``mpinb`` in the directory Python starts in (a clone, the notebook in its parent)
shadows an editable install: each place that can tell says what shadows what and how to fix it --
the engines' boot and first call, ``MPICluster.start`` in the kernel, ``mpinb info``/``mpinb check``.
tests/cluster/test_client_calls.py starts a real cluster in such a directory."""

from __future__ import annotations

import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from mpinb import _shadow

SAYS = (r"`import mpinb` found the folder {folder}, not the installed mpinb at .*That folder has no __init__.py, so "
        r"Python imported it as an empty namespace package .*Start Jupyter \(or run the script\) from another "
        r"directory")


@pytest.fixture
def parent(tmp_path: Path) -> Path:
    """The parent of a clone: ``mpinb/`` (the clone, no ``__init__.py``) holding ``mpinb/mpinb/__init__.py``."""
    (tmp_path / "mpinb" / "mpinb").mkdir(parents=True)
    (tmp_path / "mpinb" / "mpinb" / "__init__.py").write_text("")
    if _shadow.in_directory(tmp_path) is None:
        pytest.skip("mpinb is installed as a regular package here, which a namespace folder cannot shadow")
    return tmp_path


def _run(code: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *code], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_a_namespace_module_is_named_with_its_folder_and_the_fix() -> None:
    shadow = types.ModuleType("mpinb")
    shadow.__file__ = None
    shadow.__path__ = ["/home/me/mpinb"]  # type: ignore[attr-defined]
    assert _shadow.shadowing(shadow) is not None
    assert _shadow.shadowing(shadow).startswith("`import mpinb` found the folder /home/me/mpinb, not the installed")
    import mpinb

    assert _shadow.shadowing(mpinb) is None and _shadow.shadowing() is None


def test_the_engines_first_call_and_boot_say_what_shadows_what(parent: Path) -> None:
    folder = str(parent / "mpinb")
    called = _run(["-c", "import mpinb; from mpinb import _engine; _engine.identity()"], parent)
    assert called.returncode == 1
    last = called.stderr.strip().splitlines()[-1]
    pattern = rf"ImportError: In the engine of rank 0 \(.*, directory {parent}\): " + SAYS.format(folder=folder)
    assert re.match(pattern, last), last
    assert f"(cd {folder} runs from inside the clone)" in last
    booted = _run(["-m", "mpinb._engine_boot", "--help"], parent)  # the engines' command line, without a cluster
    says = f"mpinb: `import mpinb` found the folder {folder}, not the installed"
    assert booted.stderr.startswith(says), booted.stderr


def test_mpinb_info_and_check_say_so_instead_of_running_ranks_that_fail(
    parent: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from mpinb.client import cli

    monkeypatch.chdir(parent)
    monkeypatch.setattr("mpinb.client.launch.run_mpi", lambda *a, **k: pytest.fail("ranks started in the shadow"))
    assert cli.main(["check"]) == 1
    assert cli.main(["info"]) == 1
    err = capsys.readouterr().err
    assert err.count(f"mpinb: in this directory, `import mpinb` found the folder {parent / 'mpinb'}") == 2, err


def test_mpicluster_refuses_to_start_from_a_shadowed_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    from mpinb.client import MPICluster

    shadow = types.ModuleType("mpinb")
    shadow.__file__ = None
    shadow.__path__ = ["/home/me/mpinb"]  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "mpinb", shadow)
    with pytest.raises(ImportError, match=r"In this kernel: `import mpinb` found the folder /home/me/mpinb"):
        MPICluster(n=2)  # before any process starts: nothing to clean up
