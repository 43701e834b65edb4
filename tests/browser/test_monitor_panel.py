"""The rank panel (issue 53) in JupyterLab, in headless Chromium: a 3-rank cluster where rank 2 sleeps
in every step of a ``%%px --noblock`` loop, while the next cell keeps the kernel busy waiting for it.

The page must show the panel's table with 3 rows, rank 2's marked slowest, and the table must change
while the cell runs (two screenshots of it differ); the report of the run, opened from disk in the
same browser, shows 3 timelines. Server, kernel, ranks and browser come from test_jupyterlab's
harness, and none may be left running.
"""

from __future__ import annotations

import re
import secrets
import time
import uuid
from pathlib import Path

import nbformat
import pytest
from test_jupyterlab import (
    _KERNEL_READY,
    _PANEL,
    CHROMIUM,
    CHROMIUM_ARGS,
    MARKER,
    _jupyter_lab,
    _marked,
    _require_browser,
    failure_shown,
    lab_home,
)

NOTEBOOK = "monitor.ipynb"
CELLS = [
    "import mpinb\ncluster = mpinb.MPICluster(n=3)\npanel = cluster.monitor()\npanel",
    "%%px --noblock -o run\nimport time\nimport numpy as np\nimport mpinb\nfrom mpinb.live import Progress\n"
    "rank = mpinb.world().rank\nprogress = Progress('loss', total=30)\nfor i in range(30):\n"
    "    time.sleep(0.4 if rank == 2 else 0.01)  # the straggler\n    mpinb.allreduce([np.ones(3)])\n"
    "    progress.update(i + 1, loss=1.0 / (i + 1))\nprogress.close()",
    "run.wait()  # the kernel is busy here: the panel keeps itself up to date from its own thread\n"
    "mpinb.report('run.html', cluster)\ncluster.stop()",
]
_ROWS = "() => [...document.querySelectorAll('table.mpinb-ranks tbody tr')].map(r => [r.dataset.rank, r.innerText])"
_RUNNING_WITH_STRAGGLER = r"""() => {
    const rows = [...document.querySelectorAll('table.mpinb-ranks tbody tr')];
    return rows.length === 3 && rows[2].textContent.includes('slowest')
        && rows[0].textContent.includes('waiting for rank 2');
}"""
_ALL_DONE = r"""selector => {
    const panel = document.querySelector(selector);
    const prompts = [...panel.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')].map(p => p.textContent.trim());
    const status = panel.querySelector('.jp-Notebook-ExecutionIndicator')?.getAttribute('data-status');
    return status === 'idle' && prompts.length === 3 && prompts.every(p => /^\[\d+\]:$/.test(p));
}"""


@pytest.mark.timeout(300)
def test_the_panel_names_the_straggler_in_jupyterlab(tmp_path: Path) -> None:
    sync_playwright = _require_browser()
    marker = uuid.uuid4().hex
    _prepare(tmp_path)
    token = secrets.token_hex(16)
    shots: list[bytes] = []
    try:
        with _jupyter_lab(tmp_path, token, marker) as base:
            with sync_playwright() as pw:
                context = pw.chromium.launch_persistent_context(
                    str(tmp_path / "chromium-profile"), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
                    env={MARKER: marker}, viewport={"width": 1400, "height": 1000},
                )
                try:
                    page = context.pages[0] if context.pages else context.new_page()
                    with failure_shown(page, tmp_path):
                        rows, after = _run(page, f"{base}/lab/tree/{NOTEBOOK}?reset&token={token}", shots)
                        report = _open_report(page, tmp_path / "lab" / "run.html")
                finally:
                    context.close()
    finally:
        leftovers = _marked(marker)
        for proc in leftovers:
            proc.kill()
    assert not leftovers, f"processes left running: {[p.pid for p in leftovers]}"
    print("the panel while the cell ran:\n" + "\n".join(text for _, text in rows))
    assert [rank for rank, _ in rows] == ["0", "1", "2"]
    assert "slowest" in rows[2][1] and not any("slowest" in text for _, text in rows[:2])
    assert len(shots) == 2 and shots[0] != shots[1], "the panel did not change while the cell ran"
    assert len(after) == 3 and all("epoch 30 of 30" in text for _, text in after), after
    assert report["timelines"] == ["rank 0", "rank 1", "rank 2"], report


def _prepare(tmp: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(code) for code in CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    lab_home(tmp, nb, NOTEBOOK)


def _run(page, url: str, shots: list[bytes]) -> tuple[list[list[str]], list[list[str]]]:
    page.goto(url)
    page.locator(_PANEL).locator(".jp-Notebook").wait_for(timeout=60_000)
    page.wait_for_function(_KERNEL_READY, timeout=60_000)
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name=re.compile(r"^Run All Cells")).click()
    page.wait_for_function(_RUNNING_WITH_STRAGGLER, timeout=120_000, polling=250)
    table = page.locator("table.mpinb-ranks")
    rows = page.evaluate(_ROWS)
    shots.append(table.screenshot())
    time.sleep(1.5)  # three refreshes of the panel
    shots.append(table.screenshot())
    page.wait_for_function(_ALL_DONE, arg=_PANEL, timeout=120_000, polling=500)
    return rows, page.evaluate(_ROWS)


def _open_report(page, path: Path) -> dict:
    page.goto(path.as_uri())
    page.wait_for_selector("svg")
    return page.evaluate(r"""() => ({
        svgs: document.querySelectorAll('svg').length,
        timelines: [...document.querySelectorAll('section')[0].querySelectorAll('text')]
            .map(t => t.textContent.trim()).filter(t => /^rank \d+$/.test(t)),
    })""")
