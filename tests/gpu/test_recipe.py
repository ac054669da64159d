"""The GPU-day recipe (`gpu-24h`: Muon with split fused rows, QK-norm, zero-init, ELECTRA) trains in
bf16 on the device as the A/B (benchmarks/gpu_ab.py) runs it, eager, at tiny widths: a failure here
shows in gpu_check's first step, before the A/B spends its minutes. (Its compiled graphs, ELECTRA with
QK-norm and zero-init, are checked for recompilation on a CPU: tests/models/test_compile.py.)"""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from cramlm.cli import main
from tests.gpu.helpers import run_overrides
from tests.train.helpers import TINY

pytestmark = pytest.mark.cuda


def test_the_gpu_day_recipe_trains_on_the_device(device, tmp_path):
    precision = "bf16" if device.type == "cuda" else "fp32"
    args = ["run", "gpu-24h", "name=g", "stages=[data,pretrain]", "data=default", f"base_dir={tmp_path}",
            f"impl.data_cache={tmp_path / 'data'}", *TINY, *run_overrides(device), f"impl.precision={precision}",
            "budget=null", "train.budget.steps=4", "train.batch_size=16", "train.batch_ramp=0", "train.optim.lr=3e-3"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert f"device {device.type}" in result.output
    summary = json.loads((tmp_path / "g" / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["objective"] == "rtd"
    rows = [json.loads(line) for line in (tmp_path / "g" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["kind"] == "train"]
    assert len(train) == 4 and all(r["loss"] == r["loss"] and r["loss"] < 1e3 for r in train)  # finite
    config = (tmp_path / "g" / "config.yaml").read_text()
    assert "type: muon" in config and "qk_norm: true" in config and f"precision: {precision}" in config
    training = torch.load(tmp_path / "g" / "checkpoints" / "step-00000004" / "training.pt", weights_only=True)
    assert training["optimizer"]["param_groups"][0]["muon"] is True
    kept = {p.name: json.loads((p / "state.json").read_text()).get("kept_at")
            for p in (tmp_path / "g" / "checkpoints").iterdir()}
    assert {name: at for name, at in kept.items() if at} == {"step-00000001": 0.25, "step-00000002": 0.5}, kept
