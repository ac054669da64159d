"""train.objective=rtd (ELECTRA) end to end: it learns, counts both networks' FLOPs, resumes bit for
bit, saves the discriminator as the run's model (what eval fine-tunes and export uses), reports its
held-out loss as rtd (the generator's MLM loss), and two processes train what one does."""

import json
import shutil
import sys

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from cramlm.cli import main
from cramlm.cli.common import resolve_or_exit
from cramlm.models.crammed_bert import CrammedBert
from cramlm.models.objectives.rtd import discriminator_state
from cramlm.run.build import load_run

from .helpers import REPO, free_port, losses, overrides, records, run, run_inprocess

RTD = ["train.objective=rtd", "budget=null"]
STEPS = [*RTD, "train.budget.steps=4", "train.checkpoint_every=2", "train.keep_checkpoints=5"]


def final_state(run_dir):
    summary = json.loads((run_dir / "summary.json").read_text())
    return load_file(f"{summary['final_checkpoint']}/model.safetensors")


def test_rtd_loss_decreases_and_flops_count_both_networks(tmp_path):
    summary = run_inprocess(tmp_path, "rtd", *RTD, "train.budget.steps=40", "train.optim.lr=3e-3", "train.validate_every=0.5")
    mlm = run_inprocess(tmp_path, "mlm", "budget=null", "train.budget.steps=1")
    got = losses(tmp_path / "rtd")
    first, last = [got[s] for s in (1, 2, 3)], [got[s] for s in (38, 39, 40)]
    assert sum(last) / 3 < sum(first) / 3 - 1.0, got  # mlm + 50 bce: starts near ln(512) + 50 ln 2
    val = [r["val_loss"] for r in records(tmp_path / "rtd", "val")]
    assert len(val) >= 2 and val[-1] < val[0]  # the generator's MLM loss on the held-out masks
    assert summary["objective"] == "rtd" and mlm["objective"] == "mlm"
    lines = records(tmp_path / "rtd")  # the two terms are logged beside the loss (one microbatch a step)
    assert all(r["loss"] == pytest.approx(r["mlm_loss"] + 50 * r["rtd_loss"], abs=1e-4) for r in lines)
    assert lines[-1]["rtd_loss"] < lines[0]["rtd_loss"] and lines[-1]["mlm_loss"] < lines[0]["mlm_loss"]
    assert "mlm_loss" not in records(tmp_path / "mlm")[0]
    # the generator (1/4 width, here one head of 16) and the detector cost on top of the MLM
    assert summary["flops_per_token"] > 1.2 * mlm["flops_per_token"]
    assert summary["flops"] == pytest.approx(summary["tokens"] * summary["flops_per_token"])
    # the run's model.safetensors is the discriminator: the arch's own model, loaded strictly
    model, _, cfg = load_run(tmp_path / "rtd")
    assert type(model) is CrammedBert and cfg.train.objective == "rtd"
    saved = load_file(str(tmp_path / "rtd" / "model.safetensors"))
    trained = discriminator_state(final_state(tmp_path / "rtd"))
    assert saved.keys() == trained.keys() and all(torch.equal(saved[k], trained[k]) for k in saved)
    assert not any(k.startswith(("generator", "detector")) for k in saved)


def test_rtd_resumes_bitwise(tmp_path):
    run_inprocess(tmp_path, "ref", *STEPS)
    shutil.copytree(tmp_path / "ref" / "checkpoints" / "step-00000002", tmp_path / "resumed" / "checkpoints" / "step-00000002")
    assert run_inprocess(tmp_path, "resumed", *STEPS, "resume=auto")["steps"] == 4
    a, b = final_state(tmp_path / "ref"), final_state(tmp_path / "resumed")  # generator and detector too
    assert any(k.startswith("generator.") for k in a) and any(k.startswith("detector.") for k in a)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert losses(tmp_path / "resumed") == {s: v for s, v in losses(tmp_path / "ref").items() if s > 2}


def test_eval_fine_tunes_the_discriminator_and_reports_the_heldout_loss_as_rtd(tmp_path, monkeypatch):
    run_inprocess(tmp_path, "rtd", *RTD, "train.budget.steps=3")
    from cramlm.eval.checkpoints import load_checkpoint

    ckpt = load_checkpoint(str(tmp_path / "rtd"), tmp_path)
    trained = final_state(tmp_path / "rtd")
    assert type(ckpt.encoder) is CrammedBert  # fine-tuning gets the discriminator ...
    for k, v in discriminator_state(trained).items():
        assert torch.equal(ckpt.encoder.state_dict()[k], v), k
    generator = {k: v for k, v in ckpt.lm.model.state_dict().items() if k.startswith("generator.trunk.blocks")}
    assert generator and all(torch.equal(v, trained[k]) for k, v in generator.items())  # ... the held-out loss its generator
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["eval", f"checkpoint={tmp_path / 'rtd'}", "eval.tasks=[]", "impl.progress=false"])
    assert result.exit_code == 0, result.output
    heldout = json.loads((tmp_path / "rtd" / "eval.json").read_text())["heldout"]
    assert heldout["objective"] == "rtd" and "generator" in heldout["scored_by"] and 0 < heldout["loss"] < 20
    from cramlm.report.rundata import load_run_data

    assert load_run_data(tmp_path / "rtd").objective == "rtd"  # plotted apart from MLM runs


def test_rtd_needs_a_masked_lm(tmp_path):
    from .helpers import CAUSAL

    import click

    with pytest.raises(click.ClickException, match="train.objective=rtd .* needs a masked LM"):
        resolve_or_exit("pretrain", overrides(tmp_path, "x", *CAUSAL, "train.objective=rtd"))


def test_rtd_under_ddp_and_fsdp_matches_one_process(tmp_path):
    setup = [*RTD, "train.budget.steps=3", "impl.microbatch_size=2", "train.validate_every=0"]
    run_inprocess(tmp_path, "one", *setup)
    runs = [overrides(tmp_path, name, *setup, f"impl.distributed={name}") for name in ("ddp", "fsdp")]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
           str(REPO / "tests" / "train" / "dist_driver.py"), json.dumps(runs)]
    run(cmd, timeout=300)
    reference = losses(tmp_path / "one")
    assert sorted(reference) == [1, 2, 3] and abs(reference[3] - reference[1]) > 1e-3
    for name in ("ddp", "fsdp"):
        got = losses(tmp_path / name)
        assert sorted(got) == [1, 2, 3] and all(abs(got[s] - reference[s]) < 1e-4 for s in reference), (name, got, reference)
        assert json.loads((tmp_path / name / "summary.json").read_text())["world_size"] == 2
        for mine, theirs in zip(records(tmp_path / "one"), records(tmp_path / name)):
            assert abs(mine["rtd_loss"] - theirs["rtd_loss"]) < 1e-5 and abs(mine["mlm_loss"] - theirs["mlm_loss"]) < 1e-5


def test_export_holds_what_was_trained_from_the_run_or_any_checkpoint(tmp_path):
    """The discriminator with its detector (never its untrained MLM head), and the generator in generator/."""
    pytest.importorskip("transformers")
    from cramlm.cli.export import export_run

    run_inprocess(tmp_path, "rtd", *STEPS)
    export_run(str(tmp_path / "rtd"), str(tmp_path / "from-run"))
    export_run(str(tmp_path / "rtd" / "checkpoints" / "step-00000004"), str(tmp_path / "from-final"))
    export_run(str(tmp_path / "rtd" / "checkpoints" / "step-00000002"), str(tmp_path / "from-step-2"))
    for part in ("", "generator/"):
        a, b, c = (load_file(str(tmp_path / d / f"{part}model.safetensors")) for d in ("from-run", "from-final", "from-step-2"))
        assert a.keys() == b.keys() == c.keys() and not any(k.startswith("head.") for k in a)
        assert any(k.startswith("detector.") for k in a) == (part == "")
        assert all(torch.equal(a[k], b[k]) for k in a) and not all(torch.equal(a[k], c[k]) for k in a)
    trained = final_state(tmp_path / "rtd")
    assert torch.equal(a["trunk.blocks.0.attn.qkv.weight"], trained["generator.trunk.blocks.0.attn.qkv.weight"])
