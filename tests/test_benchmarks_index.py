"""benchmarks/README.md is the index of the benchmarks: every script there is listed with what it
measures and how to run it, and every result file it names exists."""

from __future__ import annotations

import re
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def test_every_benchmark_script_is_in_the_index():
    index = (BENCH / "README.md").read_text(encoding="utf-8")
    scripts = sorted(p.name for p in [*BENCH.glob("*.py"), *BENCH.glob("*.sh")] if p.name != "__init__.py")
    missing = [name for name in scripts if f"`{name}`" not in index]
    assert scripts and not missing, f"benchmarks/README.md does not list {missing}"


def test_the_result_files_the_index_names_exist():
    index = (BENCH / "README.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`results/([\w./-]+\.(?:json|md))`", index))
    missing = sorted(n for n in named if not (BENCH / "results" / n).is_file())
    assert named and not missing, f"benchmarks/README.md names result files that do not exist: {missing}"
