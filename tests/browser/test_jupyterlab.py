"""A tutorial notebook run to the end in JupyterLab, in headless Chromium, with its figures checked in
the page: what a user sees, not just what nbclient stores.

Drives Debian's ``chromium`` with Playwright for Python: one pip package that ships its own driver
(no browser download, no chromedriver whose version must match the browser), with auto-waiting
locators that suit JupyterLab's asynchronous DOM. Everything the test starts (server, kernel,
``mpiexec``, ranks, browser) carries a unique environment variable; afterwards none may be running.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import nbformat
import psutil
import pytest

NOTEBOOK = "04_scaling.ipynb"
# Small enough for ~20 s on 2 cores; the notebook still draws both of its figures.
PARAMETERS = {"ranks": [1, 2], "n_rows": 40_000, "train_rows": 2_048, "global_batch": 256, "epochs": 2}
MIN_FIGURES = 2
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
MARKER = "MPINB_BROWSER_TEST_RUN"
RUN_TIMEOUT_MS = 150_000  # ~20 s on 2 idle cores; fail with a screenshot before pytest-timeout
NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"

# JupyterLab's defaults, changed only where the page must be deterministic: every cell attached to
# the DOM (the default may skip off-screen ones), and no news toast over the notebook.
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false", "checkForUpdates": False, "doNotDisturbMode": True,
    },
}


def _require_browser():
    """Import Playwright; skip when the browser tools are missing, except in CI, where they must be."""
    missing = []
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
        missing.append("the `playwright` Python package (pip install playwright)")
    if not os.path.exists(CHROMIUM):
        missing.append(f"{CHROMIUM} (apt-get install chromium)")
    if missing:
        reason = "browser test needs " + " and ".join(missing)
        if os.environ.get("CI"):
            pytest.fail(reason + "; CI must provide them (.ci/run installs chromium)")
        pytest.skip(reason)
    return sync_playwright


@pytest.mark.timeout(300)  # server start, browser and cleanup on top of the run itself
def test_notebook_runs_in_jupyterlab(tmp_path: Path) -> None:
    sync_playwright = _require_browser()
    marker = uuid.uuid4().hex
    _prepare(tmp_path)
    token = secrets.token_hex(16)
    t0 = time.monotonic()
    try:
        with _jupyter_lab(tmp_path, token, marker) as base:
            with sync_playwright() as pw:
                context = pw.chromium.launch_persistent_context(
                    str(tmp_path / "chromium-profile"),  # empty: no restored state, no first-run UI
                    executable_path=CHROMIUM,
                    headless=True,
                    args=CHROMIUM_ARGS,
                    env={**os.environ, MARKER: marker},
                    viewport={"width": 1400, "height": 1000},
                )
                try:
                    page = context.pages[0] if context.pages else context.new_page()
                    with failure_shown(page, tmp_path):
                        report = _run_all(page, f"{base}/lab/tree/{NOTEBOOK}?reset&token={token}", tmp_path)
                finally:
                    context.close()
            saved = nbformat.read(tmp_path / "lab" / NOTEBOOK, as_version=4)
    finally:
        leftovers = _marked(marker)
        for proc in leftovers:
            proc.kill()
    print(f"{NOTEBOOK} in JupyterLab: {time.monotonic() - t0:.1f} s; screenshot {tmp_path / 'lab.png'}")
    assert not leftovers, f"processes left running: {[(p.pid, p.info['cmdline']) for p in leftovers]}"

    assert not report["tracebacks"], "a cell failed in the page:\n" + "\n".join(report["tracebacks"])
    assert all(re.fullmatch(r"\[\d+\]:", p) for p in report["prompts"]), f"cells not run: {report['prompts']}"
    sizes = report["images"]
    assert len(sizes) >= MIN_FIGURES, f"expected ≥ {MIN_FIGURES} figures rendered in the page; got {sizes}"
    assert all(w > 0 and h > 0 for w, h in sizes), f"a figure did not load: natural sizes {sizes}"
    # The saved notebook holds what the page rendered: every code cell ran, none raised.
    code = [c for c in saved.cells if c.cell_type == "code"]
    errors = [o.get("ename") for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, f"cells raised {errors}"
    assert all(c.get("execution_count") for c in code)
    assert sum("image/png" in o.get("data", {}) for c in code for o in c.get("outputs", [])) >= MIN_FIGURES


@contextlib.contextmanager
def failure_shown(page, tmp: Path):
    """On a failure inside, a screenshot of the page, and where it and JupyterLab's log are."""
    try:
        yield
    except Exception:
        with contextlib.suppress(Exception):
            page.screenshot(path=str(tmp / "lab-failure.png"))
        print(f"see {tmp / 'lab-failure.png'} and {tmp / 'jupyter-lab.log'}")
        raise


def _prepare(tmp: Path) -> None:
    """The notebook with small parameters injected after its ``parameters`` cell (papermill's
    convention, as in tests/notebooks), plus private Jupyter, IPython and JupyterLab settings dirs."""
    nb = nbformat.read(NOTEBOOKS / NOTEBOOK, as_version=4)
    index = next(i for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", []))
    overrides = "\n".join(f"{key} = {value!r}" for key, value in PARAMETERS.items())
    injected = nbformat.v4.new_code_cell(overrides, metadata={"tags": ["injected-parameters"]})
    nb.cells.insert(index + 1, injected)
    for cell in nb.cells:  # stored outputs would pass the checks before anything ran
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    lab_home(tmp, nb)


def lab_home(tmp: Path, nb, name: str = NOTEBOOK) -> None:
    """``tmp`` as JupyterLab's home: ``lab/`` (the server's root: the file browser shows the
    notebook ``nb`` alone), its settings and empty data, runtime and IPython folders."""
    (tmp / "lab").mkdir()
    nbformat.write(nb, tmp / "lab" / name)
    for setting, settings in LAB_SETTINGS.items():
        path = tmp / "jupyter-config" / "lab" / "user-settings" / setting
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(settings))
    for folder in ("jupyter-data", "jupyter-runtime", "ipython"):
        (tmp / folder).mkdir()


class _jupyter_lab:
    """``jupyter lab`` on a free local port, rooted at ``tmp``; on exit, kernels and server are shut
    down through the REST API, and killed if they do not go."""

    def __init__(self, tmp: Path, token: str, marker: str) -> None:
        self.tmp, self.token, self.marker = tmp, token, marker
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> str:
        venv_bin = str(Path(sys.executable).parent)
        env = dict(
            os.environ,
            JUPYTER_CONFIG_DIR=str(self.tmp / "jupyter-config"),
            JUPYTER_DATA_DIR=str(self.tmp / "jupyter-data"),
            JUPYTER_RUNTIME_DIR=str(self.tmp / "jupyter-runtime"),
            IPYTHONDIR=str(self.tmp / "ipython"),
            IPP_NONINTERACTIVE="1",
            MPLBACKEND="module://matplotlib_inline.backend_inline",
            PATH=venv_bin + os.pathsep + os.environ.get("PATH", ""),  # the venv's mpiexec for the kernel
            **{MARKER: self.marker},
        )
        cmd = [
            sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", f"--port={self.port}",
            "--ServerApp.port_retries=0", "--ServerApp.ip=127.0.0.1", f"--ServerApp.token={self.token}",
            f"--ServerApp.root_dir={self.tmp / 'lab'}",
        ]
        self.log = open(self.tmp / "jupyter-lab.log", "wb")
        self.proc = subprocess.Popen(cmd, env=env, cwd=self.tmp, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self.proc.returncode}:\n{self._log_tail()}")
            try:
                self._api("GET", "/api/status")
                return self.base
            except (OSError, urllib.error.URLError):
                time.sleep(0.3)
        self.__exit__(None, None, None)
        raise RuntimeError(f"jupyter lab did not answer within 90 s:\n{self._log_tail()}")

    def __exit__(self, *exc) -> None:
        try:
            for kernel in self._api("GET", "/api/kernels"):
                self._api("DELETE", f"/api/kernels/{kernel['id']}")
            self._api("POST", "/api/shutdown")
        except (OSError, urllib.error.URLError, ValueError):
            pass  # the kill below and the test's leftover check cover it
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()

    def _api(self, method: str, path: str):
        request = urllib.request.Request(
            self.base + path, method=method, headers={"Authorization": f"token {self.token}"},
            data=b"" if method == "POST" else None,
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else None

    def _log_tail(self) -> str:
        self.log.flush()
        return (self.tmp / "jupyter-lab.log").read_text(errors="replace")[-3000:]


# The page is read with small scripts; the notebook is the visible document in the main area.
_PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"
_KERNEL_READY = r"""() => [...document.querySelectorAll('.jp-StatusBar-TextItem')]
    .some(e => /^(?!No Kernel).+ \| Idle$/.test(e.textContent.trim()))"""
_STATE = r"""panel => ({
    status: panel.querySelector('.jp-Notebook-ExecutionIndicator')?.getAttribute('data-status'),
    prompts: [...panel.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')].map(p => p.textContent.trim()),
    tracebacks: [...panel.querySelectorAll('[data-mime-type="application/vnd.jupyter.stderr"]')]
        .map(e => e.textContent).filter(t => t.includes('Traceback')),
})"""
# Finished, or stopped by an error (which unqueues the cells below it): the kernel is idle, no code
# cell is queued or running, and one has a number. "Run All" queues every cell at once, so the gap
# between two cells never satisfies this; it is checked in one evaluation for the same reason.
_DONE = rf"""selector => {{
    const s = ({_STATE})(document.querySelector(selector));
    return s.status === 'idle' && !s.prompts.includes('[*]:') && s.prompts.some(p => /^\[\d+\]:$/.test(p));
}}"""


def _run_all(page, url: str, tmp: Path) -> dict:
    """Open the notebook, Run → Run All Cells, wait for the kernel to finish, and read the page."""
    page.goto(url)
    panel = page.locator(_PANEL)
    panel.locator(".jp-Notebook").wait_for(timeout=60_000)
    # The toolbar's indicator says "idle" while there is no kernel yet, and "Run All Cells" clicked
    # then runs nothing: wait until the status bar names a kernel that is idle.
    page.wait_for_function(_KERNEL_READY, timeout=60_000)
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name=re.compile(r"^Run All Cells")).click()
    page.wait_for_function(_DONE, arg=_PANEL, timeout=RUN_TIMEOUT_MS, polling=250)

    report = panel.evaluate(_STATE) | {"images": []}
    if report["tracebacks"] or not all(re.fullmatch(r"\[\d+\]:", p) for p in report["prompts"]):
        page.screenshot(path=str(tmp / "lab.png"))
        return report
    images = panel.locator(".jp-OutputArea-output img")
    images.first.wait_for(timeout=10_000)
    # The PNGs are data URLs; decoding finishes after they are attached.
    page.wait_for_function(f"() => [...document.querySelectorAll('{_PANEL} img')].every(i => i.complete)")
    images.last.scroll_into_view_if_needed()
    page.screenshot(path=str(tmp / "lab.png"))
    report["images"] = images.evaluate_all("imgs => imgs.map(i => [i.naturalWidth, i.naturalHeight])")
    page.keyboard.press("Control+s")  # so the test can also read the outputs off disk
    _wait_saved(tmp / "lab" / NOTEBOOK)
    return report


def _wait_saved(path: Path, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            cells = nbformat.read(path, as_version=4).cells
            if any(c.get("execution_count") for c in cells if c.cell_type == "code"):
                return
        time.sleep(0.2)
    raise AssertionError(f"JupyterLab did not save {path.name} with its outputs")


def _marked(marker: str) -> list[psutil.Process]:
    """Processes that inherited this test's marker: server, kernel, mpiexec, ranks, browser."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if proc.environ().get(MARKER) == marker:
                found.append(proc)
        except psutil.Error:
            continue
    _, alive = psutil.wait_procs(found, timeout=10)
    return alive


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
