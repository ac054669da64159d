"""`cramlm run`: the default recipe end to end offline, and stages that resume."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from click.testing import CliRunner
from safetensors.torch import load_file

from cramlm.cli import main
from cramlm.config.loader import ConfigError
from cramlm.pipeline.recipe import read_record, resolve_recipe, selected, stage_keys, stages_to_run

from .conftest import TINY_RUN, cramlm


def test_default_recipe_end_to_end(tiny_run):
    # the checkpoint, the eval table and the report, each stage recorded as done
    assert load_file(tiny_run / "model.safetensors")
    results = json.loads((tiny_run / "eval.json").read_text())["results"]
    assert [r["task"] for r in results] == ["rotten_tomatoes_small"]
    assert 0.0 <= results[0]["score"] <= 1.0
    record = json.loads((tiny_run / "pipeline.json").read_text())
    assert {s: v["status"] for s, v in record["stages"].items()} == dict.fromkeys(
        ["data", "pretrain", "eval", "eval-untrained", "report"], "done")
    # the untrained twin: same tasks and evaluation, random weights, in its own file
    twin = json.loads((tiny_run / "eval-untrained.json").read_text())
    assert twin["untrained"] is True and twin["checkpoint"] == "default-untrained"
    assert [r["task"] for r in twin["results"]] == ["rotten_tomatoes_small"]
    assert twin["config"]["eval"] == json.loads((tiny_run / "eval.json").read_text())["config"]["eval"]
    html = (tiny_run / "report.html").read_text()
    assert "rotten_tomatoes_small" in html and html.count('data-plot="') == 6
    assert "<th>untrained twin</th><th>margin</th>" in html
    assert "<td>paradigms off chance (above / below)</td>" in html  # the zero-shot table: passed and failed, not only the mean
    assert re.search(r"<td>report</td><td>done</td>", html)  # the page is the report stage's output: done
    for name in ("loss_vs_tokens", "loss_vs_time", "bpb", "schedule", "throughput", "eval"):
        assert (tiny_run / "plots" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _mtimes(run):
    return {p.name: p.stat().st_mtime_ns for p in run.iterdir() if p.is_file()}


def test_rerun_skips_finished_stages_and_redoes_changed_ones(tiny_run, tmp_path):
    root = tmp_path
    shutil.copytree(tiny_run.parents[1], root, dirs_exist_ok=True)  # a private copy of the finished run
    run = root / "outputs" / "default"
    before = _mtimes(run)
    out = cramlm("run", *TINY_RUN, cwd=root)
    assert out.count("done already, skipped") == 5
    assert _mtimes(run) == before  # nothing rewritten
    # the closing summary: pretrained against the untrained twin, per task, with the margin
    table = out[out.index("dev scores (%), pretrained against the untrained twin"):]
    assert table.splitlines()[1].split() == ["task", "metric", "pretrained", "untrained", "margin", "majority"]
    assert table.splitlines()[2].split()[:2] == ["rotten_tomatoes_small", "accuracy"]
    # the demo's zero-shot pairs from the chapters it never reads, beside the twin; the verdict last
    assert "minimal pairs: 48 pairs, 3 paradigms" in table and table.count("untrained twin") >= 2, table
    assert re.search(r"^adjacent_words_swapped +[0-9.]+ +[0-9.]+ +[0-9.]+$", table, re.M), table
    verdict = [line for line in table.splitlines() if line.startswith(("zero-shot, pretraining ", "fine-tuned, pretraining "))]
    assert len(verdict) == 1 and re.search(r"ero-shot, pretraining (paid|did not pay \(yet\)): .* on [0-3] of 3 paradigm", verdict[0])
    assert re.search(r"ine-tuned, pretraining (paid|did not pay \(yet\)): ahead of the untrained twin", verdict[0]), verdict[0]
    assert table.index("minimal pairs:") < table.index(verdict[0])

    # a changed evaluation setting redoes eval and the report, not the data or the training
    out = cramlm("run", *TINY_RUN, "eval.seed=1", cwd=root)
    assert "data: done already" in out and "pretrain: done already" in out
    after = _mtimes(run)
    assert after["model.safetensors"] == before["model.safetensors"]
    assert after["eval.json"] != before["eval.json"] and after["report.html"] != before["report.html"]

    # force=[report] redoes only the report; a lost output file makes its stage run again
    out = cramlm("run", *TINY_RUN, "eval.seed=1", "force=[report]", cwd=root)
    assert out.count("done already, skipped") == 4
    (run / "report.html").unlink()
    out = cramlm("run", *TINY_RUN, "eval.seed=1", cwd=root)
    assert "eval: done already" in out and "report ..." in out and (run / "report.html").is_file()

    # the data cache moved: the data stage prepares it there (the same bytes), nothing after it is redone
    # (was: the training and both evaluations again)
    out = cramlm("run", *TINY_RUN, "eval.seed=1", "impl.data_cache=moved-cache", cwd=root)
    assert "data ..." in out and out.count("done already, skipped") == 4, out  # pretrain, eval, the twin, the report
    assert (root / "moved-cache").is_dir() and _mtimes(run)["model.safetensors"] == before["model.safetensors"]


def test_untrained_twin_is_reused_when_only_the_training_changes(tiny_run, tmp_path, monkeypatch):
    """The twin does not depend on the training: a re-trained run keeps eval-untrained.json while
    the architecture, data and evaluation are unchanged; a changed evaluation redoes it."""
    shutil.copytree(tiny_run.parents[1], tmp_path, dirs_exist_ok=True)
    run = tmp_path / "outputs" / "default"
    before = _mtimes(run)
    out = cramlm("run", *TINY_RUN, "train.optim.lr=2e-3", cwd=tmp_path)
    assert "pretrain ..." in out and "eval ..." in out and "eval-untrained: done already" in out and "report ..." in out
    # said, with what changed (was: trained again without a word)
    assert re.search(r"pretrain: made before under another configuration \(train\.optim\.lr 0\.0\d+ -> 0\.002\): made again", out), out
    after = _mtimes(run)
    assert after["model.safetensors"] != before["model.safetensors"]
    assert after["eval-untrained.json"] == before["eval-untrained.json"]
    monkeypatch.chdir(tmp_path)  # run_dir is relative: outputs/default
    cfg = resolve_recipe("default", [*TINY_RUN, "train.optim.lr=2e-3", "eval.epochs=2"])
    assert stages_to_run(cfg, read_record(run)) == ["eval", "eval-untrained", "report"]


def test_results_of_an_earlier_configuration_are_set_aside_not_reported(tiny_run, tmp_path, monkeypatch):
    """A re-trained run whose evaluation this run does not redo (not in stages; the twin switched
    off): eval.json and eval-untrained.json are the old model's and the old protocol's, so they are
    renamed *.stale.* and the report and console leave them out (was: shown as this run's)."""
    shutil.copytree(tiny_run.parents[1], tmp_path, dirs_exist_ok=True)
    run = tmp_path / "outputs" / "default"
    old_eval = (run / "eval.json").read_text()
    out = cramlm("run", *TINY_RUN, "train.optim.lr=2e-3", "eval.epochs=2", "untrained_twin=false", "stages=[data,pretrain,report]",
                 cwd=tmp_path)  # (the twin's results stand while its own key holds: eval.epochs changes it)
    assert "renamed eval.stale.*" in out and "renamed eval-untrained.stale.*" in out, out
    assert not (run / "eval.json").exists() and (run / "eval.stale.json").read_text() == old_eval
    assert not (run / "eval-untrained.json").exists() and (run / "eval-untrained.stale.json").is_file()
    record = read_record(run)
    assert record["stages"]["eval"]["status"] == "stale" and record["stages"]["pretrain"]["status"] == "done"
    out = cramlm("run", *TINY_RUN, "train.optim.lr=2e-3", cwd=tmp_path)  # evaluating again: it runs, as it must
    assert "eval ..." in out and (run / "eval.json").is_file()
    # the twin's results are this configuration's again (the protocol as before): restored, not recomputed
    assert "eval-untrained.stale.* are this configuration's again: restored" in out and "eval-untrained: done already" in out
    assert (run / "eval-untrained.json").is_file() and not (run / "eval-untrained.stale.json").exists()


def test_stages_recorded_under_their_legacy_keys_are_found_again(tiny_run, tmp_path, monkeypatch):
    """A run folder whose stages were recorded before resume, allow_change and the collective
    timeout left the stage keys (a run requeued with --resume auto): its finished stages are found
    again, not trained or evaluated again, and its results are not set aside as stale."""
    from cramlm.pipeline.recipe import TWIN, migrate_keys, reconcile_results

    shutil.copytree(tiny_run.parents[1], tmp_path, dirs_exist_ok=True)
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "outputs" / "default"
    cfg = resolve_recipe("default", [*TINY_RUN, "resume=auto", "impl.dist_timeout=99"])
    keys, legacy = stage_keys(cfg), stage_keys(cfg, 0)
    assert keys == stage_keys(resolve_recipe("default", TINY_RUN)) and legacy["pretrain"] != keys["pretrain"]
    record = read_record(run)
    for stage, entry in record["stages"].items():
        entry["key"] = legacy[stage]  # as the code before recorded them for this config
    assert stages_to_run(cfg, json.loads(json.dumps(record)))[:1] == ["pretrain"]  # (unmigrated: all again)
    assert migrate_keys(cfg, record, keys) and stages_to_run(cfg, record) == []
    report_only = resolve_recipe("default", [*TINY_RUN, "resume=auto", "impl.dist_timeout=99", "stages=[report]"])
    assert not reconcile_results(report_only, record, keys) and (run / "eval.json").is_file()
    other = {**record, "stages": {s: {**e, "key": "0" * 12} for s, e in record["stages"].items()}}
    assert not migrate_keys(cfg, other, keys)  # another config's keys stay another config's
    # the next form (resume and the sinks out, the speed settings in): a run recorded with the README's
    # impl.threads=1 is found by a plain re-run (threads auto), its thread count read from config.yaml
    plain = resolve_recipe("default", [o for o in TINY_RUN if o != "impl.threads=1"])
    assert (run / "config.yaml").read_text().count("threads: 1") == 1
    second = {"stages": {s: {**e, "key": stage_keys(cfg, 1)[s]} for s, e in read_record(run)["stages"].items()}}
    assert stage_keys(cfg, 1)["pretrain"] != stage_keys(plain, 1)["pretrain"]  # (the thread count was in that form)
    assert migrate_keys(plain, second, stage_keys(plain)) and stages_to_run(plain, second) == []
    # a legacy twin key holds no objective: ELECTRA's config takes the twin only with its own trained model
    rtd = resolve_recipe("default", [*TINY_RUN, "resume=auto", "impl.dist_timeout=99", "train.objective=rtd"])
    assert stage_keys(rtd, 0)[TWIN] == legacy[TWIN] and cfg.train.objective != "rtd"
    theirs = {"stages": {s: {**e, "key": legacy[s]} for s, e in read_record(run)["stages"].items()}}
    assert not migrate_keys(rtd, theirs, stage_keys(rtd)) and theirs["stages"][TWIN]["key"] == legacy[TWIN]


def test_an_evaluation_written_over_by_cramlm_eval_is_made_again(tiny_run, tmp_path):
    """`cramlm eval` into a pipeline's run folder writes eval.json under its own protocol (the eval
    preset's, without the recipe's minimal pairs): the next `cramlm run` does not take it for the
    eval stage's result (was: "done already", the report showing the other protocol's scores)."""
    shutil.copytree(tiny_run.parents[1], tmp_path, dirs_exist_ok=True)
    run = tmp_path / "outputs" / "default"
    cramlm("run", *TINY_RUN, "force=[eval]", cwd=tmp_path)  # the eval stage made again: its result digested
    assert set(read_record(run)["stages"]["eval"]["outputs"]) == {"eval.json"}
    ours = (run / "eval.json").read_text()
    cramlm("eval", "checkpoint=default", "impl.progress=false", "impl.threads=1", "eval.epochs=1", "eval.max_train_examples=16",
           "eval.max_seq_length=32", cwd=tmp_path)
    assert (run / "eval.json").read_text() != ours
    out = cramlm("run", *TINY_RUN, cwd=tmp_path)
    assert "eval: eval.json written over since this stage made it" in out and "eval ..." in out, out
    assert "pretrain: done already" in out and "minimal_pairs" in (run / "eval.json").read_text()
    (run / "eval.json").unlink()  # lost, not written over: made again without that line
    out = cramlm("run", *TINY_RUN, cwd=tmp_path)
    assert "eval ..." in out and "written over" not in out


def test_the_twin_is_evaluated_again_when_the_objective_changes():
    """What is built and scored of the random weights depends on the objective (ELECTRA's generator
    beside the detector, the hybrid's scorer, PLL for a masked LM): a run re-trained in its folder
    with another objective or generator must not keep the twin of the last one."""
    from cramlm.pipeline.recipe import TWIN

    def twin(*extra):
        return stage_keys(resolve_recipe("default", [*TINY_RUN, *extra]))[TWIN]

    keys = {twin("train.objective=mlm"), twin("train.objective=hybrid"), twin("train.objective=rtd"),
            twin("train.objective=rtd", "train.rtd.generator_size=0.5")}
    assert len(keys) == 4
    assert twin("train.optim.lr=2e-3") == twin()  # the training alone: the same twin


def test_untrained_twin_switch():
    on = resolve_recipe("default", TINY_RUN)
    assert on.untrained_twin and "eval-untrained" in selected(on)
    off = resolve_recipe("default", [*TINY_RUN, "untrained_twin=false"])
    assert selected(off) == ["data", "pretrain", "eval", "report"]
    assert stage_keys(off)["report"] != stage_keys(on)["report"]  # the report without the twin is another report
    assert "eval-untrained" in selected(resolve_recipe("cpu-1h"))  # on in every shipped run recipe


def test_failed_stage_is_recorded_and_rerun(tiny_run, tmp_path, monkeypatch):
    shutil.copytree(tiny_run.parents[1], tmp_path, dirs_exist_ok=True)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["run", *TINY_RUN, "eval.tasks=[no/such/task]"])
    assert result.exit_code == 1 and "no such task folder" in result.output
    record = json.loads((tmp_path / "outputs" / "default" / "pipeline.json").read_text())
    assert record["stages"]["eval"]["status"] == "failed"
    assert record["stages"]["pretrain"]["status"] == "done"
    assert "eval ..." in cramlm("run", *TINY_RUN, cwd=tmp_path)  # the failed stage runs again


def test_a_stage_stopped_by_a_signal_is_recorded_as_interrupted_not_failed(tiny_run, tmp_path, monkeypatch):
    from cramlm.pipeline import recipe
    from cramlm.train.preemption import EXIT_INTERRUPTED, Interrupted

    shutil.copytree(tiny_run.parents[1], tmp_path, dirs_exist_ok=True)
    monkeypatch.chdir(tmp_path)

    def stopped(cfg):
        raise Interrupted("SIGTERM", 3, None)

    monkeypatch.setitem(recipe.RUNNERS, "eval", stopped)
    result = CliRunner().invoke(main, ["run", *TINY_RUN, "eval.tasks=[no/such/task]"])  # (another eval: the stage runs)
    assert result.exit_code == EXIT_INTERRUPTED, result.output
    stage = json.loads((tmp_path / "outputs" / "default" / "pipeline.json").read_text())["stages"]["eval"]
    assert stage["status"] == "interrupted" and stage["error"].startswith("Interrupted: SIGTERM")


def test_recipe_errors_name_the_key():
    with pytest.raises(ConfigError, match="train.optim.lrr"):
        resolve_recipe("default", ["train.optim.lrr=1"])
    with pytest.raises(ConfigError, match="no preset 'cpu1h'.*Did you mean 'cpu-1h'"):
        resolve_recipe("cpu1h")
    result = CliRunner().invoke(main, ["run", "default", "stages=[pretrian]"])
    assert result.exit_code == 1 and "stages" in result.output


def test_an_eval_override_of_no_task_fails_before_training(tmp_path, monkeypatch):
    """eval.overrides naming no task of the run's evaluation: one Error line before any stage runs
    (was: after pretraining); an evaluation of minimal pairs alone (a zero-shot sweep's eval.tasks=[])
    fine-tunes nothing, so an override there is not refused."""
    from cramlm.pipeline.recipe import run_pipeline

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["run", "default", *TINY_RUN, "eval.overrides.rotten_tomatos.epochs=2"])
    assert result.exit_code == 1 and "Error: eval.overrides.rotten_tomatos: no task of this evaluation" in result.output, result.output
    assert not (tmp_path / "outputs").exists()  # nothing prepared, trained or recorded
    zero_shot = resolve_recipe("default", [*TINY_RUN, "eval.tasks=[]", "eval.overrides.rotten_tomatos.epochs=2", "dryrun=true",
                                           "stages=[data]"])
    run_pipeline(zero_shot, "default")  # the up-front checks pass


def test_list_and_show():
    out = CliRunner().invoke(main, ["run", "--list"]).output
    for name in ("default", "cpu-1h", "crammed-bert-24h", "bert-original", "gpt2-60m"):
        assert name in out
    shown = CliRunner().invoke(main, ["run", "default", "budget=2m", "--show"]).output
    assert "budget: 2m\n" in shown and "rotten_tomatoes_small" in shown  # as written, not 0.0333 (issue 22.7)


def test_other_ranks_join_only_the_pretrain_stage(tiny_run, tmp_path, monkeypatch):
    """Under torchrun, ranks > 0 decide like rank 0 but only train; they never write the record."""
    import cramlm.pipeline.recipe as run_module

    shutil.copytree(tiny_run.parents[1], tmp_path, dirs_exist_ok=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RANK", "1")
    calls = []
    monkeypatch.setattr(run_module, "run_pretrain", lambda cfg: calls.append(cfg.budget))
    for name in ("run_data", "run_eval", "run_eval_untrained", "run_report"):
        monkeypatch.setattr(run_module, name, lambda cfg, name=name: pytest.fail(f"rank 1 ran {name}"))
    record_before = (tmp_path / "outputs" / "default" / "pipeline.json").read_text()
    run_module.run_pipeline(resolve_recipe("default", TINY_RUN))  # all finished: nothing to do
    assert calls == []
    run_module.run_pipeline(resolve_recipe("default", [*TINY_RUN, "budget=4s", "stages=[data,pretrain]"]))
    assert calls == [pytest.approx(4 / 3600)]
    assert (tmp_path / "outputs" / "default" / "pipeline.json").read_text() == record_before


def test_a_dry_run_is_small_in_every_stage(tmp_path):
    """`cramlm run dryrun=true` shows that every stage runs, not how well: it took 87 s on the tiny
    default (four full microbatches, four held-out batches, 500 dev rows twice; issue 22.7)."""
    cfg = resolve_recipe("default", [f"base_dir={tmp_path}", "dryrun=true"])
    full = resolve_recipe("default", [f"base_dir={tmp_path}"])
    pretrain = cfg.pretrain_config()
    assert pretrain.dryrun and pretrain.impl.microbatch_size <= 8 < full.pretrain_config().impl.microbatch_size
    assert pretrain.train.validate_sequences == pretrain.impl.microbatch_size
    ev = cfg.eval_config().eval
    assert (ev.epochs, ev.max_train_examples, ev.max_dev_examples) == (1, 64, 64)
    assert full.eval_config().eval.max_dev_examples is None  # a real run keeps its settings


def test_a_dry_runs_summary_gives_no_verdict_about_learning(tiny_run, tmp_path, monkeypatch):
    """A dry run (a few steps, scored on a few examples) ends with a line saying so, not with
    "pretraining did not pay (yet) ... the model learnt the corpus"."""
    from cramlm.pipeline.recipe import results_summary

    shutil.copytree(tiny_run.parents[1], tmp_path, dirs_exist_ok=True)
    monkeypatch.chdir(tmp_path)
    real = results_summary(resolve_recipe("default", TINY_RUN))
    dry = results_summary(resolve_recipe("default", [*TINY_RUN, "dryrun=true"]))
    assert "pretraining paid" in real or "did not pay" in real
    assert "dry run: " in dry and "did not pay" not in dry and "pretraining paid" not in dry
    from cramlm.report import write_report  # the report says the same

    config = run_dir = tmp_path / "outputs" / "default"
    (config / "config.yaml").write_text((config / "config.yaml").read_text().replace("dryrun: false", "dryrun: true"))
    page = write_report(run_dir).read_text()
    assert "Dry run: a few steps" in page and "did not pay" not in page


def test_fields_added_later_leave_keys_unchanged_at_their_default():
    """data.train_subset, train.optim.ns_dtype (Muon's), train.checkpoint_at and eval.select at their defaults are left out
    of the data, pretrain and eval keys (KEYLESS_DEFAULT), so runs recorded before those fields existed
    are found again; any other value keys a new stage."""
    import hashlib

    from cramlm.data.prepare import PIPELINE_VERSION
    from cramlm.pipeline.recipe import _hash

    at_defaults = [*TINY_RUN, "train.optim.ns_dtype=bfloat16"]  # the recipe takes auto: the field's default here
    cfg = resolve_recipe("default", at_defaults)
    pre = cfg.pretrain_config().model_dump(mode="json")
    del pre["data"]["train_subset"]
    assert "train_subset" not in json.dumps(pre)
    assert pre["train"]["optim"]["type"] == "muon"
    del pre["train"]["optim"]["ns_dtype"]
    del pre["train"]["checkpoint_at"]
    data = cfg.data.model_dump(mode="json")
    del data["train_subset"]
    assert cfg.data.cache_key() == hashlib.sha256(json.dumps([PIPELINE_VERSION, data], sort_keys=True).encode()).hexdigest()[:12]
    pre.pop("overwrite", None)
    pre["impl"].pop("progress", None)
    from cramlm.pipeline.recipe import NOT_WHAT_IT_MAKES
    from cramlm.train.impl import ImplConfig

    for field in NOT_WHAT_IT_MAKES:  # (stage_keys' rule: how the run is logged and how fast it runs, at their defaults)
        pre["impl"][field] = ImplConfig.model_fields[field].get_default(call_default_factory=True)
    if pre["train"]["objective"] == "mlm":  # (stage_keys' rule for the default objective)
        pre["train"].pop("objective")
        pre["train"].pop("rtd")
    keys = stage_keys(cfg)
    assert keys["pretrain"] == _hash(pre)
    ev = cfg.eval_config().model_dump(mode="json")
    assert "select" in ev["eval"]
    del ev["eval"]["select"]
    del ev["eval"]["minimal_pairs"]["save_every"]  # (stage_keys' rule: how often the pairs' scores are kept)
    ev["impl"].pop("progress", None)
    for field in NOT_WHAT_IT_MAKES:
        ev["impl"][field] = ImplConfig.model_fields[field].get_default(call_default_factory=True)
    from cramlm.data.heldout import DEFINITION

    assert keys["eval"] == _hash([keys["pretrain"], ev["eval"], ev["impl"], DEFINITION])
    half = stage_keys(resolve_recipe("default", [*at_defaults, "data.train_subset=0.5"]))
    chosen = stage_keys(resolve_recipe("default", [*at_defaults, "eval.select.lr=[1e-3,3e-3]"]))
    assert half["data"] != keys["data"] and half["pretrain"] != keys["pretrain"]
    assert chosen["pretrain"] == keys["pretrain"] and chosen["eval"] != keys["eval"]
    kept = stage_keys(resolve_recipe("default", [*at_defaults, "train.checkpoint_at=[0.5]"]))
    assert kept["data"] == keys["data"] and kept["pretrain"] != keys["pretrain"]
    fp32 = stage_keys(resolve_recipe("default", [*at_defaults, "train.optim.ns_dtype=float32"]))
    assert fp32["data"] == keys["data"] and fp32["pretrain"] != keys["pretrain"]
    # how pretraining runs is not what it makes: a run finished with --resume auto is skipped by a plain
    # `cramlm run` (was: trained again from scratch), and --resume auto on a finished run skips it
    resumed = stage_keys(resolve_recipe("default", [*at_defaults, "resume=auto", "allow_change=[train.optim.lr]"]))
    assert resumed == keys
    logged = stage_keys(resolve_recipe("default", [*at_defaults, "impl.tensorboard=true", "impl.dist_timeout=99"]))
    assert logged == keys  # where a run is also logged changes nothing it makes (was: every stage again)
    faster = stage_keys(resolve_recipe("default", [*at_defaults, "impl.threads=1", "impl.prefetch=false", "impl.compile=false",
                                                   "impl.activation_checkpointing=true"]))
    assert stage_keys(resolve_recipe("default", [*at_defaults, "eval.minimal_pairs.save_every=512"])) == keys
    assert faster == keys  # nor how fast it runs (was: the README's impl.threads=1 then a plain re-run trained it again)
    shipped = stage_keys(resolve_recipe("default", TINY_RUN))  # ns_dtype: auto
    assert shipped["data"] == keys["data"] and shipped["pretrain"] not in (keys["pretrain"], fp32["pretrain"])


def test_a_run_cut_off_in_pretraining_continues_when_run_again_and_refuses_another_config(tmp_path, monkeypatch):
    """`cramlm run` SIGKILLed after its step-4 checkpoint, then the same command again (no --resume):
    it continues from that checkpoint to the same weights as a run never cut off (was: started
    afresh, its checkpoints deleted); the command with a changed training setting is refused first,
    naming the change and the ways out, the folder untouched; while another process holds the run,
    the command is refused by its lock before the record changes."""
    import hashlib

    from tests.train.helpers import holder, killed_after_step

    args = ["default", *[a for a in TINY_RUN if not a.startswith("budget=")], "budget=null", "train.budget.steps=6", "train.log_every=1",
            "train.checkpoint_every=2", "stages=[data,pretrain]"]
    out = cramlm("run", *args, "name=whole", cwd=tmp_path)
    assert "cramlm run: finished (no report stage: cramlm report outputs/whole)" in out  # no report.html is claimed
    assert not (tmp_path / "outputs" / "whole" / "report.html").exists()
    killed_after_step(5, ['run', *args, 'name=cut'], cwd=tmp_path)
    run = tmp_path / "outputs" / "cut"
    assert read_record(run)["stages"]["pretrain"]["status"] == "running"

    def contents():
        return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(run.rglob("*"))
                if p.is_file() and ".cramlm.lock" not in p.name}  # (the killed run's lock owner file: cramlm's own)

    before = contents()
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["run", *args, "name=cut", "train.optim.lr=1e-3"])
    assert result.exit_code == 1, result.output
    assert result.output.startswith(f"Error: outputs/cut holds a pretraining cut off (its newest checkpoint step-00000004) under "
                                    "another configuration (train.optim.lr "), result.output
    assert "--resume auto" in result.output and "force=[pretrain]" in result.output
    assert contents() == before
    held = holder(run / ".cramlm.lock")
    try:  # the same command while the run is held (running in another process): the run folder's lock refuses it
        result = CliRunner().invoke(main, ["run", *args, "name=cut"])
        assert result.exit_code == 1 and "is in use by pid" in result.output and "continuing" not in result.output, result.output
        assert contents() == before  # its record too (was: the running stage recorded as failed by the refused one)
    finally:
        held.kill()
        held.wait()
    out = cramlm("run", *args, "name=cut", cwd=tmp_path)
    assert "the run in outputs/cut was cut off (its newest checkpoint step-00000004): continuing it, as --resume auto does" in out
    assert "resumed from outputs/cut/checkpoints/step-00000004 (step 4)" in out
    whole, cut = (load_file(tmp_path / "outputs" / n / "model.safetensors") for n in ("whole", "cut"))
    assert whole.keys() == cut.keys() and all(whole[k].equal(cut[k]) for k in whole)
    # a retraining under another budget, cut off before it cleared the finished run's checkpoints: its
    # stage recorded as running under the new key, the folder holding the old run's checkpoint. Run again,
    # it starts afresh (never extends the old run's final checkpoint to the new budget)
    longer = [*args, "name=whole", "train.budget.steps=8"]
    record = read_record(tmp_path / "outputs" / "whole")
    record["stages"]["pretrain"] = {"status": "running", "key": stage_keys(resolve_recipe(longer[0], longer[1:]))["pretrain"]}
    (tmp_path / "outputs" / "whole" / "pipeline.json").write_text(json.dumps(record))
    out = cramlm("run", *longer, cwd=tmp_path)
    assert "continuing" not in out and "resumed from" not in out, out
    assert json.loads((tmp_path / "outputs" / "whole" / "summary.json").read_text())["steps"] == 8
