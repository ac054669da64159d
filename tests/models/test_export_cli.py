"""`cramlm export hf` on a real (tiny) pretraining run."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

from cramlm.cli import main
from cramlm.pretrain import load_run
from tests.conftest import TINY_PRETRAIN

transformers = pytest.importorskip("transformers")


def test_export_hf_of_a_run_loads_in_transformers(in_tmp):
    runner = CliRunner()
    result = runner.invoke(main, ["pretrain", "arch=bert-original-tiny", "name=tiny", "dryrun=true", *TINY_PRETRAIN])
    assert result.exit_code == 0, result.output
    result = runner.invoke(main, ["export", "hf", "tiny", "hf-out"])  # a run name under ./outputs
    assert result.exit_code == 0, result.output
    assert "BertForMaskedLM" in result.output
    ours, tok, _ = load_run(in_tmp / "outputs" / "tiny")
    hf = transformers.AutoModelForMaskedLM.from_pretrained(in_tmp / "hf-out").eval()
    auto_tok = transformers.AutoTokenizer.from_pretrained(in_tmp / "hf-out")
    text = "call me ishmael, said the whale"
    ids = auto_tok(text, return_tensors="pt")["input_ids"]
    assert ids[0].tolist() == tok.encode(text).ids
    ours.eval()
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=ids).logits, ours(ids)["logits"], rtol=1e-4, atol=1e-4)


def test_export_hf_of_a_missing_run_fails_cleanly(in_tmp):
    result = CliRunner().invoke(main, ["export", "hf", "nope", "out"])
    assert result.exit_code == 1 and "no such run" in result.output
