"""``mpinb demo`` end to end, on engines and in batch mode: figures written, sensible numbers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize("mode", ["cluster", "batch"])
def test_demo_writes_figures_and_summary(mode: str, tmp_path: Path) -> None:
    out = tmp_path / "demo"
    cmd = [str(Path(sys.executable).parent / "mpinb"), "demo", "--np", "2", "--out", str(out)]
    if mode == "batch":
        cmd.append("--batch")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["mode"] == mode and summary["ranks"] == 2
    assert summary["keras"]["test_accuracy"] > 0.9
    history = summary["keras"]["history"]
    assert len(history["loss"]) == summary["keras"]["epochs"]
    assert history["loss"][-1] < history["loss"][0]
    inertia = summary["kmeans"]["inertia_history"]
    assert len(inertia) == summary["kmeans"]["n_iter"] and inertia[-1] <= inertia[0]
    for name in ("kmeans.png", "loss.png"):
        png = (out / name).read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 20_000  # a real, drawn figure
    assert "test accuracy" in proc.stdout and "k-means" in proc.stdout
