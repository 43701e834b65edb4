"""Pages built from the project itself at documentation build time."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path
from typing import Any

__all__ = ["all_pages"]

# In the order a reader compares machines by; benchmarks/_machine.py writes them under "machine",
# older result files wrote some at the top level or under "setup".
_MACHINE_KEYS = ("cpu_model", "isa", "cores", "logical_cpus", "cpus", "memory_gib", "blas", "mpi_library",
                 "python", "numpy", "node", "machine")


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
            parts.append(_table([_flat({k: v for k, v in data.items() if k != "machine"})]))
    return "\n".join(parts)


def _docstring(script: Path) -> str:
    doc = ast.get_docstring(ast.parse(script.read_text())) or ""
    return doc.split("\n\n")[0].replace("\n", " ")


def _machine(data: dict[str, Any]) -> str:
    found: dict[str, Any] = {}
    sources = [data.get(key) for key in ("machine", "setup")] + [data]
    for source in (s for s in sources if isinstance(s, dict)):
        for key in _MACHINE_KEYS:
            value = source.get(key)
            if isinstance(value, list) and all(isinstance(v, str) for v in value):
                value = " ".join(value) or None
            if key not in found and value is not None and not isinstance(value, (dict, list)):
                found[key] = value
    return ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in found.items())


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
