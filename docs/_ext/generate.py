"""Pages built from the project itself at documentation build time."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path
from typing import Any

__all__ = ["all_pages"]

_MACHINE_KEYS = ("machine", "cpu_model", "cpus", "cores", "python", "numpy", "mpi_library")


def all_pages(root: Path, out: Path) -> None:
    """Write the generated pages under ``out`` and copy the tutorials next to their index."""
    out.mkdir(exist_ok=True)
    _write_if_changed(out / "protocol.md", _protocol())
    _write_if_changed(out / "benchmarks.md", _benchmarks(root))
    tutorials = root / "docs" / "tutorials"
    for nb in sorted((root / "notebooks").glob("*.ipynb")):
        target = tutorials / nb.name
        if not target.exists() or target.read_bytes() != nb.read_bytes():
            shutil.copyfile(nb, target)


def _write_if_changed(path: Path, text: str) -> None:
    # Unchanged pages keep their time stamp, so an incremental build does not re-read them.
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def _protocol() -> str:
    from mpinb._collective import protocol

    return "% generated from mpinb/_collective/protocol.py at build time\n\n" + protocol.diagram_markdown()


def _benchmarks(root: Path) -> str:
    parts = ["% generated from benchmarks/results/*.json at build time\n"]
    for path in sorted((root / "benchmarks" / "results").glob("*.json")):
        data = json.loads(path.read_text())
        script = root / "benchmarks" / (path.stem.split("_")[0] + ".py")
        parts.append(f"\n## `{path.name}`\n")
        doc = _docstring(script) if script.exists() else ""
        if doc:
            parts.append(f"From `benchmarks/{script.name}`: {doc}\n")
        machine = _machine(data)
        parts.append(f"Machine: {machine}.\n" if machine else "Machine: not recorded in this result file.\n")
        rows = _rows(data)
        if rows:
            parts.append(_table(rows))
        else:
            parts.append(_table([_flat(data)]))
    return "\n".join(parts)


def _docstring(script: Path) -> str:
    doc = ast.get_docstring(ast.parse(script.read_text())) or ""
    return doc.split("\n\n")[0].replace("\n", " ")


def _machine(data: dict[str, Any]) -> str:
    found = {}
    for source in (data, data.get("setup") if isinstance(data.get("setup"), dict) else {}):
        for key in _MACHINE_KEYS:
            if key in source and not isinstance(source[key], (dict, list)):
                found[key] = source[key]
    return ", ".join(f"{k} {v}" for k, v in found.items())


def _rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    for key in ("results", "runs", "sizes"):
        value = data.get(key)
        if isinstance(value, list) and value and all(isinstance(r, dict) for r in value):
            rows = []
            for r in value:
                inner = r.get("results")
                if isinstance(inner, list) and inner and all(isinstance(x, dict) for x in inner):
                    head = {k: v for k, v in r.items() if not isinstance(v, (dict, list))}
                    rows += [{**head, **_flat(x)} for x in inner]
                else:
                    rows.append(_flat(r))
            return rows
        if isinstance(value, dict) and value and all(isinstance(r, dict) for r in value.values()):
            return [{"case": k, **_flat(v)} for k, v in value.items()]
    return []


def _flat(row: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flat(value, f"{name}."))
        elif not isinstance(value, list):
            out[name] = value
    return out


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|")


def _table(rows: list[dict[str, Any]], limit: int = 12) -> str:
    columns: list[str] = []
    for r in rows:
        columns += [c for c in r if c not in columns and r[c] is not None]
    columns = columns[:limit]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"
