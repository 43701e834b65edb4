"""The rank panel (issue 53) on a real 3-rank cluster: rank 2 sleeps in every step of a loop.

While the cell runs the panel is read from the notebook's side only (the ranks publish from a
thread; nothing is sent to the busy engines): it has three rows in rank order, names rank 2 the
slowest, shows ranks 0 and 1 waiting for rank 2 in the loop's allreduce, and changes while the
cell runs. When the cell ends every row says idle and the table stops changing; a k-means fit
afterwards leaves its iterations and inertia in the frozen rows.
"""

from __future__ import annotations

import time
from pathlib import Path

import mpinb

LOOP = """
import time
import numpy as np
import mpinb
from mpinb.live import Progress

rank = mpinb.world().rank
progress = Progress("loss", total=STEPS)
for i in range(STEPS):
    time.sleep(0.5 if rank == 2 else 0.01)  # rank 2 is the straggler
    total = mpinb.allreduce([np.ones(4)])[0]
    progress.update(i + 1, loss=1.0 / (i + 1))
progress.close()
"""
STEPS = 12
HANG = 120.0  # seconds: a cell still running this long counts as hung


def test_the_panel_names_the_straggler_while_the_cell_runs(tmp_path: Path) -> None:
    with mpinb.MPICluster(n=3) as cluster:
        panel = cluster.monitor()
        assert panel is cluster.monitor()
        running = cluster.view.execute(LOOP.replace("STEPS", str(STEPS)), block=False)
        seen: list[tuple[str, int | None]] = []
        began = time.monotonic()
        while not running.ready() and time.monotonic() - began < HANG:
            rows = panel.rows
            if not running.ready():
                seen.append((mpinb.client.monitor.text_table(rows), panel.slowest))
                assert [r["rank"] for r in rows] == [0, 1, 2]
            time.sleep(0.3)
        running.get(timeout=HANG)
        live = [text for text, _ in seen if "cell " in text]
        assert len(set(live)) >= 2, f"the panel did not change while the cell ran: {seen}"
        marked = [slow for _, slow in seen if slow is not None]
        assert marked and set(marked) == {2}, f"slowest ranks seen while the cell ran: {marked}"
        waiting = [text for text in live if "waiting for rank 2" in text]
        assert waiting, f"no rank was shown waiting for rank 2: {live}"
        print("the panel while the cell ran:\n" + waiting[-1])

        time.sleep(1.5)  # the ranks' last messages
        frozen = [repr(panel) for _ in range(2) if not time.sleep(0.8)]
        assert frozen[0] == frozen[1], "the panel kept changing after the cell ended"
        rows = panel.rows
        assert [r["state"] for r in rows] == ["idle"] * 3
        assert all(r["progress"] == f"epoch {STEPS} of {STEPS}, loss 0.08333 (done)" for r in rows), frozen[0]
        assert rows[2]["slowest"] and rows[2]["split"][0] > rows[0]["split"][0]
        print("the panel after the cell ended:\n" + frozen[0])

        page = mpinb.report(tmp_path / "run.html", cluster).read_text()
        assert page.count("<svg") == 4 and "<script" not in page
        summary = page[page.index("<table class='summary'>"):page.index("</table>")]
        assert summary.count("<tr>") == 4, summary
        slow_in = [int(row.split("<td>")[7].split("<")[0]) for row in summary.split("<tr>")[2:]]
        assert slow_in[2] >= STEPS - 2 and max(slow_in[:2]) <= 2, summary  # rank 2, in (nearly) every step

        cluster.view.execute("X, _ = mpinb.data.make_blobs(3000, n_features=4, centers=5, random_state=0)\n"
                             "km = mpinb.KMeans(5, n_init=1, random_state=0).fit(X)")
        time.sleep(1.5)
        iterations = cluster.pull("km")[0].n_iter_
        rows = panel.rows
        assert all(r["progress"].startswith(f"k-means iteration {iterations} of 300, inertia ") for r in rows), rows
        assert all(r["progress"].endswith("(done)") and r["memory"] > 0 for r in rows)
