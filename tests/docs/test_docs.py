"""The documentation site builds without a warning and its pages render in headless Chromium.

``sphinx-build -W --keep-going -n`` (nitpicky: every cross-reference must resolve) into a temporary
folder, the notebooks rendered from their saved outputs and never executed; then the built index, an
API page and a tutorial page are opened from disk in the browser tier's Chromium (Playwright).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# Each page and a text it must show once rendered (titles are "<page> — mpinb <version>").
PAGES = {
    "index.html": ("mpinb", "Interactive parallel machine learning on MPI"),
    "api/generated/mpinb.KMeans.html": ("mpinb.KMeans", "n_clusters"),
    "tutorials/02_distributed_kmeans.html": ("k-means", "scikit-learn"),
}


def _need(what: str, ok: bool) -> None:
    if not ok:
        reason = f"docs tier needs {what}"
        if os.environ.get("CI"):
            pytest.fail(reason + "; CI must provide it (pip install -e '.[docs]')")
        pytest.skip(reason)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    _need("Sphinx and the docs extra", importlib.util.find_spec("sphinx") is not None
          and importlib.util.find_spec("myst_nb") is not None)
    out = tmp_path_factory.mktemp("site")
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html",
         "-d", str(out / ".doctrees"), str(DOCS), str(out / "html")],
        cwd=ROOT, capture_output=True, text=True, timeout=170,
        env=dict(os.environ, MPLBACKEND="Agg", TF_CPP_MIN_LOG_LEVEL="3"),
    )
    print(f"sphinx-build: {time.monotonic() - t0:.1f} s")
    assert proc.returncode == 0, f"sphinx-build failed (exit {proc.returncode}):\n{proc.stderr[-6000:]}"
    # -W makes any Sphinx warning fail the build (exit 1); stderr also holds TensorFlow's start-up
    # lines, so it is not searched for the word.
    return out / "html"


def test_every_api_name_has_a_page(site: Path) -> None:
    import mpinb
    import mpinb.data
    import mpinb.live

    names = [f"mpinb.{n}" for n in mpinb.__all__ if n != "__version__"]
    names += [f"mpinb.data.{n}" for n in mpinb.data.__all__]
    names += [f"mpinb.live.{n}" for n in mpinb.live.__all__ if n != "KEY"]
    missing = [n for n in names if not (site / "api" / "generated" / f"{n}.html").exists()]
    assert not missing, f"public names without an API page: {missing}"


# scikit-learn's machinery that the class template leaves out on purpose (metadata routing, params).
_NOT_DOCUMENTED = {"set_fit_request", "set_predict_request", "set_score_request", "set_transform_request",
                   "set_partial_fit_request", "set_inverse_transform_request", "set_output",
                   "get_metadata_routing", "set_params", "get_params"}


def test_every_public_method_has_an_entry_inherited_ones_included(site: Path) -> None:
    """A user reads ``KMeans.predict`` and that ``score`` is a collective on the class's page, not
    only through ``help()``: every public method and property of every public class, wherever it
    is defined (mpinb's shared bases, scikit-learn's mixins), has its entry."""
    import inspect

    import mpinb

    missing = []
    for name in mpinb.__all__:
        cls = getattr(mpinb, name)
        if not inspect.isclass(cls) or issubclass(cls, BaseException):
            continue
        page = (site / "api" / "generated" / f"mpinb.{name}.html").read_text()
        for member in dir(cls):
            if member.startswith("_") or member in _NOT_DOCUMENTED:
                continue
            if callable(getattr(cls, member)) or isinstance(inspect.getattr_static(cls, member), property):
                if f'id="mpinb.{name}.{member}"' not in page:
                    missing.append(f"{name}.{member}")
    assert not missing, f"public methods without an entry on their class's page: {missing}"


def test_every_tutorial_shows_the_outputs_of_its_code() -> None:
    """The site renders the tutorials with their saved outputs: each code cell must have run, as it
    reads now, in the notebooks tier (``python3 tests/run.py --tier notebooks --save-outputs``), and
    each tutorial shows its figures."""
    import nbformat

    from support.saved_outputs import stale_cells

    problems = {}
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        found = stale_cells(nb)
        if not any("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", [])):
            found.append("no figure saved")
        if found:
            problems[path.name] = found
    assert not problems, ("tutorials whose saved outputs do not come from their code (rerun "
                          f"`python3 tests/run.py --tier notebooks --save-outputs`): {problems}")


def test_pages_render_in_chromium(site: Path) -> None:
    _need(f"{CHROMIUM} (apt-get install chromium)", os.path.exists(CHROMIUM))
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _need("the `playwright` Python package", False)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            for path, (title, text) in PAGES.items():
                page.goto((site / path).as_uri(), wait_until="load")
                assert title in page.title(), f"{path}: title {page.title()!r}"
                body = page.inner_text("article")
                assert text in body, f"{path}: {text!r} not in the rendered page"
                shot = site.parent / (path.replace("/", "_") + ".png")
                page.screenshot(path=str(shot), full_page=False)
            # The notebooks are stored without outputs (the notebooks tier executes them): the page
            # must still show their code cells, highlighted.
            cells = page.locator("article div.cell div.highlight").count()
            assert cells >= 3, f"tutorial page shows {cells} code cells"
        finally:
            browser.close()
    print(f"screenshots in {site.parent}")
