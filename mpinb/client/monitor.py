"""The rank panel: one row per MPI rank -- what it does now, how far its fit is, how its last step's
time split, how much memory it holds -- updated while cells run, the slowest rank marked.

Client. The ranks publish their state themselves (:mod:`mpinb._progress`, through ipyparallel's data
publication, twice a second while a cell runs, once on a host with more ranks than cores); this side
only reads what the client has received, so the panel never queues work behind a running cell. The
derivation from messages to rows is pure (:func:`latest`, :func:`slowest`, :func:`rows`,
:func:`text_table`, :func:`html_table`) and tested without a cluster.
"""

from __future__ import annotations

import html
import threading
import time
import weakref
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["RankMonitor", "html_table", "keep_rank_messages", "latest", "rows", "slowest", "text_table"]

KEY = "mpinb_ranks"  # mpinb._progress.KEY, not imported: that module is the engines'
_POLL = 0.5  # seconds between looks at what the client received
_FIELDS = ("fit", "kind", "step", "time", "compute", "exchange", "wait", "value")
COLUMNS = ("rank", "state", "progress", "last step: compute / exchange / wait", "memory")


def latest(messages: Iterable[Mapping[str, Any]]) -> dict[int, Mapping[str, Any]]:
    """Each rank's newest message, by rank (the engine's clock, then its own count, decide)."""
    out: dict[int, Mapping[str, Any]] = {}
    for message in messages:
        try:
            rank = int(message["rank"])
            key = (float(message["time"]), int(message["seq"]))
        except (KeyError, TypeError, ValueError):
            continue
        held = out.get(rank)
        if held is None or key > (float(held["time"]), int(held["seq"])):
            out[rank] = message
    return out


def slowest(messages: Mapping[int, Mapping[str, Any]]) -> int | None:
    """The rank the others wait for: the one most ranks wait for right now, when some wait in a
    collective; else the one that computed longest in the last step every rank finished. ``None``
    with fewer than two ranks heard from, or nothing to compare."""
    if len(messages) < 2:
        return None
    waited: dict[int, int] = {}
    for message in messages.values():
        op = message.get("op")
        if message.get("cell") and op and op.get("phase") == "waiting":
            for r in op.get("waiting_for") or ():
                waited[r] = waited.get(r, 0) + 1
    if waited:
        # Most waited for; among equals, one that is not itself waiting (it holds the others up).
        def busy(r: int) -> int:
            op = (messages.get(r) or {}).get("op")
            return 0 if op and op.get("phase") == "waiting" else 1

        return max(sorted(waited), key=lambda r: (waited[r], busy(r)))
    steps = {rank: {_step_key(rec): rec for rec in message.get("recent") or ()} for rank, message in messages.items()}
    common = set.intersection(*(set(s) for s in steps.values())) if steps else set()
    if not common:
        return None
    last = max(common, key=lambda k: max(steps[r][k][3] for r in steps))
    computes = {r: float(steps[r][last][4]) for r in steps}
    return max(sorted(computes), key=lambda r: computes[r])


def rows(messages: Mapping[int, Mapping[str, Any]], size: int | None = None,
         running: Iterable[int] | None = None) -> list[dict[str, Any]]:
    """One row per rank, in rank order (``size`` ranks when known, those heard from otherwise); each
    a dict of ``rank``, ``state``, ``progress``, ``split`` (the last step's compute, exchange and wait
    in seconds, or ``None``), ``memory`` (bytes), ``slowest`` and ``engine``. ``running``: the ranks
    the client still waits for; a rank not among them is shown idle whatever its last message said
    (its cell ended after its last message)."""
    ranks = range(size) if size is not None else sorted(messages)
    mark = slowest(messages)
    running_set = None if running is None else set(running)
    out: list[dict[str, Any]] = []
    for rank in ranks:
        message = messages.get(rank)
        if message is None:
            out.append({"rank": rank, "engine": None, "state": "no news yet", "progress": "", "split": None,
                        "memory": None, "slowest": False})
            continue
        ended = running_set is not None and rank not in running_set
        recent = message.get("recent") or ()
        split = tuple(float(x) for x in recent[-1][4:7]) if recent else None
        out.append({"rank": rank, "engine": message.get("engine"), "state": _state(message, ended),
                    "progress": _progress(message.get("fit")), "split": split, "memory": message.get("rss"),
                    "slowest": rank == mark})
    return out


def text_table(table: list[dict[str, Any]]) -> str:
    """The rows as plain text: what ``repr`` and ``print`` show outside a browser."""
    cells = [[str(r["rank"]) + (" *" if r["slowest"] else ""), r["state"], r["progress"] or "-",
              _split_text(r["split"]), _memory_text(r["memory"])] for r in table]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(COLUMNS)]
    line = "  ".join(h.ljust(w) for h, w in zip(COLUMNS, widths, strict=True)).rstrip()
    body = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    note = [] if not any(r["slowest"] for r in table) else ["* the slowest rank: the others wait for it"]
    return "\n".join([line, *body, *note])


def html_table(table: list[dict[str, Any]], caption: str = "") -> str:
    """The rows as one HTML table (inline styles only), the slowest rank's row marked."""
    head = "".join(f"<th style='text-align:left;padding:2px 8px'>{html.escape(h)}</th>" for h in COLUMNS)
    body = []
    for r in table:
        style = "background:#fde2e2" if r["slowest"] else ""
        marker = " <b title='the others wait for this rank'>&#9664; slowest</b>"
        rank = f"{r['rank']}" + (marker if r["slowest"] else "")
        cells = [rank, html.escape(r["state"]), html.escape(r["progress"] or "-"), _split_html(r["split"]),
                 html.escape(_memory_text(r["memory"]))]
        body.append(f"<tr style='{style}' data-rank='{r['rank']}'>"
                    + "".join(f"<td style='padding:2px 8px;vertical-align:top'>{c}</td>" for c in cells) + "</tr>")
    cap = f"<caption style='text-align:left'>{html.escape(caption)}</caption>" if caption else ""
    return (f"<table class='mpinb-ranks' style='border-collapse:collapse;font-family:monospace;font-size:12px'>"
            f"{cap}<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")


class RankMonitor:
    """The live rank panel of an :class:`~mpinb.MPICluster` (:meth:`~mpinb.MPICluster.monitor`).

    Client. In a notebook it displays as an HTML table that a background thread refreshes twice a
    second while cells run on the ranks (and freezes when they end); elsewhere ``repr`` and ``print``
    give the same rows as text. :attr:`rows` and :attr:`slowest` read the newest state.
    """

    def __init__(self, cluster: Any, interval: float = _POLL) -> None:
        self._cluster = weakref.ref(cluster)
        self.interval = float(interval)
        self.updates = 0  # times the shown table changed
        self._messages: dict[int, Mapping[str, Any]] = {}
        self._seen: tuple[Any, ...] = ()
        self._widget: Any = None
        self._thread: threading.Thread | None = None
        self._halt = threading.Event()
        self._lock = threading.Lock()

    # -- what users read ---------------------------------------------------------------------
    @property
    def rows(self) -> list[dict[str, Any]]:
        """The panel's rows now, by MPI rank (see :func:`rows`)."""
        self.poll()
        return self._rows()

    @property
    def slowest(self) -> int | None:
        """The slowest rank now (see :func:`slowest`), or ``None``."""
        self.poll()
        return slowest(self._messages)

    def poll(self) -> bool:
        """Read what the client received since the last look; whether anything changed."""
        cluster = self._cluster()
        client = None if cluster is None else cluster.client
        if cluster is None or client is None:
            return False
        found = latest([*self._messages.values(), *_received(client, len(cluster.ids_by_rank))])
        key = tuple((r, m["time"], m["seq"]) for r, m in sorted(found.items()))
        running = tuple(self._running(cluster))
        changed = (key, running) != self._seen
        with self._lock:
            self._messages, self._seen = found, (key, running)
        return changed

    def stop(self) -> None:
        """Stop refreshing the displayed panel (it keeps its last rows)."""
        self._halt.set()

    def __repr__(self) -> str:
        return text_table(self.rows)

    def __str__(self) -> str:
        return self.__repr__()

    def _repr_html_(self) -> str:
        return html_table(self.rows, self._caption())

    def _ipython_display_(self) -> None:
        from IPython import get_ipython
        from IPython.display import display

        # A widget needs a front end (a kernel's): a terminal IPython would print its repr instead.
        widget = self.widget() if getattr(get_ipython(), "kernel", None) is not None else None
        if widget is None:
            display({"text/plain": repr(self), "text/html": self._repr_html_()}, raw=True)
            return
        display(widget)

    def widget(self) -> Any:
        """The panel as an ipywidgets ``HTML`` widget, refreshed by a background thread (``None``
        without ipywidgets)."""
        try:
            import ipywidgets
        except ImportError:
            return None
        if self._widget is None:
            self._widget = ipywidgets.HTML(value=self._repr_html_())
        if self._thread is None or not self._thread.is_alive():
            self._halt.clear()
            self._thread = threading.Thread(target=self._refresh, name="mpinb-monitor", daemon=True)
            self._thread.start()
        return self._widget

    # -- internals ---------------------------------------------------------------------------
    def _rows(self) -> list[dict[str, Any]]:
        cluster = self._cluster()
        size = None if cluster is None else (len(cluster.ids_by_rank) or None)
        running = None if cluster is None or cluster.client is None else self._running(cluster)
        return rows(self._messages, size, running)

    def _running(self, cluster: Any) -> list[int]:
        """The ranks whose engines still run a request of this client (engine ids never assumed
        equal to ranks: ``ids_by_rank`` maps them)."""
        client = cluster.client
        busy: set[int] = set()
        try:
            # ipyparallel's own bookkeeping of the requests each engine still owes a reply (by uuid):
            # the public queue_status() would ask the controller, a round trip per refresh.
            ids = {uuid: eid for eid, uuid in list(client._engines.items())}
            for uuid, pending in list(client._outstanding_dict.items()):
                if pending and uuid in ids:
                    busy.add(int(ids[uuid]))
        except Exception:  # noqa: BLE001 - the client changing under the look
            return list(range(len(cluster.ids_by_rank)))
        return [r for r, eid in enumerate(cluster.ids_by_rank) if eid in busy]

    def _caption(self) -> str:
        cluster = self._cluster()
        if cluster is None or cluster.client is None:
            return "the cluster is stopped"
        running = self._running(cluster)
        return (f"{len(running)} of {len(cluster.ids_by_rank)} ranks running a cell" if running else
                "no cell running") + time.strftime(", %H:%M:%S")

    def _refresh(self) -> None:
        while not self._halt.wait(self.interval):
            cluster = self._cluster()
            if cluster is None or cluster.client is None:
                return
            try:
                if self.poll() and self._widget is not None:
                    self._widget.value = self._repr_html_()
                    self.updates += 1
            except Exception:  # noqa: BLE001 - a panel must never raise into the notebook
                pass


class _KeptMessages(defaultdict):
    """``client.metadata`` (ipyparallel's requests' metadata by message id) that keeps the rank
    panel's newest message of each rank when ipyparallel drops a finished request's entry: it
    drops it as the reply arrives, and a rank's last message of a cell (published as the cell
    ends) may arrive before the reply."""

    def __init__(self, base: defaultdict) -> None:
        super().__init__(base.default_factory, base)
        self.kept: dict[int, Mapping[str, Any]] = {}

    def _keep(self, md: Any) -> None:
        data = md.get("data") if isinstance(md, Mapping) else None
        message = data.get(KEY) if isinstance(data, Mapping) else None
        if isinstance(message, Mapping):
            self.kept = latest([*self.kept.values(), message])

    def pop(self, key: Any, *default: Any) -> Any:
        md = super().pop(key, *default)
        self._keep(md)
        return md

    def clear(self) -> None:
        for md in list(self.values()):
            self._keep(md)
        super().clear()


def keep_rank_messages(client: Any) -> None:
    """Make ``client`` keep the ranks' panel messages of requests it has finished with. Client;
    idempotent. Private: ipyparallel 9.2's ``Client.metadata`` is a ``defaultdict`` that it pops
    on each reply; a subclass keeps its behaviour. Fallback, if it stops being one: nothing is
    kept, and the panel shows what arrives after a request's reply, as before."""
    metadata = getattr(client, "metadata", None)
    if isinstance(metadata, defaultdict) and not isinstance(metadata, _KeptMessages):
        try:
            client.metadata = _KeptMessages(metadata)
        except Exception:  # noqa: BLE001 - a client that refuses it: the fallback above
            pass


def _received(client: Any, n: int) -> list[Mapping[str, Any]]:
    """The ranks' messages among the newest requests' data (the ranks publish under the request
    they run, or ran last), and those kept from finished requests (:func:`keep_rank_messages`)."""
    metadata = client.metadata
    ids = [*list(client.history)[-(4 * n + 16):], *list(client.outstanding)]
    out = list(getattr(metadata, "kept", {}).values())
    for msg_id in dict.fromkeys(ids):
        md = metadata.get(msg_id)
        data = None if md is None else md.get("data")
        message = None if not data else data.get(KEY)
        if isinstance(message, Mapping):
            out.append(message)
    return out


def _step_key(record: Any) -> tuple[Any, ...]:
    return (record[0], record[1], record[2])


def _state(message: Mapping[str, Any], ended: bool) -> str:
    """``idle``; ``cell 3, line 7: in allreduce #12 for 0.4 s, waiting for rank 2``; ``cell 3,
    line 5: computing outside mpinb (in eigh)``."""
    if ended or not message.get("cell"):
        return "idle"
    head = f"cell {message['cell']}" + _where_text(message.get("where"))
    op = message.get("op")
    if not op:
        where = message.get("where") or {}
        call = f" (in {where['call']})" if where.get("call") else ""
        inside = f"in mpinb's {where['mpinb']}" if where.get("mpinb") else "outside mpinb"
        return f"{head}: computing {inside}{call}"
    inside = f"in {op['name']} #{op['index']} for {float(op.get('since', 0.0)):.1f} s"
    if op.get("phase") != "waiting":
        return f"{head}: {inside}, exchanging data"
    waiting = op.get("waiting_for")
    if waiting == []:
        return f"{head}: {inside}, arriving"
    who = ("the other ranks" if waiting is None else
           f"rank {waiting[0]}" if len(waiting) == 1 else "ranks " + ", ".join(str(r) for r in waiting))
    return f"{head}: {inside}, waiting for {who}"


def _where_text(where: Mapping[str, Any] | None) -> str:
    if not where:
        return ""
    text = f", line {where['line']}"
    if where.get("file"):
        text = f", {where.get('func') or '?'} ({where['file']}:{where['line']})"
    elif where.get("func"):
        text += f" in {where['func']}"
    return text


def _progress(fit: Mapping[str, Any] | None) -> str:
    if not fit:
        return ""
    kind, step, total = fit.get("kind"), int(fit.get("step") or 0), fit.get("total")
    metrics = fit.get("metrics") or {}
    of = f" of {total}" if total else ""
    if kind == "inertia":
        text = f"k-means iteration {step}{of}" + (f", inertia {metrics['inertia']:.6g}" if "inertia" in metrics else "")
    elif kind == "loss":
        epoch = step if fit.get("done") or fit.get("batch") is None else step + 1
        text = f"epoch {max(epoch, 1)}{of}"
        if fit.get("batch") is not None:
            text += f", step {fit['batch']}" + (f" of {fit['steps']}" if fit.get("steps") else "")
        live = fit.get("batch_loss") is not None and not fit.get("done")
        loss = fit.get("batch_loss") if live else metrics.get("loss")
        if loss is not None:
            text += f", loss {float(loss):.4g}"
    else:
        text = f"{kind} step {step}{of}" + "".join(f", {k} {float(v):.4g}" for k, v in sorted(metrics.items()))
    return text + (" (done)" if fit.get("done") else "")


def _split_text(split: tuple[float, ...] | None) -> str:
    if split is None:
        return "-"
    return " / ".join(_seconds(x) for x in split)


def _split_html(split: tuple[float, ...] | None) -> str:
    if split is None:
        return "-"
    total = sum(split) or 1.0
    colours = ("#4c72b0", "#55a868", "#c44e52")
    bar = "".join(f"<span style='display:inline-block;height:8px;width:{60 * x / total:.1f}px;background:{c}'></span>"
                  for x, c in zip(split, colours, strict=True))
    return f"{bar} {html.escape(_split_text(split))}"


def _seconds(x: float) -> str:
    return f"{x * 1e3:.1f} ms" if x < 1.0 else f"{x:.2f} s"


def _memory_text(rss: int | None) -> str:
    return "-" if rss is None else f"{rss / 2**20:,.0f} MiB"
