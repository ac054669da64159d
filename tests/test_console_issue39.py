"""What the console and the docs tell a person (issue 39 item 9): the banner names the objective and
the precision, an ELECTRA run's losses are labelled, `config show --doc` shows the budget's default
as written, and a YAML file that is merely large is not called an alias bomb."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from click.testing import CliRunner

from cramlm.cli import main
from cramlm.config.loader import ConfigError, safe_load_text
from cramlm.runs import console_summary
from tests.conftest import TINY_PRETRAIN


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


def test_a_large_flat_yaml_is_not_called_an_alias_bomb():
    text = "a: [" + ", ".join(["1"] * 100_001) + "]\n"
    with pytest.raises(ConfigError) as e:
        safe_load_text(text, "big.yaml")
    assert "holds more than 100,000 values" in str(e.value) and "alias" not in str(e.value)


def test_the_packed_fingerprint_is_of_the_canonical_json_as_documented(tmp_path):
    from cramlm.data import cramtok
    from cramlm.data.tokenizer import TokenizerConfig, fingerprint, train_tokenizer

    tok = train_tokenizer(TokenizerConfig(vocab_size=120, min_frequency=1), ["call me ishmael"] * 20)
    assert fingerprint(tok) == hashlib.sha256(tok.to_str().encode("utf-8")).digest()[:16]
    assert "Tokenizer.to_str()" in cramtok.__doc__
