"""Rows in bounded chunks: how every row pass of mpinb keeps its temporaries small. Local.

(:mod:`mpinb.kmeans._kernels` has its own copy of these two for now, under the same names and
rules; it can import them from here.)
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["SUM_ELEMENTS", "chunk_rows", "chunks"]

# Values in one chunk's temporary (rows x width): 512 KiB of float64.
SUM_ELEMENTS = 1 << 16


def chunk_rows(
    width: int, elements: int = SUM_ELEMENTS, *, minimum: int = 256, maximum: int | None = None
) -> int:
    """Rows per chunk of a pass whose per-chunk buffer holds ``width`` values per row: about
    ``elements`` values in all, but at least ``minimum`` rows (so a very wide row does not make
    the per-chunk Python overhead dominate) and at most ``maximum`` rows."""
    rows = max(minimum, elements // max(width, 1))
    return int(rows if maximum is None else min(maximum, rows))


def chunks(n: int, step: int) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` of consecutive chunks of ``step`` rows covering ``range(n)``."""
    for s in range(0, n, step):
        yield s, min(s + step, n)
