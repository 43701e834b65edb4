"""The machine a benchmark ran on, written into every result file: ratios differ between CPUs.

``write_report(path, report)`` adds ``"machine"`` -- the host name, the CPU model, the vector
instruction sets that decide a kernel's speed (SSE4.2, AVX, AVX2, FMA, AVX-512's subsets, AMX),
the cores this process may use and the machine's logical CPUs, memory, Python, NumPy and its BLAS,
and the MPI library and the GPUs -- and writes the JSON. Benchmarks import it as a sibling module.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["describe", "write_report"]

# The flags of /proc/cpuinfo that change how fast numerical kernels run (the rest is noise here).
_ISA = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512dq", "avx512bw", "avx512vl", "avx512_vnni",
        "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "asimd", "sve")


def describe() -> dict[str, Any]:
    """What ran the benchmark, as far as this process can tell."""
    import numpy as np

    usable = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    info: dict[str, Any] = {"node": platform.node(), "cpu_model": _cpu_model(), "isa": _isa(),
                            "cores": len(usable), "logical_cpus": os.cpu_count(), "memory_gib": _memory_gib(),
                            "python": platform.python_version(), "numpy": np.__version__, "blas": _blas(),
                            "mpi_library": _mpi_library(), "gpus": _gpus()}
    return info


def write_report(path: str | os.PathLike[str], report: dict[str, Any], indent: int = 2) -> dict[str, Any]:
    """Write ``report`` with the machine's description (key ``"machine"``) as JSON to ``path``."""
    stamped = {**report, "machine": describe()}
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(stamped, indent=indent) + "\n")
    return stamped


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def _cpu_model() -> str:
    for line in _cpuinfo():
        if line.startswith(("model name", "Model")):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown"


def _isa() -> list[str]:
    for line in _cpuinfo():
        if line.startswith(("flags", "Features")):
            flags = set(line.split(":", 1)[1].split())
            return [flag for flag in _ISA if flag in flags]
    return []


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _blas() -> str:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "unknown"
    found = [f"{p.get('internal_api')} {p.get('version')} ({p.get('architecture')})" for p in threadpool_info()
             if p.get("user_api") == "blas"]
    return "; ".join(sorted(set(found))) or "unknown"


def _gpus() -> list[str]:
    """The NVIDIA GPUs the driver lists (``nvidia-smi -L``); none where there is no driver."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        text = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.split(" (UUID")[0].strip() for line in text.splitlines() if line.startswith("GPU ")]


def _mpi_library() -> str:
    try:
        from mpi4py import MPI
    except ImportError:
        return "unknown"
    return MPI.Get_library_version().splitlines()[0].strip()
