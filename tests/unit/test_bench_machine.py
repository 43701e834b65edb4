"""Every benchmark result records the machine it ran on (ratios differ between CPUs)."""

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
_spec = importlib.util.spec_from_file_location("_machine", BENCH / "_machine.py")
_machine = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_machine)


def test_the_description_names_the_cpu_its_cores_and_the_blas():
    info = _machine.describe()
    assert info["cpu_model"] and info["cpu_model"] != "unknown"
    assert 1 <= info["cores"] <= info["logical_cpus"]
    assert set(info["isa"]) <= set(_machine._ISA)
    assert info["numpy"] and "blas" in info and "mpi_library" in info


def test_a_written_report_keeps_the_results_and_adds_the_machine(tmp_path):
    out = tmp_path / "deeper" / "r.json"
    _machine.write_report(out, {"benchmark": "x", "ratio": 0.5})
    data = json.loads(out.read_text())
    assert data["ratio"] == 0.5 and data["machine"]["cpu_model"] == _machine.describe()["cpu_model"]


def test_every_benchmark_that_writes_results_stamps_the_machine():
    writers = [p for p in BENCH.glob("*.py") if p.name != "_machine.py" and '"results"' in p.read_text()]
    assert len(writers) >= 8
    missing = [p.name for p in writers if "write_report(" not in p.read_text()]
    assert not missing, f"benchmarks writing results without write_report: {missing}"
