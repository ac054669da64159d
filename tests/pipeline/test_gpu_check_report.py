"""benchmarks/gpu_check_report.py: a pretrain step that ran but measured no steady state (the first
step holds compilation and is left out of the throughput) is not reported as ok."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import gpu_check_report as report  # noqa: E402


def checked(tmp_path: Path, steps: int) -> dict:
    run = tmp_path / "run"
    run.mkdir()
    tps = [None] + [1000.0 + i for i in range(1, steps)]
    (run / "summary.json").write_text(json.dumps({"steps": steps, "tokens_per_second": tps[-1]}))
    (run / "metrics.jsonl").write_text("".join(json.dumps({"kind": "train", "step": i + 1, "tokens_per_second": t}) + "\n"
                                               for i, t in enumerate(tps)))
    (tmp_path / "gpu_check.json").write_text(json.dumps({"environment": {}, "steps": {"pretrain": {"status": "ok", "seconds": 9}},
                                                         "results": {}}))
    report.pretrain(tmp_path, str(run))
    return json.loads((tmp_path / "gpu_check.json").read_text())


@pytest.mark.parametrize("steps, status", [(1, "no steady state (1 steps)"), (2, "no steady state (2 steps)"), (4, "ok")])
def test_a_pretrain_without_steady_steps_is_not_ok(tmp_path, steps, status):
    result = checked(tmp_path, steps)
    assert result["steps"]["pretrain"]["status"] == status
    steady = result["results"]["pretrain"]["derived"]["steady_tokens_per_second"]
    assert (steady is None) == (steps == 1)
