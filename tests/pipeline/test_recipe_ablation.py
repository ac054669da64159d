"""benchmarks/recipe_ablation.py (the multipliers of its ablations, its runs' plan, a stored
baseline), contender_steps.py (the wall-clock multiplier) and frontier_lr_check.py (committed runs
read on the tuned frontier). The compute multiplier itself: tests/pipeline/test_scaling.py."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

def fake(tmp_path, name: str, objective: str, losses: list[float], times: float = 1, lr: float = 1e-3) -> dict:
    """A finished run folder: validation points every 1000 tokens, 10 FLOPs per token."""
    import json

    folder = tmp_path / f"{name}-lr{lr:g}-x{times:g}"
    folder.mkdir()
    lines = [{"kind": "val", "step": i + 1, "tokens": 1000 * (i + 1), "elapsed": i + 1.0, "val_loss": v}
             for i, v in enumerate(losses)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    (folder / "summary.json").write_text(json.dumps({
        "objective": objective, "flops_per_token": 10.0, "flops": 10.0 * 1000 * len(losses), "train_seconds": float(len(losses)),
        "tokens": 1000 * len(losses), "val_loss": losses[-1], "steps": len(losses)}))
    return {"folder": folder, "contender": name, "lr": lr, "seed": 0, "times": times}


def test_a_candidate_of_another_objective_gets_no_multiplier(tmp_path):
    """An rtd (ELECTRA) run's held-out loss is its generator's MLM loss: never read off an MLM curve."""
    from recipe_ablation import summarize, table

    runs = [fake(tmp_path, "mlm", "mlm", [7.0, 6.0, 5.0]), fake(tmp_path, "same", "mlm", [6.0, 5.5]),
            fake(tmp_path, "rtd", "rtd", [6.0, 4.0, 2.0])]
    result = summarize(tmp_path, runs, "mlm", extrapolate=False)
    assert result["contenders"]["same"]["multiplier_flops"]["median"] > 1
    rtd = result["contenders"]["rtd"]
    assert rtd["multiplier_flops"] is None and rtd["multiplier_seconds"] is None and "downstream" in rtd["note"]
    assert "n/a (other objective)" in table(result).splitlines()[-1]


def test_the_baselines_larger_budgets_make_the_frontier(tmp_path):
    """With the baseline trained again at 2x its budget (its own schedule), the multiplier is read off
    the final losses at 1x and 2x, not off the 1x run's unannealed middle; the curve's is kept beside."""
    from recipe_ablation import summarize, table

    runs = [fake(tmp_path, "base", "mlm", [7.0, 6.0, 5.0]),  # 1x: 3e4 FLOPs, final 5.0
            fake(tmp_path, "base", "mlm", [7.0, 6.5, 6.0, 5.5, 5.0, 4.0], times=2),  # 2x: 6e4 FLOPs, final 4.0
            fake(tmp_path, "cand", "mlm", [6.0, 5.0, 4.5])]  # 3e4 FLOPs, final 4.5
    result = summarize(tmp_path, runs, "base", extrapolate=False)
    cand = result["contenders"]["cand"]
    front = cand["multiplier_flops"]
    assert front["source"] == "frontier" and front["median"] == pytest.approx(2 ** 0.5)  # halfway in log FLOPs
    assert cand["multiplier_flops_curve"]["bounds"] == ["lower"]  # one curve: 4.5 is past the 1x run's end
    assert [f["val_loss"] for f in result["baseline_frontier"]["0"]] == [5.0, 4.0]
    assert "1.41x" in table(result).splitlines()[-1]


def test_each_budget_of_the_frontier_takes_its_best_lr(tmp_path):
    """The baseline at 2x its budget at two lrs: the frontier's 2x point is the lower of the two (and
    says which lr), so a candidate is judged against the baseline tuned at every budget, not only at 1x."""
    from recipe_ablation import summarize

    base = fake(tmp_path, "base", "mlm", [7.0, 6.0, 5.0])
    low = fake(tmp_path, "base", "mlm", [7.0, 6.5, 6.0, 5.5, 5.0, 4.0], times=2)
    high = fake(tmp_path, "base", "mlm", [7.0, 6.0, 5.0, 4.0, 3.5, 3.0], times=2, lr=2e-3)
    cand = fake(tmp_path, "cand", "mlm", [6.0, 5.0, 4.5])
    result = summarize(tmp_path, [base, low, cand], "base", extrapolate=False)
    assert result["contenders"]["cand"]["multiplier_flops"]["median"] == pytest.approx(2 ** 0.5)
    result = summarize(tmp_path, [base, low, high, cand], "base", extrapolate=False)
    points = result["baseline_frontier"]["0"]
    assert [(p["val_loss"], p["lr"]) for p in points] == [(5.0, 1e-3), (3.0, 2e-3)]
    assert result["contenders"]["cand"]["multiplier_flops"]["median"] == pytest.approx(2 ** 0.25)  # a quarter of the way


def test_a_baseline_without_a_sweep_trains_its_larger_budgets_in_the_first_phase(tmp_path, monkeypatch):
    """One baseline lr: its best lr is known before any run, so its runs at larger budgets (the
    longest) start beside the sweep instead of after it, where one core would wait; with several
    lrs they wait for the sweep's choice."""
    import recipe_ablation

    phases = []

    def first_phase(args, runs):
        phases.append(sorted(r["folder"].name for r in runs))
        raise SystemExit(0)

    monkeypatch.setattr(recipe_ablation, "run_all", first_phase)
    common = ["--recipe", "cpu-1h-mlm", "--flops", "1e12", "--seeds", "0", "--baseline-budgets", "2", "--out", str(tmp_path),
              "--baseline", "adamw", "train.optim.type=adamw", "--candidate", "muon", "--lrs-for", "muon", "8e-3"]
    for lrs in (["2e-3"], ["1e-3", "2e-3"]):
        with pytest.raises(SystemExit):
            recipe_ablation.main([*common, "--lrs", *lrs])
    assert phases[0] == ["adamw-lr0.002-s0", "adamw-lr0.002-s0-x2", "muon-lr0.008-s0"]
    assert phases[1] == ["adamw-lr0.001-s0", "adamw-lr0.002-s0", "muon-lr0.008-s0"]
    with pytest.raises(SystemExit):  # the larger budget at the best lr and at twice it
        recipe_ablation.main([*common, "--lrs", "2e-3", "--baseline-budget-lr-factors", "1", "2"])
    assert phases[2] == ["adamw-lr0.002-s0", "adamw-lr0.002-s0-x2", "adamw-lr0.004-s0-x2", "muon-lr0.008-s0"]


def test_a_stored_baseline_gives_the_same_multiplier_and_must_match(tmp_path):
    """--baseline-from: the baseline's runs and frontier come from a finished ablation's JSON, so only
    the candidates train; the multiplier is the one the baseline's own runs give, no wall-clock
    multiplier is claimed (the seconds were another session's), and a JSON of another recipe, size,
    budget, baseline or shared overrides is refused with an Error line."""
    import argparse
    import json

    from recipe_ablation import stored_baseline, summarize, table

    first = tmp_path / "first"
    first.mkdir()
    base = [fake(first, "base", "mlm", [7.0, 6.0, 5.0]), fake(first, "base", "mlm", [7.0, 6.5, 6.0, 5.5, 5.0, 4.0], times=2)]
    cand = fake(first, "cand", "mlm", [6.0, 5.0, 4.5])
    together = summarize(first, [*base, cand], "base", extrapolate=False)
    settings = {"recipe": "cpu-1h", "size": "128x4", "flops": 2e13, "clock": None, "overrides": [],
                "contenders": {"base": ["train.optim.type=adamw"], "cand": []}}
    saved = tmp_path / "ablation.json"
    saved.write_text(json.dumps({**summarize(first, base, "base", extrapolate=False), "settings": settings}, default=str))

    # stored as cpu-1h, the MLM recipe's name until 2026-12-02 (RENAMED): cpu-1h-mlm's baseline today
    args = argparse.Namespace(recipe="cpu-1h-mlm", size="128x4", flops=2e13, clock=None, baseline=["base"],
                              overrides=["impl.data_cache=elsewhere", "impl.threads=1", "train.checkpoint_every=25"],
                              contenders=settings["contenders"])
    stored = stored_baseline(saved, args)
    second = tmp_path / "second"
    second.mkdir()
    alone = summarize(second, [fake(second, "cand", "mlm", [6.0, 5.0, 4.5])], "base", extrapolate=False, stored=stored)
    assert alone["contenders"]["cand"]["multiplier_flops"]["median"] == pytest.approx(
        together["contenders"]["cand"]["multiplier_flops"]["median"]) == pytest.approx(2 ** 0.5)
    assert alone["contenders"]["cand"]["multiplier_seconds"] is None and alone["baseline_from"] == str(saved)
    assert "not side by side" in table(alone).splitlines()[-1]
    for change, needle in [({"recipe": "gpt2-cpu-1h"}, "recipe"), ({"size": "256x4"}, "size"), ({"flops": 4e13}, "flops"), ({"baseline": ["other"]}, "baseline"),
                           ({"contenders": {"base": ["train.optim.type=sgd"], "cand": []}}, "baseline overrides"),
                           ({"overrides": ["data.seq_length=64"]}, "shared overrides")]:
        with pytest.raises(SystemExit, match=f"^Error: --baseline-from .*{needle}"):
            stored_baseline(saved, argparse.Namespace(**{**vars(args), **change}))
    # the same override text may mean another model once the recipe's defaults change: what the stored
    # baseline trained (its resolved arch and train sections) must be what the same words resolve to now
    from recipe_ablation import trained

    now = trained(args, "base")
    assert now["train.optim.type"] == "adamw" and "train.optim.lr" not in now  # the swept lr is not part of it
    assert now["train.objective"] == "mlm"
    then = {**now, "arch.qk_norm": not now["arch.qk_norm"]}  # as if trained before the recipe took qk_norm
    rtd = {**now, "train.objective": "rtd"}  # today's cpu-1h: the same name, another objective
    for recorded, ok in [(now, True), (then, False), (rtd, False)]:
        saved.write_text(json.dumps({**summarize(first, base, "base", extrapolate=False),
                                     "settings": {**settings, "trained": {"base": recorded}}}, default=str))
        if ok:
            assert stored_baseline(saved, args)["trained"] == now
        else:
            with pytest.raises(SystemExit, match=r"^Error: --baseline-from .*trained another config.*(arch\.qk_norm|train\.objective)"):
                stored_baseline(saved, args)
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(SystemExit, match="^Error: --baseline-from .*broken.json: not a finished ablation"):
        stored_baseline(tmp_path / "broken.json", args)


def test_contender_steps_rates_and_the_wall_clock_multiplier(tmp_path):
    """benchmarks/contender_steps.py: each contender's real training step (its optimizer's FLOPs
    counted: Muon's Newton-Schulz), interleaved; the wall-clock multiplier is the compute multiplier
    times the candidate's rate over the baseline's, per seed, its bound kept."""
    import json

    from contender_steps import main

    ablation = tmp_path / "ablation.json"
    ablation.write_text(json.dumps({"contenders": {
        "adamw": {"multiplier_flops": None},
        "muon": {"multiplier_flops": {"median": 2.0, "bounds": ["lower"], "per_seed": {"0": {"multiplier": 2.0}, "1": {"multiplier": 3.0}}}}}}))
    small = ["data.tokenizer.vocab_size=512", "train.batch_size=8", "impl.microbatch_size=8", "data.seq_length=32", "arch.max_seq_length=32", "impl.precision=fp32"]
    r = main(["--recipe", "cpu-1h", "--size", "32x2", "--overrides", *small, "--steps", "2", "--warmup", "0",
              "--contender", "adamw", "train.optim.type=adamw", "--contender", "muon", "train.optim.type=muon",
              "--ablation", str(ablation), "--out", str(tmp_path / "steps.json")])
    adamw, muon = r["rows"]["adamw"], r["rows"]["muon"]
    assert adamw["optimizer_share_of_flops"] == 0 and 0 < muon["optimizer_share_of_flops"] < 1
    assert muon["counted_flops_per_step"] > adamw["counted_flops_per_step"] > 0  # same model and batch, + Newton-Schulz
    assert adamw["rate_vs_first"]["median"] == pytest.approx(1.0)
    wall = r["wall_clock_multiplier"]["muon"]
    rate = muon["rate_vs_first"]["median"]
    assert wall["bound"] == ">=" and wall["per_seed"] == pytest.approx({"0": 2.0 * rate, "1": 3.0 * rate})
    assert json.loads((tmp_path / "steps.json").read_text())["rows"].keys() == {"adamw", "muon"}


def test_committed_runs_read_by_name_and_each_budget_multiple_gets_its_row(tmp_path):
    """frontier_lr_check reads committed runs files by their names (size, budget multiple, lr,
    momentum, seed) and reads the recipe at each budget multiple on the tuned frontier."""
    import json

    import frontier_lr_check as flc

    run = {"steps": 10, "train_seconds": 1.0}
    (tmp_path / "frontier-a-runs.json").write_text(json.dumps({
        "128x4-x2-lr0.032": {**run, "flops": 4e13, "val_loss": 4.0},
        "128x4-x4-adamw": {**run, "flops": 8e13, "val_loss": 3.0, "lr": 0.016}}))
    (tmp_path / "screen-a-runs.json").write_text(json.dumps({
        "128x4-mom0.85": {**run, "flops": 2e13, "val_loss": 4.0},  # AdamW reaches 4.0 at 4e13: 2x
        "128x4-x2-mom0.85-s1": {**run, "flops": 4e13, "val_loss": 3.5},  # halfway from 4e13 to 8e13
        "128x4-mom0.85-lr0.008": {**run, "flops": 2e13, "val_loss": 9.0},  # an lr screen: not the recipe
        "999x1-mom0.85": {**run, "flops": 2e13, "val_loss": 1.0}}))  # not a size of the tables
    stored = flc.Stored(folder=tmp_path)
    adamw = {r["name"]: r for r in flc.stored_runs(stored, stored.frontier_runs)}
    assert adamw["128x4-x2-lr0.032"]["lr"] == 0.032 and adamw["128x4-x2-lr0.032"]["times"] == 2
    assert adamw["128x4-x4-adamw"]["lr"] == 0.016 and adamw["128x4-x4-adamw"]["seed"] == 0  # explicit field wins
    front = {"128x4": {"frontiers": {"best lr at each budget": {"points": [
        {"flops": 2e13, "val_loss": 5.0}, {"flops": 4e13, "val_loss": 4.0}, {"flops": 8e13, "val_loss": 3.0}]}}}}
    rows = flc.budget_rows([{"size": "128x4", **front["128x4"]}], stored)
    assert [(r["times"], list(r["per_seed"])) for r in rows] == [(1, [0]), (2, [1])]
    assert rows[0]["median"] == pytest.approx(2.0) and rows[1]["median"] == pytest.approx(2 ** 0.5)
    # a size with none of the recipe's own runs (512x8): its ablation's muon-full at momentum 0.85 is its 1x row
    other = {"size": "256x4", "recipe_1x": {"0": {"flops": 2e13, "val_loss": 4.5, "steps": 10, "lr": 0.008}}, **front["128x4"]}
    rows = flc.budget_rows([{"size": "128x4", **front["128x4"]}, other], stored)
    assert [(r["size"], r["times"], list(r["per_seed"])) for r in rows] == [("128x4", 1, [0]), ("128x4", 2, [1]), ("256x4", 1, [0])]
    assert rows[2]["median"] == pytest.approx(2 ** 0.5)  # 4.5: halfway from 5.0 at 2e13 to 4.0 at 4e13
    # the recipe's own run of that size at 2x stands beside its 1x row, not in place of it
    (tmp_path / "screen-b-runs.json").write_text(json.dumps({"256x4-x2-mom0.85-s0": {**run, "flops": 4e13, "val_loss": 3.5}}))
    stored = flc.Stored(folder=tmp_path, ablations={"128x4": [], "256x4": []})
    rows = flc.budget_rows([{"size": "128x4", **front["128x4"]}, other], stored)
    assert [(r["size"], r["times"]) for r in rows] == [("128x4", 1), ("128x4", 2), ("256x4", 1), ("256x4", 2)]
    assert rows[3]["median"] == pytest.approx(2 ** 0.5)  # 3.5 at 4e13: the frontier's 8e13 at 2 ** 0.5 x 4e13


def test_an_ablation_whose_candidate_trained_the_recipes_momentum_gives_its_size_a_1x_row(tmp_path):
    """A size without the recipe's own runs (512x8) stands at 1x by its ablation's muon-full at the
    sweep's best lr, only when that trained the recipe's momentum (0.85)."""
    import json

    import frontier_lr_check as flc

    final = {"flops": 2e13, "seconds": 1.0, "tokens": 100, "steps": 10}
    ab = {"contenders": {"adamw": {"best_lr": 0.002, "runs": {"0.002": {"0": {"final": {**final, "val_loss": 5.0}}}}},
                         "muon-full": {"best_lr": 0.008, "runs": {"0.008": {"0": {"final": {**final, "val_loss": 4.5}}}}}},
          "baseline_frontier": {"0": [{**final, "val_loss": 5.0}, {**final, "flops": 4e13, "val_loss": 4.0}]}}
    (tmp_path / "steps_mlm_256x4.json").write_text(json.dumps({"rows": {"muon-full": {"rate_vs_first": {"median": 1.0}}}}))
    rows = {}
    for momentum in (0.85, 0.95):
        ab["settings"] = {"trained": {"muon-full": {"train.optim.momentum": momentum}}}
        (tmp_path / "ab.json").write_text(json.dumps(ab))
        stored = flc.Stored(folder=tmp_path, ablations={"256x4": ["ab.json"]})
        rows[momentum] = flc.budget_rows([flc.check(stored, "256x4", [])], stored)
    assert [(r["size"], r["times"]) for r in rows[0.85]] == [("256x4", 1)] and rows[0.95] == []
    assert rows[0.85][0]["median"] == pytest.approx(2 ** 0.5) and rows[0.85][0]["per_seed"][0]["steps"] == 10


def test_the_default_files_give_the_committed_tables(capsys):
    """frontier_lr_check's defaults name the committed files its tables were read from: read again,
    they give frontier-lr-check.json's multipliers and budget-rows.json's rows; another folder is
    read where --dir names it (there, none of the files: an Error line naming the missing one)."""
    import json

    import frontier_lr_check as flc

    results = flc.main(["--budget-rows"])
    folder = flc.Stored().folder
    committed = json.loads((folder / "frontier-lr-check.json").read_text())
    assert [r["size"] for r in results[:3]] == [r["size"] for r in committed] == ["128x4", "256x4", "384x6"]
    for got, want in zip(results, committed):
        for name, front in want["frontiers"].items():
            assert got["frontiers"][name]["median"] == pytest.approx(front["median"])
    rows = json.loads((folder / "budget-rows.json").read_text())[-1]["budget_rows"]
    assert [(r["size"], r["times"], pytest.approx(r["median"])) for r in rows] == [
        (r["size"], r["times"], r["median"]) for r in results[-1]["budget_rows"]]
    with pytest.raises(SystemExit, match=r"^Error: .*results/128x4\.json: not found \(--dir, --ablation\)"):
        flc.main(["--dir", str(folder.parent), "--sizes", "128x4"])
