"""A small collective self-check, run under mpiexec by ``mpinb info`` and ``mpinb demo --check``."""

from __future__ import annotations

import json
import sys
import time

import numpy as np

import mpinb


def main() -> None:
    """Check the collective layer on every rank: sums, a max and a rank-ordered gather of 1,000 rows.

    Collective. Each rank prints its host, local rank, rows, threads and device; root prints the
    summary as one ``RANKCHECK {json}`` line; every rank exits 1 when a check fails."""
    t0 = time.perf_counter()
    w = mpinb.world()
    threads = mpinb.limit_threads()
    from mpinb.gpus import use_one_gpu_per_rank

    try:
        device = str(use_one_gpu_per_rank())
    except ValueError:  # raised alike on every rank: a check reports it, training would fail on it
        device = "more ranks than GPUs on a host (docs/gpu.md: share=True)"
    lo, hi = mpinb.shard_bounds(1000, rank=w.rank, size=w.size)
    local = np.arange(lo, hi, dtype=np.float64)
    total, count = mpinb.allreduce([local.sum(), np.int64(local.size)])
    (biggest,) = mpinb.allreduce([local.max(initial=-1.0)], op="max")
    rows = mpinb.gather_rows(np.full((hi - lo, 2), w.rank, dtype=np.int32), root=None)
    order_ok = bool(np.all(np.diff(rows[:, 0]) >= 0))
    mpinb.rprint(f"host {w.host}, local rank {w.local_rank}/{w.local_size}, rows [{lo}, {hi}), "
                 f"{threads} thread(s), {device}")
    summary = {
        "ranks": w.size,
        "sum_of_0_to_999": float(total),
        "expected": 999 * 1000 / 2,
        "rows_counted": int(count),
        "max_row": float(biggest),
        "gathered_in_rank_order": order_ok,
        "seconds": round(time.perf_counter() - t0, 3),
    }
    ok = total == summary["expected"] and count == 1000 and biggest == 999 and order_ok
    summary["ok"] = bool(ok)
    if w.is_root:
        print("RANKCHECK " + json.dumps(summary), flush=True)
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
