"""The model tier's closing line."""

from __future__ import annotations

from typing import Any


def pytest_terminal_summary(terminalreporter: Any) -> None:
    from test_model import SUMMARY

    if not SUMMARY["by_size"] and not SUMMARY["mutants"]:
        return
    sizes = ", ".join(f"{n} ranks: {k:,}" for n, k in sorted(SUMMARY["by_size"].items()))
    terminalreporter.write_line(f"model: schedules by size: {sizes} ({SUMMARY.get('seconds', 0):.0f} s)")
    for mutant, (seconds, where) in SUMMARY.get("mutant_times", {}).items():
        terminalreporter.write_line(f"model: mutant {mutant!r}: " + (f"caught in {seconds:.1f} s ({where})" if where
                                    else f"not caught ({seconds:.1f} s)"))
    terminalreporter.write_line(
        f"model: {SUMMARY['schedules']:,} schedules, {SUMMARY['violations']} violations, "
        f"{SUMMARY['caught']} of {SUMMARY['mutants']} mutants caught")
