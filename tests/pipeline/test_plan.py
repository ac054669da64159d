"""`cramlm plan`: the choice from a synthetic throughput table (no timing), the batch rule, the law
file, and the command line."""

from __future__ import annotations

import json
import math

import pytest
import yaml
from click.testing import CliRunner

from cramlm.cli import main
from cramlm.pipeline.plan import Candidate, batch_for, load_law, plan, rank
from cramlm.pipeline.recipe import resolve_recipe
from cramlm.pipeline.scaling import chinchilla_law

LAW = {"E": 2.0, "A": 400.0, "a": 0.45, "B": 2000.0, "b": 0.45, "r2": 0.99}
# a machine where bigger shapes are slower, as they are
THROUGHPUT = {"64x2": 40000.0, "128x4": 9000.0, "256x4": 3000.0, "384x6": 900.0}


@pytest.fixture
def law_file(tmp_path):
    path = tmp_path / "law.yaml"
    path.write_text(yaml.safe_dump({"law": LAW, "command": "cramlm sweep ...", "data": {"vocab_size": 8192},
                                    "points": [{"non_embedding_parameters": 1e5, "tokens": 5e5},
                                               {"non_embedding_parameters": 2e6, "tokens": 1e8}]}))
    return path


def test_plan_picks_the_lowest_predicted_loss_for_the_budget(law_file):
    lines = []
    minute = plan(resolve_recipe("default", ["budget=1m"]), "default", law_path=str(law_file), throughput=THROUGHPUT, say=lines.append)
    hour = plan(resolve_recipe("default", ["budget=1h"]), "default", law_path=str(law_file), throughput=THROUGHPUT, say=lambda *_: None)
    by_size = {c["size"]: c for c in hour["candidates"]}
    for result in (minute, hour):
        losses = {c["size"]: c["predicted_loss"] for c in result["candidates"]}
        assert result["choice"]["size"] == min(losses, key=losses.get)
        c = {x["size"]: x for x in result["candidates"]}[result["choice"]["size"]]
        assert c["predicted_loss"] == pytest.approx(float(chinchilla_law(LAW, c["non_embedding"], c["tokens"])))
    assert by_size["128x4"]["tokens"] == pytest.approx(9000.0 * 3600)
    # a longer budget buys a larger model
    order = list(THROUGHPUT)
    assert order.index(hour["choice"]["size"]) > order.index(minute["choice"]["size"])
    text = "\n".join(lines)
    assert all(size in text for size in THROUGHPUT) and "<- chosen" in text and "lowest predicted" in text
    assert minute["command"].startswith("cramlm run default budget=1m ")  # as written, not 0.0166667
    # the batch line says the steps it gives, and a floor that misses the target as a shortfall (issue 22.7)
    batch_line = next(line for line in minute["why"] if line.startswith("batch "))
    steps = int(batch_line.split(" optimizer steps")[0].split()[-1].replace(",", "").strip("("))
    if minute["choice"]["batch_size"] == 32 and steps < 1000:
        assert "the smallest the planner picks" in batch_line and "fewer than the 1,000" in batch_line
    else:
        assert "at least 1,000 optimizer steps" in batch_line and steps >= 1000
    assert f"arch.hidden_size={minute['hidden']}" in minute["command"] and "train.mlm_probability=0.25" in minute["command"]


def test_extrapolated_shapes_are_flagged_and_not_chosen_while_others_remain():
    law = {**LAW, "ranges": {"N": (1e5, 1e6), "D": (1e6, 1e7)}}
    ranked = rank([Candidate("a", 0, 2e5, 1000.0), Candidate("b", 0, 5e7, 1000.0)], law, 3600)
    flagged = {c.size: c.extrapolated for c in ranked}
    assert flagged == {"a": False, "b": True}  # 5e7 parameters is 50x the largest fitted


def test_batch_reason_names_the_steps_and_a_shortfall():
    from cramlm.pipeline.plan import batch_reason

    assert batch_reason(32, 251.4) == ("batch 32 sequences, the smallest the planner picks: 251 optimizer steps, "
                                       "fewer than the 1,000 it aims for")
    assert batch_reason(256, 1342.0) == "batch 256 sequences: the largest power of two giving at least 1,000 optimizer steps (1,342)"


def test_batch_rule():
    assert batch_for(44e6, 128) == 256  # an hour at 12k tokens/s: ~1,300 steps of 256 sequences
    assert batch_for(1e6, 128) == 32  # a short budget: the floor
    assert batch_for(1e12, 128) == 8192  # cramming's batch is the ceiling
    assert batch_for(44e6, 128, min_updates=5000) == 64


def test_law_from_a_sweep_json_and_clear_errors(tmp_path):
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps({"fit_nd": LAW, "points": [{"non_embedding_parameters": 1e5, "tokens": 1e6, "loss": 5.0}]}))
    law = load_law(sweep)
    assert law["E"] == 2.0 and law["ranges"] == {"N": (1e5, 1e5), "D": (1e6, 1e6)}
    sweep.write_text(json.dumps({"fit": {"E": 1.0}, "points": []}))
    with pytest.raises(ValueError, match="no fitted L\\(N, D\\)"):
        load_law(sweep)


def test_shipped_law_names_its_command_and_fits_its_points():
    law = load_law()
    assert law["command"].startswith("cramlm sweep") and law["E"] >= 0 and 0 < law["a"] < 3 and 0 < law["b"] < 3
    assert law["ranges"]["N"][0] < law["ranges"]["N"][1] and law["ranges"]["D"][0] < law["ranges"]["D"][1]


def test_plan_command(law_file, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    ok = runner.invoke(main, ["plan", "default", "budget=15m", "--law", str(law_file),
                              "--throughput", "64x2=40000,128x4=9000,256x4=3000"])
    assert ok.exit_code == 0, ok.output
    assert "run it: cramlm run default budget=15m " in ok.output and "tokens/s" in ok.output
    bad = runner.invoke(main, ["plan", "default", "budget=15m", "--throughput", "64x2:fast"])
    assert bad.exit_code == 1 and bad.output.startswith("Error:") and "--throughput" in bad.output
    missing = runner.invoke(main, ["plan", "default", "budget=15m", "--law", str(law_file), "--sizes", "64x2,96x3",
                                   "--throughput", "64x2=40000"])
    assert missing.exit_code == 1 and "no throughput given for shape 96x3" in missing.output


def test_measure_throughput_runs_real_training_steps():
    """The measuring path (a few Trainer steps on random tokens) is exercised, not only the synthetic table."""
    from cramlm.pipeline.plan import measure_throughput

    cfg = resolve_recipe("default", ["impl.precision=fp32", "data.seq_length=32", "data.tokenizer.vocab_size=512"])
    arch = {**cfg.arch.model_dump(mode="json"), "hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}
    tokens_per_second = measure_throughput(cfg, arch, 512, batch=2, micro=2, warmup=1, steps=1)
    assert tokens_per_second > 0


def test_measure_throughput_times_the_runs_step(monkeypatch):
    """The probe times steps of the smallest batch the planner picks in the run's microbatches, after
    warm-up steps: at a half batch a step's fixed costs (Muon's) weigh twice, and the first steps are
    slow (the grid of 2026-12-02: 128x4 probed at 6,205 tokens/s, trained at 11,281)."""
    from cramlm.pipeline.plan import BATCH_RANGE, measure_throughput
    from cramlm.train.trainer import Trainer

    calls = []
    real = Trainer.train_step
    monkeypatch.setattr(Trainer, "train_step", lambda self, n: calls.append((self.cfg.batch_size, self.impl.microbatch_size, n)) or real(self, n))
    cfg = resolve_recipe("default", ["impl.precision=fp32", "data.seq_length=16", "data.tokenizer.vocab_size=512",
                                     "impl.microbatch_size=8"])
    arch = {**cfg.arch.model_dump(mode="json"), "hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}
    assert measure_throughput(cfg, arch, 512) > 0
    assert len(calls) >= 6 and set(calls) == {(BATCH_RANGE[0], 8, BATCH_RANGE[0] // 8)}


def test_measure_throughput_trains_what_the_run_trains(monkeypatch):
    """An RTD recipe's probe steps its generator and detector with the sampling noise in the batch
    (the MLM encoder alone would overstate its tokens/s); an MLM recipe's, the encoder alone."""
    import cramlm.train.build as build
    from cramlm.models.objectives.rtd import ReplacedTokenDetection
    from cramlm.pipeline.plan import measure_throughput

    seen = []
    real = build.build_trainer
    monkeypatch.setattr(build, "build_trainer", lambda model, data, *a, **k: seen.append((model, k["sample"])) or real(model, data, *a, **k))
    small = ["impl.precision=fp32", "data.seq_length=32", "data.tokenizer.vocab_size=512"]
    for objective in ("mlm", "rtd"):
        cfg = resolve_recipe("default", [*small, f"train.objective={objective}"])
        arch = {**cfg.arch.model_dump(mode="json"), "hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}
        assert measure_throughput(cfg, arch, 512, batch=2, micro=2, warmup=1, steps=1) > 0
    (mlm, mlm_batch), (rtd, rtd_batch) = seen
    assert not isinstance(mlm, ReplacedTokenDetection) and "sample_noise" not in mlm_batch
    assert isinstance(rtd, ReplacedTokenDetection) and "sample_noise" in rtd_batch


def test_arch_auto_in_a_run_takes_the_plan_and_reuses_it(law_file, tmp_path):
    from cramlm.pipeline.recipe import AUTO_ARCH

    overrides = [f"base_dir={tmp_path}", "budget=15m", "arch=auto"]
    said: list[str] = []
    # without planning (as `cramlm plan` resolves it): the planner's starting shape
    assert resolve_recipe("default", overrides).arch.hidden_size == resolve_recipe("default", [f"arch={AUTO_ARCH}"]).arch.hidden_size
    planned = resolve_recipe("default", overrides, {"throughput": THROUGHPUT, "law_path": str(law_file), "say": said.append})
    expected = plan(resolve_recipe("default", overrides), "default", law_path=str(law_file), throughput=THROUGHPUT, say=lambda _: None)
    hidden, layers = expected["hidden"], expected["layers"]
    assert (planned.arch.hidden_size, planned.arch.num_layers) == (hidden, layers)
    assert planned.train.batch_size == expected["choice"]["batch_size"]
    record = json.loads((planned.run_dir / "plan.json").read_text())
    assert record["choice"]["size"] == f"{hidden}x{layers}" and "<- chosen" in "\n".join(said)
    # a re-run reuses the recorded plan even where a new measurement would choose otherwise
    said.clear()
    again = resolve_recipe("default", overrides, {"throughput": {"64x2": 1e9, "128x4": 1.0, "256x4": 1.0, "384x6": 1.0},
                                                  "law_path": str(law_file), "say": said.append})
    assert again.arch.hidden_size == hidden and "the plan in" in said[0]
    # explicit overrides win over the plan
    assert resolve_recipe("default", [*overrides, "arch.num_layers=1"], {"throughput": THROUGHPUT, "law_path": str(law_file),
                                                                          "say": said.append}).arch.num_layers == 1
    with pytest.raises(ValueError, match="budget"):
        resolve_recipe("default", [f"base_dir={tmp_path}", "budget=null", "arch=auto", "name=x"], {"throughput": THROUGHPUT})


def test_a_recorded_plan_keeps_its_shape_and_takes_the_configs_lr(law_file, tmp_path, monkeypatch):
    """A plan records a shape: a resume that changes the lr (--allow-change train.optim.lr) reuses
    it, under torchrun too (where nothing may be measured), with the lr the planner gives now, never
    the recorded one; a plan recorded under an earlier form of the key (before the optimizer type and
    objective were in it, or with the lr in it) is reused as well."""
    from cramlm.config.loader import ConfigError
    from cramlm.pipeline.recipe import PLAN, plan_keys

    law = json.loads(json.dumps(load_law(str(law_file))))
    law_lr = law["data"]["lr"] if law.get("data", {}).get("optimizer", "adamw") == resolve_recipe("default", []).train.optim.type else None
    overrides = [f"base_dir={tmp_path}", "budget=15m", "arch=auto", "name=planned"]
    args = {"throughput": THROUGHPUT, "law_path": str(law_file), "say": lambda *_: None}
    first = resolve_recipe("default", overrides, args)
    path = first.run_dir / PLAN
    record = json.loads(path.read_text())
    monkeypatch.setenv("WORLD_SIZE", "2")  # a torchrun process: it never measures, it reuses or refuses
    moved = resolve_recipe("default", [*overrides, "train.optim.lr=3e-3"], args)
    assert (moved.arch.hidden_size, moved.arch.num_layers) == (first.arch.hidden_size, first.arch.num_layers)
    assert moved.train.optim.lr == 3e-3  # the user's lr, applied after the plan's overrides
    # the lr the plan hands on is the planner's for this config, whatever the record says
    path.write_text(json.dumps({**record, "overrides": [o for o in record["overrides"] if not o.startswith("train.optim.lr=")]
                                + ["train.optim.lr=0.5"]}))
    again = resolve_recipe("default", overrides, args)
    assert again.train.optim.lr == (law_lr if law_lr is not None else first.train.optim.lr) != 0.5
    unplanned = resolve_recipe("default", overrides)  # as the key sees it: the planner's starting shape
    assert record["key"] == plan_keys(unplanned, str(law_file))[0]
    for old_key in plan_keys(unplanned, str(law_file))[1:]:  # keys of plans recorded before
        path.write_text(json.dumps({**record, "key": old_key}))
        assert resolve_recipe("default", overrides, args).arch.hidden_size == first.arch.hidden_size
    path.write_text(json.dumps({**record, "key": "0" * 12}))  # another config's plan: refused under torchrun
    with pytest.raises(ConfigError, match="plan once first"):
        resolve_recipe("default", overrides, args)


def test_overwrite_keeps_the_plan_it_was_resolved_with(tmp_path):
    """overwrite=true empties the run folder before the run; the plan.json made (or reused) for this
    very config while it was resolved stays, so the run is not measured into another shape later."""
    from cramlm.pipeline.recipe import PLAN, claim_folder

    run = tmp_path / "default"
    run.mkdir()
    for name, text in (("pipeline.json", json.dumps({"name": "default", "recipe": "default", "stages": {}})),
                       ("config.yaml", "old"), ("metrics.jsonl", "{}\n"), (PLAN, '{"choice": {"size": "128x4"}}')):
        (run / name).write_text(text)
    claim_folder(resolve_recipe("default", [f"base_dir={tmp_path}", "overwrite=true"]), "default")
    assert sorted(p.name for p in run.iterdir() if not p.name.startswith(".")) == [PLAN]  # was: deleted with the rest


def test_arch_auto_never_measures_when_it_must_not(law_file, tmp_path, monkeypatch):
    import cramlm.pipeline.plan as plan_module
    from cramlm.config.loader import ConfigError
    from cramlm.pipeline.recipe import AUTO_ARCH

    def no_measuring(*args, **kwargs):
        raise AssertionError("measured")

    monkeypatch.setattr(plan_module, "measure_throughput", no_measuring)
    base = resolve_recipe("default", [f"arch={AUTO_ARCH}"]).arch.hidden_size
    said: list[str] = []
    args = {"law_path": str(law_file), "say": said.append}
    overrides = [f"base_dir={tmp_path}", "budget=15m", "+arch=auto"]
    # --show and a dry run: the starting shape, said so
    assert resolve_recipe("default", overrides, {**args, "reuse_only": True}).arch.hidden_size == base
    assert resolve_recipe("default", [*overrides, "dryrun=true"], args).arch.hidden_size == base
    assert "no plan recorded" in said[-1] and not (tmp_path / "default" / "plan.json").exists()
    # under torchrun with no recorded plan: one clear error, not N processes measuring at once
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="arch=auto under torchrun: plan once first"):
        resolve_recipe("default", overrides, args)


def test_predictions_within_the_laws_error_go_to_the_shape_nearest_the_fitted_runs():
    from cramlm.pipeline.plan import choose

    law = {**LAW, "ranges": {"N": (1e5, 1e6), "D": (1e6, 1e7)}, "residual": 0.02}
    inside = Candidate("128x4", 0, 8e5, 0.0, tokens=5e6, predicted_loss=4.05)  # N and D inside the fitted runs
    outside = Candidate("256x6", 0, 3e6, 0.0, tokens=3e6, predicted_loss=4.00, outside=math.log(3))  # N 3x beyond
    far = Candidate("64x2", 0, 1e5, 0.0, tokens=9e6, predicted_loss=4.20)  # 5% worse: not tied
    chosen, tied = choose([outside, inside, far], law)
    assert chosen is inside and tied == [outside, inside]
    # a law that knows no error of its own: the lowest prediction, as before
    assert choose([outside, inside, far], {**law, "residual": None})[0] is outside


def test_lr_comes_from_the_law_only_for_the_optimizer_it_was_fitted_with(tmp_path):
    """A law fitted with Muon at lr 1.6e-2 gives that lr to a Muon recipe; an AdamW recipe keeps its
    own lr (an lr does not carry across optimizers), and a law with no optimizer is bert-o4's AdamW."""
    def law(data):
        path = tmp_path / f"law-{len(list(tmp_path.iterdir()))}.yaml"
        path.write_text(yaml.safe_dump({"law": LAW, "data": {"vocab_size": 8192, **data}}))
        return str(path)

    muon_law = law({"optimizer": "muon", "lr": 0.016, "mlm_probability": 0.3})
    quiet = {"throughput": THROUGHPUT, "say": lambda *_: None}
    muon = plan(resolve_recipe("cpu-1h-mlm", ["budget=15m"]), "cpu-1h-mlm", law_path=muon_law, **quiet)
    assert muon["choice"]["optimizer"] == "muon" and muon["choice"]["lr"] == 0.016
    assert "train.optim.lr=0.016" in muon["command"] and "train.mlm_probability=0.3" in muon["command"]
    assert not any(line.startswith("note: the law was fitted") for line in muon["why"])

    adamw_cfg = resolve_recipe("crammed-bert-24h", ["budget=15m"])
    assert adamw_cfg.train.optim.type == "adamw"
    adamw = plan(adamw_cfg, "crammed-bert-24h", law_path=muon_law, **quiet)
    assert adamw["choice"]["lr"] == adamw_cfg.train.optim.lr != 0.016
    assert f"train.optim.lr={adamw_cfg.train.optim.lr:g}" in adamw["command"]
    assert any("fitted with train.optim.type=muon" in line for line in adamw["why"])

    old_law = law({})  # the shipped law's form before it recorded an optimizer: bert-o4's AdamW at 1e-3
    old = plan(adamw_cfg, "crammed-bert-24h", law_path=old_law, **quiet)
    assert old["choice"]["lr"] == 0.001 and "train.optim.lr=0.001" in old["command"]
    on_muon = plan(resolve_recipe("cpu-1h-mlm", ["budget=15m"]), "cpu-1h-mlm", law_path=old_law, **quiet)
    assert on_muon["choice"]["lr"] == 0.016  # cpu-1h's own Muon lr, not AdamW's 1e-3


def test_the_shipped_law_follows_the_recipes_optimizer():
    """Each optimizer has its own shipped law (fitted with it, its lr in its data block): a Muon
    recipe is planned with the Muon law at its lr, an AdamW recipe with the AdamW law at 1e-3, and
    the plan key tells them apart (a recorded plan is not reused once the optimizer changes)."""
    from cramlm.pipeline.recipe import plan_key

    muon_law, adamw_law = load_law(optimizer="muon"), load_law(optimizer="adamw")
    assert muon_law["source"].endswith("/scaling-cpu.yaml") and adamw_law["source"].endswith("/scaling-cpu-adamw.yaml")
    assert load_law()["source"] == muon_law["source"]  # the base law: also for an optimizer without one of its own
    for law, optimizer, lr in [(muon_law, "muon", 0.016), (adamw_law, "adamw", 0.001)]:
        assert law["data"]["optimizer"] == optimizer and law["data"]["lr"] == lr and law["command"].startswith("cramlm sweep")
        assert len({(p[0], p[1]) for p in [law["ranges"]["N"], law["ranges"]["D"]]}) == 2 and law["residual"] > 0
    quiet = {"throughput": THROUGHPUT, "say": lambda *_: None}
    muon = resolve_recipe("cpu-1h-mlm", ["budget=15m"])
    adamw = resolve_recipe("cpu-1h-mlm", ["budget=15m", "train.optim.type=adamw"])
    planned = {name: plan(cfg, "cpu-1h-mlm", **quiet) for name, cfg in [("muon", muon), ("adamw", adamw)]}
    assert planned["muon"]["law"]["source"] == muon_law["source"] and planned["muon"]["choice"]["lr"] == 0.016
    assert planned["adamw"]["law"]["source"] == adamw_law["source"] and planned["adamw"]["choice"]["lr"] == 0.001
    assert not any(line.startswith("note: the law was fitted") for p in planned.values() for line in p["why"])
    assert plan_key(muon) != plan_key(adamw) and plan_key(muon) == plan_key(resolve_recipe("cpu-1h-mlm", ["budget=15m", "name=other"]))
    # an optimizer without a law of its own or another objective (a step of another cost): planned again;
    # another lr is the same plan (its lr is written again from the config: test_a_recorded_plan_...)
    others = [resolve_recipe("cpu-1h-mlm", ["budget=15m", *extra]) for extra in (["train.optim.type=lion"], ["train.objective=hybrid"])]
    assert len({plan_key(muon), *map(plan_key, others)}) == 3
    assert plan_key(resolve_recipe("cpu-1h-mlm", ["budget=15m", "train.optim.lr=8e-3"])) == plan_key(muon)
    # cpu-1h trains ELECTRA's objective: planned with the MLM law as a proxy, and the plan says so
    rtd = plan(resolve_recipe("cpu-1h", ["budget=15m"]), "cpu-1h", **quiet)
    assert rtd["law"]["source"] == muon_law["source"] and muon_law["data"]["objective"] == "mlm"
    assert [line for line in rtd["why"] if line.startswith("note:")] == [next(
        line for line in rtd["why"] if "fitted on mlm runs" in line and "train.objective=rtd" in line)]


def test_lower_extrapolated_predictions_are_named_as_passed_over_not_as_runners_up():
    """With Muon's law, tiny shapes with many tokens are predicted lowest but lie outside the fitted
    runs: the reason names them as extrapolated and measures the pick against the next shape inside."""
    fast = {"64x2": 50496.0, "96x3": 26380.0, "128x4": 14577.0, "192x4": 9964.0, "256x4": 6280.0, "384x6": 2146.0}
    result = plan(resolve_recipe("cpu-1h-mlm", ["budget=15m"]), "cpu-1h-mlm", throughput=fast, say=lambda *_: None)
    ranked = result["candidates"]
    chosen = next(c for c in ranked if c["size"] == result["choice"]["size"])
    passed = [c for c in ranked if c["extrapolated"] and c["predicted_loss"] < chosen["predicted_loss"]]
    assert passed and not chosen["extrapolated"]
    line = next(w for w in result["why"] if "lowest predicted" in w)
    assert "inside the fitted range" in line and all(f"{c['size']} {c['predicted_loss']:.3f}" in line for c in passed)
    inside = [c for c in ranked if c is not chosen and c not in passed]
    assert f"below {inside[0]['size']}" in line and "-" not in line.split("below")[0].split(",")[-1]
