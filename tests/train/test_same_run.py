"""A resumed run is the run it claims to be, or it is refused (issue 20, items 1-3): a resume
against other data (a re-prepared cache with another tokenizer), with a config that changes the
maths, or from a checkpoint whose file no longer matches its digest."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from cramlm.cli.common import resolve_or_exit
from cramlm.data.prepare import output_folder, prepare_data
from cramlm.io import CheckpointFileError
from cramlm.run.build import load_run
from cramlm.train.checkpoint import checkpoint_dirs, latest_checkpoint

from .helpers import FINISHED_STEPS, copy_run, finished_run, invoke, overrides, records

STEPS = FINISHED_STEPS


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A tiny finished run with checkpoints at steps 1 and 2."""
    return finished_run(tmp_path_factory, "same-run")


def resume(finished: Path, name: str, *extra: str, cli: tuple[str, ...] = ("--resume", "auto")):
    return invoke("pretrain", *cli, *overrides(finished.parent, name, *STEPS, "train.budget.steps=3", *extra))


def flip_a_weight_byte(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[-3] ^= 0x01  # in the last tensor's data: a small change of one weight, not a NaN
    path.write_bytes(bytes(raw))


# ------------------------------------------------------------------ item 2: the config


def test_a_resume_that_changes_the_maths_is_refused_listing_each_key(finished):
    copy_run(finished, "changed")
    result = resume(finished, "changed", "train.optim.lr=5e-3", "seed=7", "arch.dropout=0.5")
    assert result.exit_code == 1, result.output
    assert "Error: resume from " in result.output and "where it changes the maths" in result.output
    for text in ("train.optim.lr 0.001 -> 0.005", "seed 0 -> 7", "arch.dropout 0.0 -> 0.5", "--allow-change"):
        assert text in result.output, (text, result.output)
    assert "Traceback" not in result.output
    run = finished.parent / "changed"
    assert "5e-3" not in (run / "config.yaml").read_text() and "0.005" not in (run / "config.yaml").read_text()


def test_allow_change_records_the_change_and_the_history(finished):
    run = copy_run(finished, "allowed")
    result = resume(finished, "allowed", "train.optim.lr=5e-3", cli=("--resume", "auto", "--allow-change", "train.optim.lr"))
    assert result.exit_code == 0, result.output
    (event,) = [r for r in records(run, "event") if r["event"] == "config_changed"]
    assert event["step"] == 2 and event["changes"]["train.optim.lr"] == [0.001, 0.005]
    history = [json.loads(line) for line in (run / "config-history.jsonl").read_text().splitlines()]
    assert [h["step"] for h in history] == [0, 2]
    assert history[0]["config"]["train"]["optim"]["lr"] == 0.001 and history[1]["config"]["train"]["optim"]["lr"] == 0.005
    assert max(r["step"] for r in records(run)) == 3  # trained on, with the new lr from step 3
    # a budget that extends the run needs no opt-in (recorded all the same)
    assert history[1]["changes"]["train.budget.steps"] == [2, 3]


def test_a_resume_from_before_a_change_supersedes_it_in_the_history(finished):
    """A run changed at step 2 (--allow-change train.mlm_probability) and then resumed from its step-1
    checkpoint with the config of its start trained at one rate throughout, as it stands: the resume adds
    a history line at step 1 (though it changes nothing against its checkpoint), which supersedes the line
    at step 2, and the report's train task reads one rate."""
    from cramlm.report.rundata import load_run_data

    run = copy_run(finished, "went-back")
    result = resume(finished, "went-back", "train.mlm_probability=0.4", "train.keep_checkpoints=0",
                    cli=("--resume", "auto", "--allow-change", "train.mlm_probability"))
    assert result.exit_code == 0, result.output
    assert load_run_data(run).train_task == {"mlm_probability": "0.25 → 0.4 at step 2"}
    back = invoke("pretrain", "--resume", str(run / "checkpoints" / "step-00000001"), *overrides(finished.parent, "went-back", *STEPS))
    assert back.exit_code == 0, back.output
    history = [json.loads(line) for line in (run / "config-history.jsonl").read_text().splitlines()]
    assert [h["step"] for h in history] == [0, 2, 1] and history[2]["changes"] == {}
    assert load_run_data(run).train_task == {"mlm_probability": 0.25}
    # a change at step 1, then a resume from the checkpoint of that step (written before the change) with the
    # start's config, which changes nothing against it: the run trains at 0.25 from step 1, and a line at step 1 says so
    run = copy_run(finished, "went-back-to-1")
    step1 = str(run / "checkpoints" / "step-00000001")
    result = invoke("pretrain", "--resume", step1, "--allow-change", "train.mlm_probability",
                    *overrides(finished.parent, "went-back-to-1", *STEPS, "train.mlm_probability=0.4"))
    assert result.exit_code == 0, result.output
    assert load_run_data(run).train_task == {"mlm_probability": "0.25 → 0.4 at step 1"}
    back = invoke("pretrain", "--resume", step1, *overrides(finished.parent, "went-back-to-1", *STEPS))
    assert back.exit_code == 0, back.output
    history = [json.loads(line) for line in (run / "config-history.jsonl").read_text().splitlines()]
    assert [h["step"] for h in history] == [0, 1, 1] and history[2]["changes"] == {}
    assert load_run_data(run).train_task == {"mlm_probability": 0.25}


def test_an_allowed_optimizer_change_takes_effect(finished):
    """The checkpoint brings the optimizer's state, the resume's config its settings: an allowed
    weight decay (or Muon lr, momentum, ...) change trains with the new value (was: recorded as a
    change, but the checkpoint's param groups, with the old value, overwrote it)."""
    from safetensors.torch import load_file

    for name, extra in (("kept", ()), ("decayed", ("train.optim.weight_decay=0.5",))):
        copy_run(finished, name)
        allow = ("--allow-change", "train.optim.weight_decay") if extra else ()
        result = resume(finished, name, *extra, cli=("--resume", "auto", *allow))
        assert result.exit_code == 0, result.output
    kept, decayed = (load_file(str(finished.parent / n / "model.safetensors")) for n in ("kept", "decayed"))
    assert any(not torch.equal(kept[k], decayed[k]) for k in kept)


def test_a_resume_goes_on_at_the_flops_per_token_its_steps_were_booked_at(finished):
    """A cramlm that counts the model's FLOPs otherwise (another formula, another sample's share of
    predicted positions) does not move a resumed run's t, lr or last step: the run keeps the rate its
    steps were booked at; an allowed change of the maths re-books them at today's count."""
    from cramlm.io import write_digests

    def booked_at(run: Path, factor: float, recorded: bool = True) -> float:
        newest = latest_checkpoint(run / "checkpoints")
        state = json.loads((newest / "state.json").read_text())
        usage = state["usage"]  # AdamW: no optimizer FLOPs, so flops = tokens x flops per token
        usage["flops"] *= factor
        state["flops_per_token"] = usage["flops"] / usage["tokens"]  # as a cramlm counting otherwise wrote it
        if not recorded:  # a checkpoint that does not record it: worked out from its usage
            del state["flops_per_token"]
        (newest / "state.json").write_text(json.dumps(state))
        write_digests(newest, ["state.json"])
        return usage["flops"] / usage["tokens"]

    counted = json.loads((finished / "summary.json").read_text())["flops_per_token"]
    run = copy_run(finished, "booked")
    kept = booked_at(run, 1.25)
    result = resume(finished, "booked")
    assert result.exit_code == 0, result.output
    assert f"FLOPs per token {kept:,.0f}, as the run booked its steps (this cramlm counts {counted:,.0f})" in result.output
    summary = json.loads((run / "summary.json").read_text())
    assert summary["flops_per_token"] == pytest.approx(kept) and summary["flops"] == pytest.approx(summary["tokens"] * kept)
    derived = copy_run(finished, "booked-derived")
    kept = booked_at(derived, 1.25, recorded=False)
    result = resume(finished, "booked-derived")
    assert result.exit_code == 0 and f"FLOPs per token {kept:,.0f}, as the run booked" in result.output, result.output
    # the run's own count: nothing to keep, nothing said
    plain = copy_run(finished, "plain")
    result = resume(finished, "plain")
    assert result.exit_code == 0 and "as the run booked" not in result.output, result.output
    assert json.loads((plain / "summary.json").read_text())["flops_per_token"] == counted
    # an allowed change of the maths: today's count
    changed = copy_run(finished, "booked-changed")
    booked_at(changed, 1.25)
    result = resume(finished, "booked-changed", "train.optim.lr=5e-3", cli=("--resume", "auto", "--allow-change", "train.optim.lr"))
    assert result.exit_code == 0 and "as the run booked" not in result.output, result.output
    assert json.loads((changed / "summary.json").read_text())["flops_per_token"] == counted


def test_allow_change_of_a_key_that_does_not_exist_is_an_error(finished):
    copy_run(finished, "typo")
    result = resume(finished, "typo", cli=("--resume", "auto", "--allow-change", "train.optim.lrr"))
    assert result.exit_code == 1 and "allow_change: train.optim.lrr: no such config key" in result.output, result.output


def test_another_precision_is_a_change_of_the_maths(finished):
    copy_run(finished, "bf16")
    result = resume(finished, "bf16", "impl.precision=bf16")
    assert result.exit_code == 1, result.output
    assert "it was trained in fp32, this run resolves impl.precision to bf16" in result.output, result.output


# ------------------------------------------------------------------ item 1: the data


def test_a_resume_against_another_tokenizer_of_the_same_size_is_refused(finished, tmp_path):
    base = finished.parent
    copy_run(finished, "retok")
    cache = tmp_path / "other-cache"
    cfg = resolve_or_exit("pretrain", overrides(base, "retok", *STEPS, f"impl.data_cache={cache}"))
    other = resolve_or_exit("pretrain", overrides(base, "retok", *STEPS, "data.tokenizer.max_training_docs=5"))
    prepared = prepare_data(other.data, cache, progress=False)  # another tokenizer, the same vocabulary size
    shutil.move(prepared.folder, output_folder(cfg.data, cache))  # ... where this run's data config looks
    result = resume(finished, "retok", f"impl.data_cache={cache}")
    assert result.exit_code == 1, result.output
    assert "this run's data is not the data the checkpoint was trained on (tokenizer: " in result.output, result.output
    assert "Traceback" not in result.output
    assert (base / "retok" / "tokenizer.json").read_bytes() == (finished / "tokenizer.json").read_bytes()  # not replaced


def test_a_resume_with_another_data_config_names_the_changed_key(finished):
    # data.train_subset changes the packed bytes: the line names the key, not a re-prepared cache
    copy_run(finished, "subset")
    result = resume(finished, "subset", "data.train_subset=0.5")
    assert result.exit_code == 1, result.output
    assert "this run's data is not the data the checkpoint was trained on" in result.output, result.output
    assert "data.train_subset 1.0 -> 0.5" in result.output and "prepared again" not in result.output, result.output
    assert "Traceback" not in result.output


def test_a_re_prepared_cache_gives_the_same_data_and_resumes(finished, tmp_path):
    copy_run(finished, "reprep")
    result = resume(finished, "reprep", f"impl.data_cache={tmp_path / 'fresh-cache'}")  # prepared again, from scratch
    assert result.exit_code == 0, result.output
    assert "resumed from" in result.output


# ------------------------------------------------------------------ item 3: digests


def test_a_flipped_weight_byte_sets_the_checkpoint_aside(finished, capsys):
    run = copy_run(finished, "flipped")
    newest = latest_checkpoint(run / "checkpoints")
    flip_a_weight_byte(newest / "model.safetensors")
    result = resume(finished, "flipped")
    assert result.exit_code == 0, result.output
    assert "model.safetensors does not match its digest" in capsys.readouterr().out + result.output
    assert "resumed from" in result.output and "step-00000001 (step 1)" in result.output
    assert (run / "checkpoints" / f"{newest.name}.damaged").is_dir()


def test_a_tampered_training_file_is_set_aside_before_it_is_loaded(finished, tmp_path, capsys):
    import torch

    run = copy_run(finished, "tampered")
    newest = latest_checkpoint(run / "checkpoints")
    torch.save({"optimizer": {}}, newest / "training.pt")  # a readable file, but not the one written
    result = resume(finished, "tampered")
    assert result.exit_code == 0 and "training.pt does not match its digest" in capsys.readouterr().out + result.output


def test_eval_and_export_refuse_weights_that_fail_their_digest(finished, tmp_path):
    run = copy_run(finished, "flipped-run")
    flip_a_weight_byte(run / "model.safetensors")
    with pytest.raises(CheckpointFileError, match="model.safetensors does not match its digest"):
        load_run(run)
    result = invoke("eval", f"base_dir={finished.parent}", "name=flipped-run", "eval.lm_eval=false")
    assert result.exit_code == 1 and "does not match its digest" in result.output, result.output
    shutil.copyfile(finished / "model.safetensors", run / "model.safetensors")
    ckpt = checkpoint_dirs(run / "checkpoints")[0]
    flip_a_weight_byte(ckpt / "model.safetensors")
    result = invoke("export", "hf", str(ckpt / "model.safetensors"), str(tmp_path / "hf"))
    assert result.exit_code == 1 and f"Error: {ckpt / 'model.safetensors'}: model.safetensors does not match" in result.output, result.output


def test_which_changes_a_resume_accepts():
    from cramlm.config.base import resume_policy
    from cramlm.run.config import PretrainConfig
    from cramlm.train.checkpoint import resume_changes as changes

    def resume_changes(old, new, allow, where):
        return changes(old, new, allow, where, resume_policy(PretrainConfig))

    old = {"budget": 1.0, "seed": 0, "train": {"optim": {"lr": 1e-3}, "budget": {"steps": 10}, "log_every": 10},
           "impl": {"threads": 4, "microbatch_size": 8}}
    new = {"budget": None, "seed": 0, "train": {"optim": {"lr": 1e-3}, "budget": {"steps": 20}, "log_every": 1},
           "impl": {"threads": 1, "microbatch_size": 4}}
    assert resume_changes(old, new, [], "x") == {"budget": [1.0, None], "train.budget.steps": [10, 20]}  # longer: fine
    shorter = {**new, "train": {**new["train"], "budget": {"steps": 5}}}
    with pytest.raises(ValueError, match=r"train.budget.steps 10 -> 5"):
        resume_changes(old, shorter, [], "x")
    assert resume_changes(old, shorter, ["train.budget"], "x")["train.budget.steps"] == [10, 5]
    faster = {**new, "train": {**new["train"], "optim": {"lr": 2e-3}}}
    assert resume_changes(old, faster, ["train.optim"], "x")["train.optim.lr"] == [1e-3, 2e-3]  # a prefix allows
    # what is counted against the budget changes no maths; the lr does
    counted = {**new, "count_eval": True, "count_compile": False}
    assert resume_changes({**old, "count_eval": False, "count_compile": True}, counted, [], "x") == resume_changes(old, new, [], "x")
    with pytest.raises(ValueError, match=r"train.optim.lr 0.001 -> 0.002"):
        resume_changes({**old, "count_eval": False}, {**faster, "count_eval": True}, [], "x")


def test_the_resume_policy_is_the_fields_own():
    """Which keys a resume may change comes from the fields (config/base.py RESUME_FREE / RESUME_GROW),
    so a field that moves takes its policy along; every key named exists in the resolved config."""
    from cramlm.cli.common import resolve_or_exit
    from cramlm.config.base import resume_policy
    from cramlm.run.config import PretrainConfig
    from cramlm.train.checkpoint import UNSERVABLE, flat

    policy = resume_policy(PretrainConfig)
    keys = flat(resolve_or_exit("pretrain", []).model_dump(mode="json"))
    assert all(any(k == p or k.startswith(p + ".") for k in keys) for p in [*policy, *UNSERVABLE]), policy
    assert {k for k, v in policy.items() if v == "grow"} == {"budget", "train.budget.tokens", "train.budget.flops",
                                                                "train.budget.steps"}
    assert {"count_eval", "count_compile", "impl", "train.log_every", "data.name"} <= set(policy)
    assert not {"seed", "train.optim", "train.optim.lr", "train.schedule", "data.tokenizer"} & set(policy)


def test_allow_change_without_a_resume_is_a_usage_error():
    result = invoke("pretrain", "--allow-change", "train.optim.lr")
    assert result.exit_code == 2 and "--allow-change applies to a resume" in result.output, result.output


def test_validation_switched_on_at_a_resume_is_periodic_from_there(tmp_path):
    """A run written with train.validate_every=0 and resumed with it on: validation is due at the next
    multiple of the fraction past the resumed t (was: never, the checkpoint's 'off' kept)."""
    from .helpers import run_inprocess

    base = ["budget=null", "train.budget.steps=2", "train.checkpoint_every=2", "train.validate_every=0"]
    run_inprocess(tmp_path, "v", *base)
    run_inprocess(tmp_path, "v", "budget=null", "train.budget.steps=8", "train.validate_every=0.25", "resume=auto",
                  "allow_change=[train.budget.steps]")
    vals = [r["step"] for r in records(tmp_path / "v", "val")]
    assert vals == [2, 4, 6, 8], vals  # the first segment's final one, then t 0.5 and 0.75, and the final one (was: [2, 8])
