"""A run's report: one self-contained HTML file of what the rank panel saw, openable without a kernel.

Client. :func:`report` asks every rank for the steps it recorded (:func:`mpinb._progress.history`:
each step's compute, exchange and wait, the fit's loss or inertia, the rank's memory over time) and
writes per-rank timelines, the slowest rank of every step, memory per rank and the curves, as inline
SVG drawn by matplotlib: no script, no external file. :func:`render` builds the page from those
records and is what the tests call.
"""

from __future__ import annotations

import html
import io
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["render", "report", "stragglers"]

_COLOURS = {"compute": "#4c72b0", "exchange": "#55a868", "wait": "#c44e52"}
_FIELDS = ("fit", "kind", "step", "time", "compute", "exchange", "wait", "value")


def report(path: str | Path, cluster: Any = None, *, title: str | None = None) -> Path:
    """Write the report of the steps the ranks recorded so far to ``path`` (one HTML file). Client.

    ``cluster`` defaults to the :class:`~mpinb.MPICluster` that ``%%px`` runs on. Call it once the
    cells you want in it have ended (it asks every rank for its records, which waits for a running
    cell). Returns the path written.

    Examples
    --------
    >>> mpinb.report("run.html")  # doctest: +SKIP
    PosixPath('run.html')
    """
    from mpinb import _progress

    if cluster is None:
        from mpinb.client import _targets

        cluster = _targets.holder()
    if cluster is None or getattr(cluster, "view", None) is None:
        raise RuntimeError("report() needs a running MPICluster: start one, or pass cluster=.")
    histories = sorted(cluster.view.apply_sync(_progress.history), key=lambda h: h["rank"])
    out = Path(path)
    out.write_text(render(histories, title=title or f"mpinb run report, {len(histories)} ranks"), encoding="utf-8")
    return out


def stragglers(histories: Sequence[dict[str, Any]]) -> list[tuple[tuple[Any, ...], int]]:
    """For every step all ranks recorded, in order: the step's key ``(fit, kind, step)`` and the rank
    that computed longest in it (the one the others waited for)."""
    by_rank = [{tuple(s[:3]): s for s in h["steps"]} for h in histories]
    if len(by_rank) < 2:
        return []
    common = set.intersection(*(set(b) for b in by_rank))
    order = sorted(common, key=lambda k: max(b[k][3] for b in by_rank))
    return [(k, max(range(len(by_rank)), key=lambda r: (by_rank[r][k][4], -r))) for k in order]


def render(histories: Sequence[dict[str, Any]], *, title: str = "mpinb run report") -> str:
    """The report's HTML for the ranks' records (``histories`` in rank order)."""
    slow = stragglers(histories)
    counts = [0] * len(histories)
    for _, r in slow:
        counts[r] += 1
    rows = []
    for h, n_slow in zip(histories, counts, strict=True):
        steps = h["steps"]
        c, e, w = (sum(s[i] for s in steps) for i in (4, 5, 6))
        peak = max([m for _, m in h.get("memory", [])] + ([h["rss"]] if h.get("rss") else []), default=None)
        share = w / (c + e + w) if c + e + w else 0.0
        rows.append(f"<tr><td>{h['rank']}</td><td>{html.escape(str(h.get('host', '')))}</td><td>{len(steps)}</td>"
                    f"<td>{c:.2f} s</td><td>{e:.2f} s</td><td>{w:.2f} s ({share:.0%})</td>"
                    f"<td>{n_slow}</td><td>{'-' if peak is None else f'{peak / 2**20:,.0f} MiB'}</td></tr>")
    head = "".join(f"<th>{h}</th>" for h in ("rank", "host", "steps", "compute", "exchange", "wait",
                                             "slowest in", "peak memory"))
    table = f"<table class='summary'><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    figures = [("Per-rank timeline: compute, exchange, wait of every step", _timelines(histories)),
               ("The slowest rank of every step", _straggler_figure(slow, len(histories))),
               ("Memory per rank", _memory_figure(histories)),
               ("Loss and inertia", _curves_figure(histories))]
    body = "".join(f"<section><h2>{html.escape(name)}</h2>{svg}</section>" for name, svg in figures if svg)
    when = time.strftime("%Y-%m-%d %H:%M:%S")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            "<style>body{font-family:sans-serif;margin:2em}table.summary{border-collapse:collapse}"
            "table.summary td,table.summary th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
            "svg{max-width:100%;height:auto}</style></head>"
            f"<body><h1>{html.escape(title)}</h1><p>Written {when}. Each step's time on each rank splits into "
            "<b style='color:#4c72b0'>compute</b> (outside mpinb's collectives), "
            "<b style='color:#55a868'>exchange</b> (data moving) and <b style='color:#c44e52'>wait</b> "
            "(arrived, the others not yet). The slowest rank of a step is the one that computed longest: "
            f"the others waited for it.</p>{table}{body}</body></html>")


def _svg(fig: Any) -> str:
    import matplotlib

    buf = io.StringIO()
    # Text as text, not glyph outlines: a third of the size, and searchable in the browser.
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig.savefig(buf, format="svg", bbox_inches="tight")  # a Figure of its own: pyplot never holds it
    text = buf.getvalue()
    return text[text.index("<svg"):]  # inline: without the XML prologue and doctype


def _figure(height: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(9, height))


def _timelines(histories: Sequence[dict[str, Any]]) -> str:
    if not any(h["steps"] for h in histories):
        return ""
    t0 = min(s[3] - s[4] - s[5] - s[6] for h in histories for s in h["steps"])
    fig = _figure(0.5 + 0.45 * len(histories))
    ax = fig.subplots()
    for row, h in enumerate(histories):
        spans: dict[str, list[tuple[float, float]]] = {k: [] for k in _COLOURS}
        for s in h["steps"]:
            start = s[3] - t0 - s[4] - s[5] - s[6]
            for name, length in (("compute", s[4]), ("exchange", s[5]), ("wait", s[6])):
                spans[name].append((start, length))
                start += length
        for name, colour in _COLOURS.items():
            ax.broken_barh(spans[name], (row - 0.4, 0.8), facecolors=colour, label=name if row == 0 else None)
    ax.set_yticks(range(len(histories)), [f"rank {h['rank']}" for h in histories])
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    ax.legend(loc="upper right", fontsize="small", ncols=3)
    return _svg(fig)


def _straggler_figure(slow: list[tuple[tuple[Any, ...], int]], size: int) -> str:
    if not slow:
        return ""
    fig = _figure(0.8 + 0.3 * size)
    ax = fig.subplots()
    ax.plot(range(1, len(slow) + 1), [r for _, r in slow], "o", ms=3, color=_COLOURS["wait"])
    ax.set_yticks(range(size), [f"rank {r}" for r in range(size)])
    ax.set_ylim(size - 0.5, -0.5)
    ax.set_xlabel("step (every rank's, in order)")
    return _svg(fig)


def _memory_figure(histories: Sequence[dict[str, Any]]) -> str:
    if not any(h.get("memory") for h in histories):
        return ""
    t0 = min(t for h in histories for t, _ in h.get("memory", []))
    fig = _figure(2.6)
    ax = fig.subplots()
    for h in histories:
        points = h.get("memory", [])
        ax.plot([t - t0 for t, _ in points], [m / 2**20 for _, m in points], label=f"rank {h['rank']}")
    ax.set_xlabel("seconds")
    ax.set_ylabel("resident memory (MiB)")
    ax.legend(loc="best", fontsize="small")
    return _svg(fig)


def _curves_figure(histories: Sequence[dict[str, Any]]) -> str:
    # Losses and inertias are global values (every rank has the same): rank 0's curves.
    series: dict[str, list[tuple[int, float]]] = {}
    for fit, _kind, step, metrics in histories[0].get("curves", []) if histories else []:
        for name, value in sorted(metrics.items()):
            series.setdefault(f"{name} (fit {fit})", []).append((step, float(value)))
    if not series:
        return ""
    fig = _figure(2.8)
    ax = fig.subplots()
    for label, points in series.items():
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o" if len(points) < 30 else None, ms=3,
                label=label)
    if all(p[1] > 0 for points in series.values() for p in points):
        ax.set_yscale("log")
    ax.set_xlabel("iteration / epoch")
    ax.legend(loc="best", fontsize="small")
    return _svg(fig)
