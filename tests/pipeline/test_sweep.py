"""`cramlm sweep`: a grid of tiny runs, compute per run, and the fitted power law."""

from __future__ import annotations

import json

import numpy as np
import pytest

from click.testing import CliRunner

from cramlm.cli import main
from cramlm.pipeline.scaling import FitError, chinchilla_law, fit_chinchilla, fit_compute_law
from cramlm.pipeline.sweep import _plain, budget_overrides, check_grid, size_overrides, unique_grid

from .conftest import TINY_RUN, cramlm


def test_compute_law_fit_recovers_the_irreducible_loss():
    compute = [1e12, 3e12, 1e13, 3e13, 1e14, 3e14]
    loss = [1.7 + 3e4 * c**-0.35 for c in compute]
    fit = fit_compute_law(compute, loss)
    assert fit["E"] == pytest.approx(1.7, rel=1e-3) and fit["alpha"] == pytest.approx(0.35, rel=1e-3)
    assert fit["A"] == pytest.approx(3e4, rel=1e-2) and fit["r2"] == pytest.approx(1.0)
    # a pure power law is the E = 0 case, inside the bounds
    pure = fit_compute_law(compute, [40.0 * c**-0.05 for c in compute])
    assert pure["E"] == pytest.approx(0.0, abs=1e-3) and pure["alpha"] == pytest.approx(0.05, rel=1e-2)


def test_compute_law_refuses_what_it_cannot_fit():
    with pytest.raises(FitError, match="needs at least 4"):
        fit_compute_law([1e12, 1e13, 1e14], [3.0, 2.9, 2.8])
    with pytest.raises(FitError, match="2 distinct compute"):
        fit_compute_law([1e12, 1e12, 1e13, 1e13], [3.0, 2.9, 2.8, 2.7])


def test_chinchilla_fit_recovers_the_law():
    truth = {"E": 1.5, "A": 40.0, "a": 0.3, "B": 300.0, "b": 0.35}
    N = [n for n in (1e5, 4e5, 1.6e6) for _ in range(3)]
    D = [d for _ in range(3) for d in (1e6, 4e6, 1.6e7)]
    fit = fit_chinchilla(N, D, [float(chinchilla_law(truth, n, d)) for n, d in zip(N, D)])
    assert fit["r2"] == pytest.approx(1.0, abs=1e-6)
    for n, d in [(2e5, 3e6), (1e6, 1e7)]:  # it predicts between the grid points
        assert float(chinchilla_law(fit, n, d)) == pytest.approx(float(chinchilla_law(truth, n, d)), rel=1e-3)
    with pytest.raises(FitError, match="2 of each"):
        fit_chinchilla([1e5] * 6, [1e6, 2e6, 4e6, 8e6, 1.6e7, 3.2e7], [3, 2.9, 2.8, 2.7, 2.6, 2.5])


def test_grid_check_before_running():
    with pytest.raises(ValueError, match="needs at least 4"):
        check_grid(["64x2"], ["1m"])  # one point: cramlm sweep used to print "fit: null"
    with pytest.raises(ValueError, match="2 distinct compute.*add budgets"):
        check_grid(["64x2", "128x2"], ["1m", "2m"])  # a clock budget gives every size the same compute
    with pytest.raises(ValueError, match="mixes"):
        check_grid(["64x2", "128x2"], ["1m", "1Mtok"])
    with pytest.raises(ValueError, match="duration .* or a token count"):
        check_grid(["64x2", "128x2"], ["soon", "1Mtok"])
    assert check_grid(["64x2", "128x2"], ["250ktok", "1Mtok"]) is True  # token budgets: four distinct compute values
    # one clock budget, several shapes: which shape the budget buys (ranked, not fitted)
    assert check_grid(["64x2", "128x2", "256x4"], ["15m"]) is False
    check_grid(["64x2"], ["1m", "2m", "4m", "8m"])
    assert budget_overrides("250ktok") == (["budget=null", "train.budget.tokens=250000"], "tokens", 250000.0)
    assert budget_overrides("1.5Mtokens")[0][1] == "train.budget.tokens=1500000"


def test_sweep_refuses_a_one_point_grid_before_running(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["sweep", "--sizes", "16x1", "--budgets", "1s", "default", *TINY_RUN])
    assert result.exit_code == 1
    assert result.output.startswith("Error:") and "needs at least 4" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "outputs").exists()  # nothing ran


def test_sweep_specs_with_spaces_and_a_bad_or_taken_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["sweep", "--sizes", "16x1", "--budgets", "1s, 2s", "default", *TINY_RUN])
    assert result.exit_code == 1 and "needs at least 4" in result.output, result.output  # (was: an Error about name)
    for name in ("../x", ".hidden"):
        result = CliRunner().invoke(main, ["sweep", "--name", name, "default", *TINY_RUN])
        assert result.exit_code == 1 and result.output.startswith(f"Error: --name {name!r}: must be one folder name"), result.output
    (tmp_path / "outputs" / "default").mkdir(parents=True)
    (tmp_path / "outputs" / "default" / "summary.json").write_text("{}")
    result = CliRunner().invoke(main, ["sweep", "--name", "default", "default", *TINY_RUN])
    assert result.exit_code == 1 and "holds a run (summary.json)" in result.output, result.output
    assert not (tmp_path / "outputs" / "x").exists() and not (tmp_path / "x").exists()


def test_axis_labels_are_plain_numbers():
    assert _plain(8.85) == "8.85" and _plain(1e12) == "1e+12" and _plain(3.0) == "3"


def test_size_spec():
    assert size_overrides("128x4") == ["arch.hidden_size=128", "arch.num_layers=4", "arch.num_heads=4",
                                       "arch.intermediate_size=512"]
    assert "arch.num_heads=12" in size_overrides("768x16")  # cramming's base: heads of width 64
    with pytest.raises(ValueError, match="HIDDENxLAYERS"):
        size_overrides("big")


def test_sweep_grid(tmp_path):
    args = [a for a in TINY_RUN if not a.startswith(("arch.hidden_size", "arch.num_layers", "arch.num_heads",
                                                       "arch.intermediate_size", "budget"))]
    out = cramlm("sweep", "--sizes", "16x1,32x2", "--budgets", "2ktok,4ktok", "--name", "grid", "default", *args, cwd=tmp_path)
    folder = tmp_path / "outputs" / "grid"
    result = json.loads((folder / "sweep.json").read_text())
    points = result["points"]
    assert [(p["size"], p["budget"]) for p in points] == [("16x1", "2ktok"), ("16x1", "4ktok"), ("32x2", "2ktok"), ("32x2", "4ktok")]
    for p in points:
        assert p["flops"] > 0 and p["loss"] > 0 and 2000 <= p["tokens"] <= 4000 + 256  # the token budget, not the clock
        assert 0 < p["non_embedding_parameters"] < p["parameters"]
        if p["flops_from"] == "6*params*tokens":
            assert p["flops"] == 6 * p["parameters"] * p["tokens"]
    assert min(p["parameters"] for p in points if p["size"] == "32x2") > max(p["parameters"] for p in points if p["size"] == "16x1")
    # what the points were trained with, for `cramlm plan --law sweep.json` (its lr goes with its optimizer)
    assert result["data"]["optimizer"] == "muon" and result["data"]["lr"] == 0.016 and result["data"]["mlm_probability"] == 0.25
    fit = result["fit"]
    assert fit["E"] >= 0 and fit["A"] >= 0 and 0 <= fit["alpha"] <= 3 and fit["r2"] <= 1.0
    summary = out[out.index("size  budget"):]  # the sweep's own output: a table and the law, not raw JSON
    assert "fit: L = " in summary and "16x1  2ktok" in summary and "{" not in summary
    assert (folder / "sweep.png").read_bytes()[:4] == b"\x89PNG" and (folder / "report.html").is_file()
    # only the grid's stages ran (no evaluation), and a second sweep reuses every finished point
    assert not (folder / "16x1-1s" / "eval.json").exists()
    again = cramlm("sweep", "--sizes", "16x1,32x2", "--budgets", "2ktok,4ktok", "--name", "grid", "--no-report", "default",
                   *args, cwd=tmp_path)
    assert again.count("pretrain: done already") == 4 and "pretrain ..." in out


def test_repeated_sizes_and_budgets_are_one_point_each():
    """Issue 20 item 10: `--sizes 64x2,64x2` trained the point twice and listed it twice."""
    said = []
    sizes, budgets = unique_grid(["64x2", "128x2", "64x2"], ["250ktok", "1Mtok", "250000tok", "1Mtok"], say=said.append)
    assert sizes == ["64x2", "128x2"] and budgets == ["250ktok", "1Mtok"]
    assert len(said) == 3 and "size '64x2' is '64x2' again" in said[0] and "'250000tok' is '250ktok' again" in said[1]


def test_grid_check_counts_the_tokens_the_points_train(tmp_path, monkeypatch):
    """4ktok and 8ktok both train one step (8,192 tokens with the default batch): two budgets, one
    compute value per size. The check used to count the budgets, train every point, then fail."""
    assert check_grid(["64x2", "128x2"], ["4ktok", "8ktok"]) is True  # by the budgets' own numbers
    trained = {(s, b): 8192 for s in ("64x2", "128x2") for b in ("4ktok", "8ktok")}
    with pytest.raises(ValueError, match="2 distinct compute.*4ktok and 8ktok train the same 8,192 tokens"):
        check_grid(["64x2", "128x2"], ["4ktok", "8ktok"], trained)
    # end to end: refused before anything trains (one step of 8 x 32 = 256 tokens is the minimum here)
    monkeypatch.chdir(tmp_path)
    args = [a for a in TINY_RUN if not a.startswith(("arch.hidden_size", "arch.num_layers", "arch.num_heads",
                                                       "arch.intermediate_size", "budget"))]
    result = CliRunner().invoke(main, ["sweep", "--sizes", "16x1,32x2,16x1", "--budgets", "100tok,200tok", "default", *args])
    assert result.exit_code == 1, result.output
    assert "Error:" in result.output and "100tok and 200tok train the same 256 tokens" in result.output, result.output
    assert "size '16x1' is '16x1' again" in result.output
    assert not (tmp_path / "outputs").exists()  # nothing ran


def test_multiplier_law_recovers_its_coefficients_and_its_interval_widens_away_from_the_data():
    from cramlm.pipeline.scaling import fit_multiplier_law, multiplier_law

    rng = np.random.default_rng(0)
    N = np.repeat([1e6, 3e6, 1e7], 6)
    D = N * np.tile([1.0, 2.0, 4.0, 8.0, 16.0, 32.0], 3)
    true = np.exp(0.7 - 0.1 * np.log(N / 1e6) - 0.05 * np.log(D / N))
    fit = fit_multiplier_law(N, D, true * np.exp(rng.normal(0, 0.02, len(N))))
    assert fit["b"] == pytest.approx(-0.1, abs=0.03) and fit["c"] == pytest.approx(-0.05, abs=0.02) and fit["dof"] == 15
    near, far = multiplier_law(fit, 3e6, 3e7), multiplier_law(fit, 1e8, 1e10)
    assert near["low"] < np.exp(0.7 - 0.1 * np.log(3) - 0.05 * np.log(10)) < near["high"]
    assert far["high"] / far["low"] > near["high"] / near["low"]  # extrapolation costs certainty
    with pytest.raises(FitError, match="needs at least 4 points and 2 values of each term"):
        fit_multiplier_law([1e6] * 4, [1e6, 2e6, 4e6, 8e6], [2, 2, 2, 2])
    # seeds read on one baseline frontier share its error: grouped, the law is fitted on the groups'
    # means with their degrees of freedom, and a prediction's interval holds the seeds' scatter too
    shared = np.repeat(rng.normal(0, 0.05, len(N)), 2)  # each (size, budget) group's frontier error, for both its seeds
    seeds = np.repeat(true, 2) * np.exp(shared + rng.normal(0, 0.02, 2 * len(N)))
    N2, D2, labels = np.repeat(N, 2), np.repeat(D, 2), [f"{n:g}-{d:g}" for n, d in zip(np.repeat(N, 2), np.repeat(D, 2))]
    apart, grouped = fit_multiplier_law(N2, D2, seeds), fit_multiplier_law(N2, D2, seeds, groups=labels)
    assert (apart["dof"], grouped["dof"], grouped["points"], grouped["observations"]) == (33, 15, 18, 36)
    assert grouped["sigma2_within"] == pytest.approx(0.02 ** 2, rel=0.5) and apart["sigma2_within"] == 0
    a, g = multiplier_law(apart, 3e6, 3e7), multiplier_law(grouped, 3e6, 3e7)
    assert g["high"] / g["low"] > a["high"] / a["low"]  # the seeds were never independent evidence
    with pytest.raises(FitError, match="35 group labels for 36 observations"):
        fit_multiplier_law(N2, D2, seeds, groups=labels[:-1])
    with pytest.raises(FitError, match="holds observations of other sizes"):
        fit_multiplier_law(N2, D2, seeds, groups=["one"] * 3 + labels[3:])


def test_sweep_shows_zero_shot_minimal_pairs_against_compute(tmp_path):
    """eval.minimal_pairs.paths: every point also scores the pairs (no fine-tuning), beside its loss."""
    from pathlib import Path

    pairs = Path(__file__).parents[1] / "eval" / "fixtures" / "minimal_pairs"
    args = [a for a in TINY_RUN if not a.startswith(("arch.hidden_size", "arch.num_layers", "arch.num_heads",
                                                       "arch.intermediate_size", "budget"))]
    out = cramlm("sweep", "--sizes", "16x1,32x2", "--budgets", "2ktok,4ktok", "--name", "zs", "default", *args,
                 f"eval.minimal_pairs.paths=[{pairs}]", "eval.lm_eval=false", cwd=tmp_path)
    folder = tmp_path / "outputs" / "zs"
    points = json.loads((folder / "sweep.json").read_text())["points"]
    eval_json = json.loads((folder / "16x1-2ktok" / "eval.json").read_text())
    head = eval_json["minimal_pairs"]["headline"]  # the objective's own scorer (hybrid: causal log-probability)
    assert all(0 <= p["zero_shot"] <= 1 and p["zero_shot_scorer"] == head for p in points)
    assert f"zero-shot % ({head})" in out[out.index("size  budget"):]  # the column names its scorer
    assert eval_json["results"] == [] and eval_json["minimal_pairs"]["scores"][head]["pairs"] == 8
    assert "Zero-shot minimal pairs" in (folder / "report.html").read_text()
    # the same sweep without pairs: the eval.json its points keep is not shown (it was, stale, mixed with other settings)
    out = cramlm("sweep", "--sizes", "16x1,32x2", "--budgets", "2ktok,4ktok", "--name", "zs", "default", *args,
                 "eval.minimal_pairs.paths=[]", "--no-report", cwd=tmp_path)
    assert "zero-shot" not in out and not any("zero_shot" in p for p in json.loads((folder / "sweep.json").read_text())["points"])
    # (that sweep set each point's evaluation aside as another configuration's; the next with pairs restores it)
    stale = folder / "32x2-4ktok" / "eval.stale.json"
    assert stale.is_file() and not (folder / "32x2-4ktok" / "eval.json").exists()
    # a pair file changed between two sweeps (its paths the same, so a finished point is not re-scored): not one curve
    edited = json.loads(stale.read_text())
    edited["minimal_pairs"]["scores"][head]["paradigms"]["anaphor"]["pairs"] = 2
    stale.write_text(json.dumps(edited))
    # (as if that point had been scored on the edited file: its record's digest of the result is the edited one's)
    import hashlib

    record_file = folder / "32x2-4ktok" / "pipeline.json"
    record = json.loads(record_file.read_text())
    record["stages"]["eval"]["outputs"] = {"eval.json": hashlib.sha256(stale.read_bytes()).hexdigest()[:16]}
    record_file.write_text(json.dumps(record))
    out = cramlm("sweep", "--sizes", "16x1,32x2", "--budgets", "2ktok,4ktok", "--name", "zs", "default", *args,
                 f"eval.minimal_pairs.paths=[{pairs}]", "eval.lm_eval=false", "--no-report", cwd=tmp_path)
    assert "zero-shot %" not in out and f"32x2-4ktok {head} on 6 pairs in 2 paradigms" in out
    assert "not shown against compute" in json.loads((folder / "sweep.json").read_text())["zero_shot_error"]


def test_a_point_without_validation_reads_its_objectives_train_curve(tmp_path):
    """No val_loss: the last train-loss window, of the curve that measures the held-out loss's task (an
    ELECTRA point: its generator's MLM, ~4 nats, not the sum it minimises with 50 x the detector's BCE)."""
    from cramlm.pipeline.sweep import final_loss

    run = tmp_path / "p"
    run.mkdir()
    (run / "config.yaml").write_text("name: p\narch: {type: crammed-bert}\ntrain: {objective: rtd}\n")
    lines = [{"step": s, "tokens": 100 * s, "loss": 30.0 - s, "mlm_loss": 5.0 - s / 10, "rtd_loss": 0.5} for s in (10, 20)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (run / "summary.json").write_text(json.dumps({"name": "p", "objective": "rtd", "last_loss": 10.0}))
    assert final_loss(run) == (3.0, "train_loss")
    (run / "metrics.jsonl").write_text("".join(json.dumps({k: v for k, v in line.items() if k != "mlm_loss"}) + "\n" for line in lines))
    assert final_loss(run) == (10.0, "train_sum")  # ELECTRA logging only the sum it minimised: another kind
    (run / "config.yaml").write_text("name: p\narch: {type: crammed-bert}\n")  # MLM: its loss is its task's
    (run / "summary.json").write_text(json.dumps({"name": "p", "objective": "mlm", "last_loss": 10.0}))
    assert final_loss(run) == (10.0, "train_loss")


def test_points_with_losses_of_different_kinds_are_neither_fitted_nor_ranked():
    """A validation loss and a train loss (or ELECTRA's sum of tasks) are no one curve: the fit, the
    L(N, D) fit and the ranking at one clock budget are refused, naming each point's kind."""
    from cramlm.pipeline.sweep import fit_points, table

    def point(size, budget, flops, loss, kind):
        return {"size": size, "budget": budget, "flops": flops, "loss": loss, "loss_kind": kind, "parameters": 1,
                "non_embedding_parameters": {"a": 1e5, "b": 4e5}[size], "tokens": flops / 1e6}

    same = [point(s, b, f, 10 * f ** -0.1, "val_loss") for s, f0 in (("a", 1e12), ("b", 4e12))
            for b, f in (("1x", f0), ("2x", 2 * f0), ("4x", 4 * f0))]
    fit, _, errors = fit_points(same, fitting=True)
    assert fit is not None and "loss_kinds" not in errors
    mixed = [*same[:-1], {**same[-1], "loss_kind": "train_sum", "loss": 22.0}]
    fit, fit_nd, errors = fit_points(mixed, fitting=True)
    assert fit is None and fit_nd is None
    assert "different kinds" in errors["fit"] and "b-4x train_sum" in errors["fit"] and "a-1x val_loss" in errors["fit_nd"]
    assert errors["loss_kinds"] == "train_sum, val_loss"
    assert "22.0000 (train_sum)" in table(mixed, None) and "(val_loss)" not in table(same, None)
    one_budget = [{**p, "budget": "1h"} for p in mixed[3:]]  # b's three points, one of another kind
    _, _, errors = fit_points(one_budget, fitting=False)
    assert "different kinds" in errors["fit"] and all("vs_best" not in p for p in one_budget)  # not ranked
    _, _, errors = fit_points(same[3:], fitting=False)
    assert "loss_kinds" not in errors and all("vs_best" in p for p in same[3:])
