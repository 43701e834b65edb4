"""The tutorials' saved outputs: written by the notebooks tier when asked, checked by the docs tier.

The site renders ``notebooks/*.ipynb`` with the outputs saved in them (it never executes them), so a
cell edited after its outputs were saved would show a result its code no longer gives. Each code
cell of a saved tutorial carries the SHA-256 of the source it ran with (``metadata.mpinb.ran``);
:func:`stale_cells` lists the cells whose source differs from what ran, or that never ran.

``python3 tests/run.py --tier notebooks --save-outputs`` writes them: each tutorial runs against a
real cluster with the suite's small parameters, and is saved only if its test passed, with the
cell of those parameters kept in it (papermill's convention) so that the outputs say what made them.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

#: Set by ``tests/run.py --save-outputs``: the notebooks tier writes the executed tutorials back.
SAVE_ENV = "MPINB_SAVE_NOTEBOOK_OUTPUTS"
_PARAMETERS_NOTE = ("# The parameters this copy's outputs were made with (the test suite's, small); "
                    "delete this cell to run with the defaults above.\n")


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def asked() -> bool:
    return os.environ.get(SAVE_ENV) == "1"


def save(nb: Any, path: Path, dropped: int = 1) -> None:
    """Write the executed ``nb`` to ``path`` without its last ``dropped`` cells (the test's own
    result dump), each code cell stamped with the hash of the source it ran."""
    import nbformat

    nb.cells = nb.cells[: len(nb.cells) - dropped]
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        if "injected-parameters" in cell.metadata.get("tags", []) and not cell.source.startswith("#"):
            cell.source = _PARAMETERS_NOTE + cell.source
        cell.metadata.setdefault("mpinb", {})["ran"] = source_hash(cell.source)
        cell.outputs = [o for o in cell.outputs if not _progress_only(o)]
    nbformat.write(nb, path)


def stale_cells(nb: Any) -> list[str]:
    """The code cells of a saved tutorial whose outputs do not come from their source: edited since
    they ran, or never run (``"cell 4: edited since its outputs were saved"``)."""
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        ran = cell.metadata.get("mpinb", {}).get("ran")
        if ran is None:
            found.append(f"cell {i}: never run with its outputs saved")
        elif ran != source_hash(cell.source):
            found.append(f"cell {i}: edited since its outputs were saved")
    return found


def _progress_only(output: Any) -> bool:
    """ipyparallel's progress bar as a saved notebook keeps it: a widget whose state is not saved,
    so its text fallback shows the bar's first frame (``%px:   0%| 0/4``) under a finished cell."""
    data = output.get("data", {}) if output.get("output_type") in ("display_data", "execute_result") else {}
    text = data.get("text/plain", "")
    return "application/vnd.jupyter.widget-view+json" in data and str(text).lstrip().startswith("%px")
