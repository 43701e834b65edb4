"""The package itself: import mpinb starts no MPI and no framework; the public API is sorted,
documented, and says each function's kind."""

from __future__ import annotations

import subprocess
import sys

import mpinb


def test_import_does_not_start_mpi_or_import_frameworks() -> None:
    """``import mpinb`` is safe on the client: it neither initialises MPI nor loads a framework."""
    heavy = ("mpi4py.MPI", "tensorflow", "keras", "matplotlib", "ipyparallel", "sklearn", "scipy")
    code = f"import sys, mpinb; print([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]", f"import mpinb pulled in {out}"


def test_public_api_is_sorted_and_documented() -> None:
    assert mpinb.__all__ == sorted(mpinb.__all__)
    assert set(dir(mpinb)) == set(mpinb.__all__)
    for name in mpinb.__all__:
        if name in ("__version__", "KMeans"):
            continue
        obj = getattr(mpinb, name)
        doc = obj.__doc__ or ""
        assert doc.strip(), f"{name} has no docstring"


def test_public_functions_state_their_kind() -> None:
    for name in ("allreduce", "bcast", "gather_rows", "on_root", "rprint", "limit_threads", "world", "shard",
                 "check_all", "check_same", "raise_together", "shard_bounds"):
        second = (getattr(mpinb, name).__doc__ or "").strip().split("\n\n")[1]
        assert second.split(":")[0].split(".")[0].strip() in {"Collective", "Local", "Client"}, name
