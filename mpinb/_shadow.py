"""Whether ``import mpinb`` found this package, or a folder named ``mpinb`` that shadows it.

A folder named ``mpinb`` without ``__init__.py`` in the directory a notebook runs from (a clone,
with the notebook in the clone's parent) is what ``import mpinb`` finds first there: Python
imports it as an empty namespace package, ahead of an editable install (found by a finder that
comes after ``sys.path``), in the kernel and in the engines, which run in the notebook's directory.
``dir(mpinb)`` is then empty and ``mpinb.world`` does not exist. mpinb's own submodules still load
from the installed package (the editable finder maps them), so code here runs where the user's
``import mpinb`` failed silently: the engines' first call (:func:`mpinb._engine.identity`) and
boot, ``MPICluster.start`` in the kernel and ``mpinb info`` check it and say what shadows what.

Local: no MPI.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["check", "in_directory", "shadowing"]

_INSTALLED = Path(__file__).resolve().parent  # this module is the installed package's, always


def shadowing(module: Any = None) -> str | None:
    """What is wrong with the ``mpinb`` this process imported (``module``, default
    ``sys.modules["mpinb"]``), in one sentence with the fix, or ``None`` when it is this package."""
    if module is None:
        module = sys.modules.get("mpinb")
    if module is None or getattr(module, "__file__", None) is not None:
        return None  # a regular package: this one (its submodules, this one included, come from it)
    folders = [str(p) for p in getattr(module, "__path__", [])]
    return _message(folders)


def in_directory(directory: str | os.PathLike[str]) -> str | None:
    """What ``import mpinb`` finds in a Python started in ``directory`` (as the ranks of ``mpiexec
    python -m ...``, a notebook's kernel and its engines are), when that is a folder shadowing this
    package. Asks such a Python (about 0.1 s): this process's own path need not be the one it gets."""
    import json
    import subprocess

    probe = "import json, mpinb; print(json.dumps([mpinb.__file__, list(getattr(mpinb, '__path__', []))]))"
    try:
        done = subprocess.run([sys.executable, "-c", probe], cwd=directory, capture_output=True, text=True,
                              timeout=60, check=True)
        file, folders = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None  # no answer: nothing to say about shadowing (the caller's own check runs next)
    return None if file is not None else _message(folders)


def check(where: str) -> None:
    """Raise ``ImportError`` with :func:`shadowing`'s sentence, naming ``where`` ("this kernel",
    "rank 1 (host, pid 4242)"), when this process's ``mpinb`` is a shadowing folder."""
    problem = shadowing()
    if problem is not None:
        raise ImportError(f"In {where}: {problem}")


def _message(folders: list[str]) -> str:
    folders = list(dict.fromkeys(folders))  # sys.path may name the directory more than once
    shown = ", ".join(folders) or "an empty folder"
    inner = [Path(f) / "mpinb" for f in folders if (Path(f) / "mpinb" / "__init__.py").is_file()]
    clone = f" (cd {inner[0].parent} runs from inside the clone)" if inner else ""
    return (
        f"`import mpinb` found the folder {shown}, not the installed mpinb at {_INSTALLED}. That folder has no "
        f"__init__.py, so Python imported it as an empty namespace package (dir(mpinb) == [], no mpinb.world), "
        f"because the directory it is in ({os.path.dirname(folders[0]) if folders else os.getcwd()}) comes first "
        f"on sys.path: Python, Jupyter and the MPI engines put the directory they start in there. Start Jupyter "
        f"(or run the script) from another directory{clone}, or rename that folder (then restart the notebook's "
        f"kernel)."
    )
