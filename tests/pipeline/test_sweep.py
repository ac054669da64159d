"""`cramlm sweep`: a grid of tiny runs, compute per run, and the fitted power law."""

from __future__ import annotations

import json

import pytest

from cramlm.pipeline.sweep import fit_power_law, size_overrides

from .conftest import TINY_RUN, cramlm


def test_power_law_fit_recovers_the_law():
    compute = [1e12, 3e12, 1e13, 3e13, 1e14]
    fit = fit_power_law(compute, [40.0 * c**-0.05 for c in compute])
    assert fit["a"] == pytest.approx(40.0, rel=1e-6) and fit["alpha"] == pytest.approx(0.05, rel=1e-6)
    assert fit["r2"] == pytest.approx(1.0)
    assert fit_power_law([1e12, 1e12], [3.0, 2.9]) is None  # one compute value: nothing to fit


def test_size_spec():
    assert size_overrides("128x4") == ["arch.hidden_size=128", "arch.num_layers=4", "arch.num_heads=4",
                                       "arch.intermediate_size=512"]
    assert "arch.num_heads=12" in size_overrides("768x16")  # cramming's base: heads of width 64
    with pytest.raises(ValueError, match="HIDDENxLAYERS"):
        size_overrides("big")


def test_sweep_grid(tmp_path):
    args = [a for a in TINY_RUN if not a.startswith(("arch.hidden_size", "arch.num_layers", "arch.num_heads",
                                                       "arch.intermediate_size", "budget"))]
    out = cramlm("sweep", "--sizes", "16x1,32x2", "--budgets", "1s,2s", "--name", "grid", "default", *args, cwd=tmp_path)
    folder = tmp_path / "outputs" / "grid"
    result = json.loads((folder / "sweep.json").read_text())
    points = result["points"]
    assert [(p["size"], p["budget"]) for p in points] == [("16x1", "1s"), ("16x1", "2s"), ("32x2", "1s"), ("32x2", "2s")]
    for p in points:
        assert p["flops"] > 0 and p["tokens"] > 0 and p["loss"] > 0
        if p["flops_from"] == "6*params*tokens":
            assert p["flops"] == 6 * p["parameters"] * p["tokens"]
    assert min(p["parameters"] for p in points if p["size"] == "32x2") > max(p["parameters"] for p in points if p["size"] == "16x1")
    fit = result["fit"]
    assert fit["a"] > 0 and -1 < fit["alpha"] < 1 and fit["r2"] <= 1.0
    assert (folder / "sweep.png").read_bytes()[:4] == b"\x89PNG" and (folder / "report.html").is_file()
    # only the grid's stages ran (no evaluation), and a second sweep reuses every finished point
    assert not (folder / "16x1-1s" / "eval.json").exists()
    again = cramlm("sweep", "--sizes", "16x1,32x2", "--budgets", "1s,2s", "--name", "grid", "--no-report", "default",
                   *args, cwd=tmp_path)
    assert again.count("pretrain: done already") == 4 and "pretrain ..." in out
