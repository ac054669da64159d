"""What `cramlm pretrain` tells a person: a short summary (no JSON dump), a validation loss that
`cramlm eval`'s held-out loss reproduces when the run validates on the whole held-out set, a banner
naming the architecture, the objective and the precision, an ELECTRA run's losses labelled, help
examples kept as lines, `config show` budgets in their units, and a dry run that does not size its
steps by the clock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cramlm.cli import main
from cramlm.config.loader import resolve
from cramlm.run.config import PretrainConfig
from cramlm.run.console import console_summary
from cramlm.run.pretrain import DEFAULTS
from tests.conftest import TINY_PRETRAIN


def _cli(*args: str):
    return CliRunner().invoke(main, list(args))


def test_console_summary_is_short_and_eval_reports_the_same_held_out_loss(in_tmp):
    run = _cli("pretrain", "name=tiny", "dryrun=true", *TINY_PRETRAIN)
    assert run.exit_code == 0, run.output
    tail = run.output[run.output.index("cramlm pretrain: done"):].splitlines()
    assert len(tail) <= 4 and all(len(line) < 160 for line in tail), tail
    assert not any(line.lstrip().startswith("{") for line in run.output.splitlines())  # the JSON is in summary.json
    summary = json.loads((in_tmp / "outputs" / "tiny" / "summary.json").read_text())
    assert f"{summary['steps']:,} steps" in tail[0] and "tokens/s" in tail[0] and "MFU" in tail[0]
    assert f"validation {summary['val_loss']:.3f}" in tail[1] and "held-out" in tail[1]
    assert "outputs/tiny" in tail[2]

    result = _cli("eval", "checkpoint=latest", "eval.tasks=[]", "impl.progress=false")
    assert result.exit_code == 0, result.output
    assert "checkpoint=latest is outputs/tiny" in result.output  # it says which run it took
    heldout = json.loads((in_tmp / "outputs" / "tiny" / "eval.json").read_text())["heldout"]
    # one definition (data/heldout.py): val_loss scores the first train.validate_sequences (512) of the
    # held-out sequences with the same masks; this tiny validation file has fewer, so all of them
    assert summary["val_sequences"] == heldout["sequences"] == heldout["file_sequences"] < 512
    assert heldout["loss"] == pytest.approx(summary["val_loss"], abs=1e-5)
    assert heldout["bpb"] == pytest.approx(summary["val_bpb"], abs=1e-5) and 0 < heldout["bpb"] < 20
    assert "heldout-v1" in result.output and "bits per byte" in result.output


def test_dryrun_takes_single_microbatch_steps_whatever_the_budget(in_tmp):
    # a 24 h clock and a 64-sequence batch without ramp: the dry run still takes 3 steps of one microbatch
    run = _cli("pretrain", "name=dry", "dryrun=true", "impl.dryrun_steps=3", "budget=24", *TINY_PRETRAIN,
               "train.batch_size=64", "train.batch_ramp=0", "train.min_updates=0")
    assert run.exit_code == 0, run.output
    summary = json.loads((in_tmp / "outputs" / "dry" / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["tokens"] == 3 * 8 * 32  # microbatch 8, sequences of 32
    assert summary["budget"] == "3 steps"  # no clock: the dry run never waits on the budget


def test_pretrain_help_keeps_examples_on_their_own_lines():
    out = _cli("pretrain", "--help").output
    assert "\n    cramlm pretrain arch=crammed-bert train=bert-o4 budget=24 name=bert24\n" in out
    assert "\n    cramlm pretrain dryrun=true\n" in out


@pytest.mark.parametrize("command,example", [("run", "cramlm run cpu-1h"), ("sweep", "cramlm sweep --sizes 64x2,128x4,256x4"),
                                             ("plan", "cramlm plan budget=1h")])
def test_pipeline_help_keeps_examples_on_their_own_lines(command, example):
    lines = [line.strip() for line in _cli(command, "--help").output.splitlines()]
    assert any(line.startswith(example) for line in lines), lines


@pytest.mark.parametrize("budget,shown", [("1m", "1m"), ("90s", "1.5m"), ("24", "24h"), ("1.5h", "1.5h"), ("7s", "7s")])
def test_config_show_prints_budgets_in_their_units_and_they_parse_back(budget, shown):
    out = _cli("config", "show", "pretrain", f"budget={budget}").output
    assert f"\nbudget: {shown}\n" in out
    again = resolve(PretrainConfig, DEFAULTS, [f"budget={shown}"])
    assert again.budget == pytest.approx(resolve(PretrainConfig, DEFAULTS, [f"budget={budget}"]).budget)


@pytest.mark.parametrize("preset,banner", [
    ("crammed-bert-tiny", "crammed-bert"),
    ("bert-original-tiny", "bert-original (type crammed-bert)"),  # was 'crammed-bert' (issue 22.7)
    ("crammed-bert-modern", "crammed-bert-modern (type crammed-bert)"),
    ("gpt2-tiny", "gpt2"),
    ("llama-tiny", "llama"),
])
def test_banner_names_the_architecture_not_only_its_type(preset, banner):
    from cramlm.run.console import arch_banner
    from tests.models.helpers import preset as tiny_preset

    assert arch_banner(tiny_preset(preset)) == banner


def test_the_banner_names_the_objective_and_the_precision(in_tmp):
    result = CliRunner().invoke(main, ["pretrain", "name=tiny", "dryrun=true", *TINY_PRETRAIN])
    assert result.exit_code == 0, result.output
    banner = next(line for line in result.output.splitlines() if "parameters" in line)
    assert "objective mlm (masked LM)" in banner and "precision fp32 (" in banner, banner


def test_an_electra_runs_losses_are_labelled():
    summary = {"steps": 10, "tokens": 1000, "train_seconds": 1.0, "setup_seconds": 0.1, "first_loss": 43.564,
               "last_loss": 35.774, "val_loss": 7.58, "final_checkpoint": "x/step-00000010", "objective": "rtd",
               "rtd_weight": 50.0}
    lines = console_summary(summary, Path("outputs/e")).splitlines()
    assert "43.564 -> 35.774 (train: generator MLM + 50 x detector BCE)" in lines[1]
    assert "validation 7.580 (generator MLM on part of the held-out set" in lines[1] and len(lines[1]) < 160
    mlm = console_summary({**summary, "objective": "mlm"}, Path("outputs/m")).splitlines()[1]
    assert "(train), validation 7.580 (val_loss: part of the held-out set" in mlm


def test_config_show_doc_shows_the_budget_default_as_written():
    result = CliRunner().invoke(main, ["config", "show", "pretrain", "--doc"])
    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if line.startswith("budget:"))
    assert "default: 1m" in line and "0.0166" not in line, line
