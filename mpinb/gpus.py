"""One GPU per rank: each rank of a host sees exactly one of the host's GPUs, chosen by its local rank.

TensorFlow maps nearly all the memory of every GPU it can see, so ranks that share a host must be
told apart before TensorFlow initialises its devices; the only knob that works that early is the
process environment (``CUDA_VISIBLE_DEVICES``, ``TF_FORCE_GPU_ALLOW_GROWTH``). The inventory is read
without TensorFlow: ``CUDA_VISIBLE_DEVICES`` when set, else the driver (``nvidia-smi -L``, then
``/proc/driver/nvidia/gpus``). The choice itself is a pure function of every rank's (host, visible
list), gathered once, so every rank reaches the same verdict and a host with more ranks than GPUs
fails on every rank of every host with one message, before any work.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Choice", "assign", "device", "inventory", "use_one_gpu_per_rank"]

_MODES = ("auto", "share", "off")
_MEMORY_SHARE = 0.9  # of a shared GPU's memory, divided among its ranks when no limit is given

# What this process was given, once decided (the same answer for every later call).
_chosen: Choice | None = None


@dataclass(frozen=True)
class Choice:
    """One rank's device: ``gpu`` (its entry in the host's ``CUDA_VISIBLE_DEVICES``, or ``None`` for
    the CPU), the ranks sharing it, and the memory limit in MiB set when shared."""

    gpu: str | None
    sharers: int = 1
    memory_limit_mb: int | None = None

    def __str__(self) -> str:
        if self.gpu is None:
            return "CPU"
        shared = f", shared by {self.sharers} ranks, {self.memory_limit_mb} MiB" if self.sharers > 1 else ""
        return f"GPU {self.gpu}{shared}"


def inventory(env: Mapping[str, str] | None = None, *,
              driver: Callable[[], list[str]] | None = None) -> list[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` entries (indices or UUIDs).

    Local. ``CUDA_VISIBLE_DEVICES`` when set (an empty value, or ``-1``, means none), else the
    driver's list; TensorFlow is not imported.
    """
    env = os.environ if env is None else env
    listed = env.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        entries = [e.strip() for e in listed.split(",") if e.strip()]
        # CUDA stops at the first invalid entry; "-1" is the usual way to hide every GPU.
        out: list[str] = []
        for e in entries:
            if e.startswith("-"):
                break
            out.append(e)
        return out
    return (driver or _driver_gpus)()


def assign(seen: Sequence[tuple[str, Sequence[str]]], *, share: bool = False,
           bound: bool = False) -> list[tuple[str | None, int]]:
    """Each rank's GPU from every rank's ``(host, visible GPUs)``, in rank order.

    Local (a pure function: every rank computes it from the same gathered list). Ranks of a host
    that see the same list share it out by their order among them: the first gets its first
    entry, and so on. Ranks that see different lists (a launcher's per-task binding) each choose
    within their own. With ``bound`` (Slurm's ``--gpus-per-task=1``), a rank seeing one GPU keeps it.

    Returns
    -------
    list of (str or None, int)
        Per rank, the GPU entry (``None``: no GPU, the CPU) and how many ranks share it.

    Raises
    ------
    ValueError
        If some group of ranks outnumbers its GPUs and ``share`` is false; the message names every
        such host.
    """
    groups: dict[tuple[str, tuple[str, ...]], list[int]] = {}
    for r, (host, gpus) in enumerate(seen):
        key = (host, tuple(gpus)) if not (bound and len(gpus) == 1) else (f"{host}\0{r}", tuple(gpus))
        groups.setdefault(key, []).append(r)
    out: list[tuple[str | None, int]] = [(None, 1)] * len(seen)
    crowded = []
    for (host, gpus), ranks in groups.items():
        if not gpus:
            continue
        if len(ranks) > len(gpus) and not share:
            crowded.append(f"{len(ranks)} ranks on {host.split(chr(0))[0]} see {len(gpus)} GPU(s) "
                           f"(CUDA_VISIBLE_DEVICES={','.join(gpus)})")
            continue
        per_gpu = [0] * len(gpus)
        for i, _ in enumerate(ranks):
            per_gpu[i % len(gpus)] += 1
        for i, r in enumerate(ranks):
            out[r] = (gpus[i % len(gpus)], per_gpu[i % len(gpus)])
    if crowded:
        raise ValueError(
            "mpinb gives each rank its own GPU, but " + "; ".join(sorted(crowded)) + ". Start at most one "
            "rank per GPU on each host, or share them explicitly: "
            "mpinb.gpus.use_one_gpu_per_rank(share=True) "
            "(MPINB_GPUS=share in the engines' environment), which gives each rank a memory limit."
        )
    return out


def use_one_gpu_per_rank(*, share: bool | None = None, memory_limit_mb: int | None = None,
                         comm: Any = None) -> Choice:
    """Make this rank see exactly one GPU of its host, chosen by its local rank, with memory growth on.

    Collective: every rank calls it, before TensorFlow initialises its devices (the first lines of
    a batch script; ``MPICluster`` engines do it when they start, and ``mpinb.keras.fit`` and the
    other ``mpinb.keras`` calls do it if it has not been done and TensorFlow has not initialised
    yet). Sets ``CUDA_VISIBLE_DEVICES`` to the rank's GPU and ``TF_FORCE_GPU_ALLOW_GROWTH=true``. On
    a host without GPUs nothing changes. Later calls return the first answer.

    Parameters
    ----------
    share : bool, optional
        Let ranks outnumber a host's GPUs: they take them round-robin, each with a memory limit.
        Default: ``MPINB_GPUS=share`` in the environment, else ``False`` (an error instead).
    memory_limit_mb : int, optional
        Each sharing rank's GPU memory in MiB. Default: ``MPINB_GPU_MEMORY_LIMIT_MB``, else 90% of
        the GPU's memory (``nvidia-smi``) divided by the ranks sharing it.
    comm : mpi4py.MPI.Comm, optional
        Defaults to ``MPI.COMM_WORLD``.

    Returns
    -------
    Choice
        This rank's device (``str(choice)``: ``"GPU 3"`` or ``"CPU"``).

    Raises
    ------
    ValueError
        On every rank, if a host has more ranks than GPUs and sharing was not asked for.
    RuntimeError
        If TensorFlow has already initialised its devices in this process (too late to choose).
    """
    global _chosen
    if _chosen is not None:
        return _chosen
    mode = os.environ.get("MPINB_GPUS", "auto").strip().lower() or "auto"
    if mode not in _MODES:
        raise ValueError(f"MPINB_GPUS must be one of {', '.join(_MODES)}; got {mode!r}.")
    if share is None:
        share = mode == "share"
    if memory_limit_mb is None and os.environ.get("MPINB_GPU_MEMORY_LIMIT_MB"):
        memory_limit_mb = int(os.environ["MPINB_GPU_MEMORY_LIMIT_MB"])
    import mpinb

    w = mpinb.world(comm)
    mine = inventory() if mode != "off" else []
    bound = os.environ.get("SLURM_GPUS_PER_TASK", "").strip() == "1"
    seen = _gather_seen(w.host, mine, comm)
    if mode == "off" or not any(g for _, g in seen):
        _chosen = Choice(None)
        return _chosen
    if tf_initialised():
        # Same answer on every rank only if every rank imported TF alike; raise before touching anything.
        raise RuntimeError(
            "TensorFlow has already initialised its devices in this process, so mpinb can no longer "
            "choose this rank's GPU: call mpinb.gpus.use_one_gpu_per_rank() first, before any TensorFlow "
            "operation (at the top of the script)."
        )
    gpu, sharers = assign(seen, share=share, bound=bound)[w.rank]
    limit = None
    if gpu is not None and sharers > 1:
        limit = memory_limit_mb or _default_limit(gpu, sharers)
    _chosen = _apply(Choice(gpu, sharers, limit))
    return _chosen


def device() -> str:
    """What this rank was given: ``"GPU 3"``, ``"CPU"``, or ``"not chosen"`` before
    :func:`use_one_gpu_per_rank`. Local."""
    return "not chosen" if _chosen is None else str(_chosen)


def tf_initialised() -> bool:
    """Whether TensorFlow has created its eager context (and so read ``CUDA_VISIBLE_DEVICES``). Local."""
    if "tensorflow" not in sys.modules:
        return False
    try:
        from tensorflow.python.eager import context

        return context.context()._context_handle is not None  # noqa: SLF001 - no public probe exists
    except Exception:  # noqa: BLE001 - an unknown TF layout: assume not yet
        return False


def ensure_chosen(comm: Any = None) -> None:
    """:func:`use_one_gpu_per_rank` unless done already or too late. Collective (the first time)."""
    if _chosen is None and not tf_initialised():
        use_one_gpu_per_rank(comm=comm)


def _gather_seen(host: str, mine: list[str], comm: Any) -> list[tuple[str, list[str]]]:
    """Every rank's (host, visible GPUs), in rank order: one max and one gather of fixed-width rows."""
    import mpinb

    raw = json.dumps([host, mine]).encode()
    (width,) = mpinb.allreduce([np.int64(len(raw))], op="max", comm=comm)
    row = np.zeros((1, int(width)), dtype=np.uint8)
    row[0, : len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    rows = mpinb.gather_rows(row, root=None, comm=comm)
    return [tuple(json.loads(bytes(r).rstrip(b"\0").decode())) for r in rows]


def _apply(choice: Choice) -> Choice:
    if choice.gpu is None:
        return choice
    os.environ["CUDA_VISIBLE_DEVICES"] = choice.gpu
    os.environ["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"
    if choice.memory_limit_mb is not None:
        # No environment variable caps TensorFlow's memory: the logical device must be configured
        # through its API, before its devices initialise (importing it does not initialise them).
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            os.environ.pop("TF_FORCE_GPU_ALLOW_GROWTH")  # growth and a fixed limit exclude each other
            tf.config.set_logical_device_configuration(
                gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=choice.memory_limit_mb)])
    return choice


def _default_limit(gpu: str, sharers: int) -> int:
    total = _gpu_memory_mb(gpu)
    if total is None:
        raise ValueError(
            f"{sharers} ranks share GPU {gpu} but its memory could not be read (nvidia-smi); pass "
            "memory_limit_mb=... (MPINB_GPU_MEMORY_LIMIT_MB in the engines' environment)."
        )
    return int(total * _MEMORY_SHARE / sharers)


def _run(args: list[str]) -> str | None:
    exe = shutil.which(args[0])
    if exe is None:
        return None
    try:
        done = subprocess.run([exe, *args[1:]], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _driver_gpus() -> list[str]:
    out = _run(["nvidia-smi", "-L"])
    if out is not None:
        return [str(i) for i, line in enumerate(ln for ln in out.splitlines() if ln.startswith("GPU "))]
    try:
        return [str(i) for i in range(len(os.listdir("/proc/driver/nvidia/gpus")))]
    except OSError:
        return []


def _gpu_memory_mb(gpu: str) -> int | None:
    out = _run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", f"--id={gpu}"])
    try:
        return int(out.split()[0]) if out else None
    except (ValueError, IndexError):
        return None
