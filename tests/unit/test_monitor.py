"""The rank panel's derivation: engine messages to rows, who is slowest, and the engine's step split.

One process, no cluster: messages are built as the engines' :func:`mpinb._progress.snapshot` makes
them, and the engine side is driven through the collective layer's observer with stand-in operations.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from mpinb import _progress
from mpinb._collective import protocol as _p
from mpinb.client import monitor
from mpinb.live import Progress


def message(rank: int, *, t: float = 100.0, seq: int = 1, cell: int = 3, op: dict[str, Any] | None = None,
            where: dict[str, Any] | None = None, recent: list[tuple[Any, ...]] | None = None,
            fit: dict[str, Any] | None = None, rss: int | None = 200 * 2**20,
            engine: int | None = None) -> dict[str, Any]:
    return {"rank": rank, "size": 3, "engine": rank if engine is None else engine, "host": "h", "seq": seq,
            "time": t, "cell": cell, "where": where or {"line": 7, "func": None, "file": None, "call": None,
                                                          "mpinb": None},
            "op": op, "rss": rss, "fit": fit, "recent": recent or [], "running_for": 1.0}


def step(n: int, compute: float, wait: float, exchange: float = 0.001) -> tuple[Any, ...]:
    return (1, "inertia", n, 1000.0 + n, compute, exchange, wait, 10.0 / n)


WAITING = {"name": "allreduce", "index": 12, "since": 0.4, "phase": "waiting", "waiting_for": [2]}


def test_latest_keeps_each_ranks_newest_message_whatever_the_order() -> None:
    old, new, other = message(0, t=1.0, seq=5), message(0, t=2.0, seq=1), message(1, t=0.5)
    found = monitor.latest([new, other, old, {"no": "rank"}])
    assert found == {0: new, 1: other}
    assert monitor.latest([message(0, t=2.0, seq=2), message(0, t=2.0, seq=3)])[0]["seq"] == 3


def test_the_rank_the_others_wait_for_is_the_slowest() -> None:
    messages = {0: message(0, op=WAITING), 1: message(1, op=WAITING),
                2: message(2, recent=[step(1, 0.01, 0.0)])}
    assert monitor.slowest(messages) == 2


def test_without_waiting_ranks_the_longest_compute_of_the_last_common_step_is_the_slowest() -> None:
    messages = {0: message(0, recent=[step(1, 0.5, 0.0), step(2, 0.02, 0.4)]),
                1: message(1, recent=[step(1, 0.1, 0.4), step(2, 0.42, 0.0)]),
                2: message(2, recent=[step(1, 0.1, 0.4), step(2, 0.03, 0.39), step(3, 0.9, 0.0)])}
    assert monitor.slowest(messages) == 1  # step 3 is rank 2's alone; step 2 is the last every rank finished
    assert monitor.slowest({0: messages[0]}) is None
    assert monitor.slowest({0: message(0), 1: message(1)}) is None  # no step to compare


def test_rows_are_in_rank_order_whatever_the_engine_ids() -> None:
    messages = {2: message(2, engine=0, op=None, recent=[step(1, 0.4, 0.0)]),
                0: message(0, engine=2, op=WAITING, recent=[step(1, 0.01, 0.39)])}
    table = monitor.rows(messages, size=3)
    assert [r["rank"] for r in table] == [0, 1, 2]
    assert [r["engine"] for r in table] == [2, None, 0]
    assert table[1]["state"] == "no news yet"
    assert table[0]["state"] == "cell 3, line 7: in allreduce #12 for 0.4 s, waiting for rank 2"
    assert table[2]["state"] == "cell 3, line 7: computing outside mpinb"
    assert [r["slowest"] for r in table] == [False, False, True]
    assert table[0]["split"] == pytest.approx((0.01, 0.001, 0.39))


def test_states_say_where_each_rank_is() -> None:
    state = lambda **kw: monitor.rows({0: message(0, **kw)})[0]["state"]  # noqa: E731
    assert state(cell=0) == "idle"
    assert state(where={"line": 5, "func": "train", "file": None, "call": "eigh", "mpinb": None}) == \
        "cell 3, line 5 in train: computing outside mpinb (in eigh)"
    assert state(where={"line": 4, "func": None, "file": None, "call": None, "mpinb": "lloyd"}) == \
        "cell 3, line 4: computing in mpinb's lloyd"
    assert state(op={**WAITING, "waiting_for": [1, 2]}).endswith("waiting for ranks 1, 2")
    assert state(op={**WAITING, "waiting_for": None}).endswith("waiting for the other ranks")
    assert state(op={**WAITING, "phase": "exchanging"}) == "cell 3, line 7: in allreduce #12 for 0.4 s, exchanging data"
    # A rank whose request the client no longer waits for has ended its cell, whatever it said last.
    assert monitor.rows({0: message(0, op=WAITING)}, size=1, running=[])[0]["state"] == "idle"


def test_progress_reads_as_kmeans_iterations_and_keras_steps() -> None:
    progress = lambda fit: monitor.rows({0: message(0, fit=fit)})[0]["progress"]  # noqa: E731
    assert progress({"kind": "inertia", "step": 7, "total": 300, "metrics": {"inertia": 1234.5678}}) == \
        "k-means iteration 7 of 300, inertia 1234.57"
    keras = {"kind": "loss", "step": 1, "total": 5, "metrics": {"loss": 0.9}, "batch": 40, "steps": 118,
             "batch_loss": 0.51234, "done": False}
    assert progress(keras) == "epoch 2 of 5, step 40 of 118, loss 0.5123"
    assert progress({**keras, "step": 5, "done": True}) == "epoch 5 of 5, step 40 of 118, loss 0.9 (done)"
    assert progress(None) == ""


def test_text_and_html_tables_mark_the_slowest_rank() -> None:
    messages = {r: message(r, op=WAITING if r < 2 else None, recent=[step(1, 0.4 if r == 2 else 0.01, 0.0)])
                for r in range(3)}
    table = monitor.rows(messages, size=3)
    text = monitor.text_table(table)
    lines = text.splitlines()
    assert lines[0].startswith("rank  state")
    assert lines[3].startswith("2 *") and "computing outside mpinb" in lines[3]
    assert "200 MiB" in lines[1] and "10.0 ms / 1.0 ms / 0.0 ms" in lines[1]
    assert lines[-1] == "* the slowest rank: the others wait for it"
    page = monitor.html_table(table, "3 of 3 ranks running a cell")
    assert page.count("<tr style=") == 3 and "data-rank='2'" in page
    assert page.count("slowest</b>") == 1 and page.index("slowest</b>") > page.index("data-rank='2'")


class _Op:
    def __init__(self, name: str, index: int) -> None:
        self.name, self.index, self.phase, self.gen = name, index, _p.ARRIVING, None
        self.chan = SimpleNamespace(board=None)


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> Any:
    state = _progress._State()
    state.active = True
    monkeypatch.setattr(_progress, "_state", state)
    return state


def _collective(name: str, index: int, wait: float, exchange: float) -> None:
    op = _Op(name, index)
    rules = _p.ARRIVING.rules
    _progress._observe(op, _p.IDLE, "enter", _p.IDLE.rules["enter"])
    time.sleep(wait)
    _progress._observe(op, _p.ARRIVING, "arrived", rules["arrived"])
    time.sleep(exchange)
    _progress._observe(op, _p.MOVING, "finish", _p.MOVING.rules["finish"])


def test_the_engine_splits_each_step_into_compute_exchange_and_wait(engine: Any) -> None:
    progress = Progress("inertia", total=10)
    time.sleep(0.05)  # compute
    _collective("allreduce", 1, wait=0.04, exchange=0.02)
    progress.update(1, inertia=5.0)
    (record,) = _progress.history()["steps"]
    fit, kind, n, _, compute, exchange, wait, value = record
    assert (fit, kind, n, value) == (1, "inertia", 1, 5.0)
    assert compute >= 0.05 and wait >= 0.04 and exchange >= 0.02
    assert compute < 0.05 + 0.5 and wait < 0.04 + 0.5  # generous: the machine is shared
    assert engine.op is None and engine.ops == 1
    progress.close()
    assert engine.fit["done"] and engine.fit["step"] == 1


def test_keras_steps_are_the_train_steps_and_epochs_only_count(engine: Any) -> None:
    progress = Progress("loss", total=2)
    for batch in (1, 2, 3):
        progress.batch(batch, 3, {"loss": 0.5 / batch})
    progress.update(1, loss=0.3)
    steps = _progress.history()["steps"]
    assert [(s[1], s[2]) for s in steps] == [("batch", 1), ("batch", 2), ("batch", 3)]
    snap = _progress.snapshot()
    assert snap["fit"]["batch"] == 3 and snap["fit"]["steps"] == 3 and snap["fit"]["step"] == 1
    assert snap["fit"]["batch_loss"] == pytest.approx(0.5 / 3)
    assert snap["cell"] == 0 and snap["op"] is None and snap["recent"][-1][2] == 3


def test_a_rank_inside_a_collective_shows_it_while_waiting(engine: Any) -> None:
    op = _Op("bcast", 4)
    _progress._observe(op, _p.IDLE, "enter", _p.IDLE.rules["enter"])
    state = _progress._op_state(op)
    assert state["name"] == "bcast" and state["index"] == 4 and state["phase"] == "waiting"
    assert state["waiting_for"] is None  # no generation, no status board: not known
    _progress._observe(op, _p.ARRIVING, "arrived", _p.ARRIVING.rules["arrived"])
    assert _progress._op_state(op)["phase"] == "exchanging"


def test_nothing_is_recorded_until_the_panel_is_started(monkeypatch: pytest.MonkeyPatch) -> None:
    state = _progress._State()
    monkeypatch.setattr(_progress, "_state", state)
    progress = Progress("inertia", total=3)
    progress.update(1, inertia=1.0)
    progress.batch(1, 3, None)
    assert state.fit is None and not state.history


class _Cluster:  # the monitor holds its cluster weakly
    def __init__(self, client: Any, ids_by_rank: list[int]) -> None:
        self.client, self.ids_by_rank = client, ids_by_rank


def test_the_monitor_reads_rank_order_from_the_messages_not_engine_ids() -> None:
    # Engines 0, 1, 2 are ranks 2, 0, 1: the client's requests carry data by message id.
    metadata = {f"m{e}": {"data": {monitor.KEY: message(r, engine=e)}} for e, r in enumerate((2, 0, 1))}
    client = SimpleNamespace(metadata=metadata, history=list(metadata), outstanding=set(), _engines={},
                             _outstanding_dict={})
    cluster = _Cluster(client, [1, 2, 0])
    panel = monitor.RankMonitor(cluster)
    table = panel.rows
    assert [(r["rank"], r["engine"]) for r in table] == [(0, 1), (1, 2), (2, 0)]
    assert all(r["state"] == "idle" for r in table)  # no request outstanding: every cell has ended
    assert repr(panel).splitlines()[0].startswith("rank")
    assert panel._repr_html_().count("<tr style=") == 3


def _histories(steps: int = 6) -> list[dict[str, Any]]:
    out = []
    for rank in range(3):
        records = [(1, "loss", n, 1000.0 + 0.5 * n, 0.45 if rank == 2 else 0.02, 0.001, 0.0 if rank == 2 else 0.43,
                    None) for n in range(1, steps + 1)]
        memory = [(1000.0 + t, (100 + 10 * rank + t) * 2**20) for t in range(4)]
        curves = [(1, "loss", n, {"loss": 1.0 / n}) for n in range(1, steps + 1)]
        out.append({"rank": rank, "host": "h", "rss": 120 * 2**20, "steps": records, "memory": memory,
                    "curves": curves})
    return out


def test_the_report_names_the_straggler_of_every_step() -> None:
    from mpinb.client.report import stragglers

    slow = stragglers(_histories())
    assert [k for k, _ in slow] == [(1, "loss", n) for n in range(1, 7)]
    assert {r for _, r in slow} == {2}
    assert stragglers(_histories()[:1]) == []


def test_the_report_is_one_self_contained_page() -> None:
    pytest.importorskip("matplotlib")
    from mpinb.client.report import render

    page = render(_histories(), title="three ranks")
    assert page.startswith("<!DOCTYPE html>") and "<title>three ranks</title>" in page
    assert page.count("<svg") == 4  # timelines, stragglers, memory, curves
    for outside in ("<script", "<link", " src=", "<img", "url(http", "href=\"http"):
        assert outside not in page, outside
    summary = page[page.index("<table class='summary'>"):page.index("</table>")]
    assert summary.count("<tr>") == 4  # the header and one row per rank
    assert "<td>2</td><td>h</td><td>6</td><td>2.70 s</td>" in summary and "<td>6</td><td>123 MiB</td>" in summary
    timeline = page[page.index("Per-rank timeline"):page.index("The slowest rank of every step")]
    assert all(f">rank {r}</text>" in timeline for r in range(3))  # text, not glyph outlines


def test_outside_a_notebook_the_panel_shows_as_text(capsys: pytest.CaptureFixture[str]) -> None:
    metadata = {"m0": {"data": {monitor.KEY: message(0, engine=0)}}}
    client = SimpleNamespace(metadata=metadata, history=["m0"], outstanding=set(), _engines={}, _outstanding_dict={})
    panel = monitor.RankMonitor(_Cluster(client, [0]))
    panel._ipython_display_()  # what IPython calls; no kernel here, so no widget and no thread
    assert "rank  state" in capsys.readouterr().out and panel._thread is None
    assert str(panel) == repr(panel)


def test_whom_a_rank_waits_for_comes_from_the_status_board_of_its_host(engine: Any) -> None:
    # Rank 0 waits in generation 1's collective #5; rank 1 has entered it, rank 2's last was #4,
    # and rank 3 runs on another host, whose row this one cannot read: counted as missing.
    rows = {1: SimpleNamespace(gen=1, index=5), 2: SimpleNamespace(gen=1, index=4)}
    chan = SimpleNamespace(rank=0, size=4, host="a", hosts=["a", "a", "a", "b"],
                           board=SimpleNamespace(read=rows.get))
    op = _Op("allreduce", 5)
    op.chan, op.gen = chan, SimpleNamespace(number=1)
    _progress._observe(op, _p.IDLE, "enter", _p.IDLE.rules["enter"])
    assert _progress._op_state(op)["waiting_for"] == [2, 3]
    rows[2] = SimpleNamespace(gen=2, index=1)  # a later generation: it has been past #5 already
    assert _progress._op_state(op)["waiting_for"] == [3]


def test_a_cell_shorter_than_the_interval_reaches_the_panel_when_it_ends(engine: Any,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from mpinb import live
    from mpinb._collective import cells

    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(live, "_data_publisher", lambda: SimpleNamespace(publish_data=sent.append))
    monkeypatch.setattr(_progress, "_halt", threading.Event())
    monkeypatch.setattr(_progress, "_wake", threading.Event())
    thread = threading.Thread(target=_progress._publish_loop, args=(30.0,), daemon=True)
    thread.start()
    try:
        _progress._on_cell("begin", cells.Cell(5, plumbing=True), None)
        _progress._on_cell("end", cells.Cell(5, plumbing=True), None)  # cluster.pull's getter: nothing sent
        time.sleep(0.3)
        assert sent == []
        _progress._on_cell("begin", cells.Cell(6), None)
        _progress._on_cell("end", cells.Cell(6), None)  # the user's 0.0 s cell, 30 s before the next tick
        deadline = time.monotonic() + 5
        while not sent and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(sent) == 1 and sent[0][_progress.KEY]["cell"] == 0  # idle, as it is after the cell
        assert engine.cells == 1
    finally:
        _progress._halt.set()
        _progress._wake.set()
        thread.join(timeout=5)
    assert not thread.is_alive()


def test_messages_of_finished_requests_are_kept_when_ipyparallel_drops_them() -> None:
    # ipyparallel pops a request's metadata when its reply arrives; a rank's last message of a cell
    # (sent as the cell ends) can arrive just before it, and must not be lost with it.
    from collections import defaultdict

    client = SimpleNamespace(metadata=defaultdict(dict), history=["a", "b"], outstanding=set())
    monitor.keep_rank_messages(client)
    kept = client.metadata
    monitor.keep_rank_messages(client)
    assert client.metadata is kept  # idempotent
    client.metadata["a"]["data"] = {monitor.KEY: message(0, t=1.0)}
    client.metadata["b"]["data"] = {monitor.KEY: message(1, t=1.0)}
    client.metadata.pop("a")
    client.metadata["c"]["data"] = {monitor.KEY: message(0, t=2.0, cell=0)}
    client.metadata.pop("c", None)
    client.metadata.pop("missing", None)
    assert sorted((m["rank"], m["time"]) for m in monitor._received(client, 2)) == [(0, 2.0), (1, 1.0)]
    client.metadata.clear()
    assert sorted((m["rank"], m["time"]) for m in monitor._received(client, 2)) == [(0, 2.0), (1, 1.0)]
    assert isinstance(client.metadata, defaultdict) and client.metadata["new"] == {}
