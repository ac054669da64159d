"""Exported checkpoints load in stock transformers (offline) and compute what ours compute."""

from __future__ import annotations

import gzip
import inspect
import json
from importlib.resources import files

import pytest
import torch
from safetensors import safe_open
from tokenizers import Tokenizer

from cramlm.data.tokenizer import TokenizerConfig, train_tokenizer
from cramlm.models import model as modeling
from cramlm.models.hf import TIED_OUTPUT, export_hf, stock_architecture
from tests.models.helpers import VOCAB, random_ids, tiny_model

transformers = pytest.importorskip("transformers")



def moby_dick(n: int = 50) -> list[str]:
    path = files("cramlm") / "resources" / "moby_dick.jsonl.gz"
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line)["text"] for line, _ in zip(f, range(n))]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    tok = train_tokenizer(TokenizerConfig(vocab_size=VOCAB, min_frequency=1), moby_dick())
    assert tok.get_vocab_size() == VOCAB
    return tok


STOCK = [
    ("bert-original-tiny", "BertForMaskedLM"),
    ("bert-original-tiny untied", "BertForMaskedLM"),  # its decoder bias under its own name too (was loaded as zeros)
    ("crammed-bert-modern", "ModernBertForMaskedLM"),
    ("gpt2-tiny", "GPT2LMHeadModel"),
    ("llama-tiny", "LlamaForCausalLM"),
]


@pytest.mark.parametrize("name,cls", STOCK)
def test_stock_export_gives_the_same_logits(name, cls, tokenizer, tmp_path):
    name, *untied = name.split()
    model = tiny_model(name, **({"tie_embeddings": False} if untied else {}))
    assert export_hf(model, tokenizer, tmp_path) == cls
    with safe_open(tmp_path / "model.safetensors", "pt") as f:  # a tied output embedding is stored once
        assert (TIED_OUTPUT[stock_architecture(model.cfg)] in f.keys()) == (not model.cfg.tie_embeddings)
    hf = getattr(transformers, cls).from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert type(hf).__name__ == cls
    ids = random_ids(B=2, T=24)
    mask = torch.ones_like(ids)
    mask[1, 18:] = 0  # padding goes through both the same way
    with torch.no_grad():
        ours = model(ids, attention_mask=mask)["logits"]
        theirs = hf(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(theirs[mask.bool()], ours[mask.bool()], rtol=1e-4, atol=1e-4)


def test_exported_tokenizer_gives_our_ids(tokenizer, tmp_path):
    export_hf(tiny_model("bert-original-tiny"), tokenizer, tmp_path)
    auto = transformers.AutoTokenizer.from_pretrained(tmp_path)
    for text in ["Call me Ishmael.", "never mind, the WHALE!", "unknown-wörds xyz"]:
        assert auto(text)["input_ids"] == tokenizer.encode(text).ids
    assert auto("a whale", "the sea")["input_ids"] == tokenizer.encode("a whale", "the sea").ids
    assert (auto.pad_token_id, auto.cls_token_id, auto.sep_token_id, auto.mask_token_id) == (0, 2, 3, 4)


def test_stock_architecture_needs_every_choice():
    assert stock_architecture(tiny_model("crammed-bert-tiny").cfg) is None  # scaled sinusoidal, GLU, ...
    assert stock_architecture(tiny_model("bert-original-tiny", norm_scheme="pre").cfg) is None
    assert stock_architecture(tiny_model("llama-tiny").cfg) == "llama"


MODERN = {"qk_norm": True, "activation": "relu2", "zero_init_out": True, "logit_softcap": 15.0, "value_embeddings": 1}


@pytest.mark.parametrize("name,auto,overrides", [
    ("crammed-bert-tiny", "AutoModelForMaskedLM", {}),  # no MLM head transform (cramming's)
    ("crammed-bert-tiny", "AutoModelForMaskedLM", {"head_transform": True}),
    ("bert-original-tiny", "AutoModelForMaskedLM", {"head_transform": False}),  # BertForMaskedLM cannot express it
    ("gpt2-tiny", "AutoModelForCausalLM", {"norm": "rmsnorm"}),  # a GPT-2 no stock class matches
    # the modern choices, all on (zero_init_out alone would stay stock: it changes only the init)
    ("gpt2-tiny", "AutoModelForCausalLM", MODERN),
    ("llama-tiny", "AutoModelForCausalLM", MODERN),
    ("crammed-bert-tiny", "AutoModelForMaskedLM", MODERN),
])
def test_remote_code_export_gives_the_same_logits(name, auto, overrides, tokenizer, tmp_path):
    model = tiny_model(name, **overrides)
    assert stock_architecture(model.cfg) is None
    if overrides.get("zero_init_out"):  # zeroed projections would hide a wrongly exported block
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
    cls = export_hf(model, tokenizer, tmp_path)
    assert cls.startswith("Cramlm") and (tmp_path / "modeling_cramlm.py").is_file()
    # the very code that was trained: model.py verbatim, then the wrappers, no cramlm import left
    from cramlm.models import hf_configuration  # imports transformers

    exported = (tmp_path / "modeling_cramlm.py").read_text()
    assert exported.startswith(inspect.getsource(modeling)) and "class CramlmForMaskedLM" in exported
    assert not [line for line in exported.splitlines() if line.lstrip().startswith(("from cramlm", "import cramlm"))]
    assert (tmp_path / "configuration_cramlm.py").read_text() == inspect.getsource(hf_configuration)
    hf = getattr(transformers, auto).from_pretrained(tmp_path, trust_remote_code=True).eval()
    assert type(hf).__name__ == cls
    ids = random_ids()
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=ids).logits, model(ids)["logits"], rtol=1e-4, atol=1e-4)
    if auto == "AutoModelForCausalLM":  # it generates (was: no generate at all), greedy as our model's argmax
        prompt = ids[:, :6]
        out = hf.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=4, do_sample=False)
        greedy = prompt
        with torch.no_grad():
            for _ in range(4):
                greedy = torch.cat([greedy, model(greedy)["logits"][:, -1].argmax(-1, keepdim=True)], dim=1)
        assert torch.equal(out, greedy)


def test_the_untrained_twin_of_a_remote_code_export_starts_as_cramlm_starts(tokenizer, tmp_path):
    """checkpoint=<export>-untrained: cramlm's initialisation (normal at init_std, zero-init out where
    the arch says), not transformers' defaults (embeddings at std 1, as before), so it is the run's twin."""
    from cramlm.eval.checkpoints import load_checkpoint

    model = tiny_model("crammed-bert-tiny", zero_init_out=True)
    # (a folder name no other test's remote-code export has: transformers caches remote code by the folder's
    # name and ties the first class it loaded for a config to it, for the rest of the process)
    export_hf(model, tokenizer, tmp_path / "twin-of-export")
    twin = load_checkpoint(f"{tmp_path / 'twin-of-export'}-untrained", tmp_path / "out", trust_remote_code=True).encoder.model
    std = model.cfg.init_std
    assert abs(twin.tokens.weight.std().item() - std) < 0.2 * std
    assert abs(twin.blocks[0].attn.qkv.weight.std().item() - std) < 0.2 * std
    assert not twin.blocks[0].attn.out.weight.any() and not twin.blocks[0].ffn.down.weight.any()  # zero_init_out
