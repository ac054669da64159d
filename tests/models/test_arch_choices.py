"""The modern architecture choices (QK-norm, ReLU^2, zero-initialised output projections, logit
soft-capping, value embeddings) are config fields, off in every preset, and each does what it says; the presets that
reproduce cramming, BERT, GPT-2 and llama keep their parameter counts and stock exports."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cramlm.config.loader import load_preset
from cramlm.config.registry import config_class
from cramlm.models import build_model
from cramlm.models.hf import stock_architecture
from cramlm.models.model import linear_cross_entropy
from tests.models.helpers import VOCAB, random_ids, tiny_model

FIELDS = {"qk_norm": False, "zero_init_out": False, "logit_softcap": None, "value_embeddings": 0}
# full-size parameter counts at vocab 32768, as before the fields existed (counted on main, meta device)
FAITHFUL = {
    "crammed-bert": 119_589_889,
    "bert-original": 111_241_472,
    "gpt2": 111_008_256,
    "llama-small": 125_848_320,
}
PRESETS = ["crammed-bert", "crammed-bert-tiny", "crammed-bert-base", "crammed-bert-small", "crammed-bert-large",
           "crammed-bert-modern", "bert-original", "bert-original-tiny", "bert-original-small", "bert-original-large",
           "gpt2", "gpt2-tiny", "gpt2-60m", "llama-small", "llama-tiny"]


def full(name: str):
    data = dict(load_preset("arch", name))
    return config_class("model", data["type"]).model_validate(data)


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_leaves_the_modern_choices_off(name):
    cfg = full(name)
    assert {k: getattr(cfg, k) for k in FIELDS} == FIELDS and cfg.activation != "relu2"


@pytest.mark.parametrize("name,count", FAITHFUL.items())
def test_faithful_presets_keep_their_parameter_counts_and_stock_class(name, count):
    cfg = full(name)
    with torch.device("meta"):
        model = build_model(cfg, 32768)
    assert sum(p.numel() for p in model.parameters()) == count
    assert stock_architecture(cfg) == {"crammed-bert": None, "bert-original": "bert", "gpt2": "gpt2", "llama-small": "llama"}[name]


@pytest.mark.parametrize("name", ["gpt2-tiny", "llama-tiny", "crammed-bert-tiny"])
def test_qk_norm_normalises_each_head(name):
    plain, normed = tiny_model(name), tiny_model(name, qk_norm=True)
    D = plain.cfg.hidden_size // plain.cfg.num_heads
    extra = sum(p.numel() for p in normed.parameters()) - sum(p.numel() for p in plain.parameters())
    assert extra == plain.cfg.num_layers * 2 * D  # one (D,) gain for q, one for k, per layer
    assert stock_architecture(normed.cfg) is None
    attn = normed.trunk.blocks[0].attn
    seen = {}
    attn.q_norm.register_forward_hook(lambda m, i, o: seen.update(q=(i[0], o)))  # (returns None: output kept)
    with torch.no_grad():
        attn.q_norm.weight.fill_(1.0)
        normed(random_ids())
    x, y = seen["q"]
    assert x.shape[-1] == D and torch.allclose(y.pow(2).mean(-1), torch.ones(()), atol=5e-3)  # RMS 1 per head (eps aside)


def test_relu2_mlp():
    model = tiny_model("gpt2-tiny", activation="relu2")
    ffn = model.trunk.blocks[0].ffn
    x = torch.randn(2, 3, model.cfg.hidden_size)
    with torch.no_grad():
        torch.testing.assert_close(ffn(x), ffn.down(F.relu(ffn.up(x)) ** 2))
    assert stock_architecture(model.cfg) is None


@pytest.mark.parametrize("name", ["gpt2-tiny", "crammed-bert-tiny"])
def test_zero_init_out_zeroes_the_residual_projections_only(name):
    torch.manual_seed(0)
    cfg = tiny_model(name).cfg.model_copy(update={"zero_init_out": True})
    model = build_model(cfg, VOCAB)
    for block in model.trunk.blocks:
        assert not block.attn.out.weight.any() and not block.ffn.down.weight.any()
        assert block.attn.qkv.weight.std() > 0.01 and block.ffn.up.weight.std() > 0.01
    ids = random_ids()
    model.eval()
    with torch.no_grad():  # each block starts as the identity: the trunk is the embeddings, normed
        t = model.trunk
        x = t.tokens(ids) + (t.positions(torch.arange(ids.shape[1])[None]) if t.positions is not None else 0)
        torch.testing.assert_close(model.encode(ids), t.final_norm(t.embedding_norm(x)))
    assert stock_architecture(cfg) == stock_architecture(tiny_model(name).cfg)  # an init: the export is unchanged


@pytest.mark.parametrize("name", ["gpt2-tiny", "llama-tiny", "crammed-bert-tiny"])
def test_logit_softcap_bounds_the_logits_and_the_fused_loss_follows(name):
    plain, capped = tiny_model(name), tiny_model(name, logit_softcap=0.5)
    ids = random_ids()
    with torch.no_grad():
        ref, got = plain(ids)["logits"], capped(ids)["logits"]
    torch.testing.assert_close(got, 0.5 * torch.tanh(ref / 0.5))
    assert got.abs().max() < 0.5 and stock_architecture(capped.cfg) is None
    labels = ids.clone()
    labels[:, ::3] = -100
    capped.train()
    out = capped(ids, labels=labels)
    out["loss"].backward()
    fused = {n: p.grad.clone() for n, p in capped.named_parameters()}
    capped.zero_grad()
    logits = capped(ids)["logits"]
    if capped.cfg.objective == "clm":
        logits, labels = logits[:, :-1], labels[:, 1:]
    manual = F.cross_entropy(logits.float().reshape(-1, VOCAB), labels.reshape(-1))
    manual.backward()
    torch.testing.assert_close(out["loss"], manual)
    for n, p in capped.named_parameters():
        torch.testing.assert_close(fused[n], p.grad, rtol=1e-4, atol=1e-6, msg=n)


@pytest.mark.parametrize("name", ["gpt2-tiny", "llama-tiny"])
def test_value_embeddings_feed_the_values_of_the_mirrored_layers(name):
    import pydantic

    import cramlm.models.model as model_module
    from cramlm.pipeline.scaling import non_embedding_parameters

    plain, ve = tiny_model(name, num_layers=5), tiny_model(name, num_layers=5, value_embeddings=2)
    K, D = ve.cfg.num_kv_heads or ve.cfg.num_heads, ve.cfg.hidden_size // ve.cfg.num_heads
    assert [b.attn.value_gate is not None for b in ve.trunk.blocks] == [True, True, False, True, True]
    assert ve.trunk.value_table == [0, 1, None, 1, 0]  # table i: layers i and L-1-i
    extra = sum(p.numel() for p in ve.parameters()) - sum(p.numel() for p in plain.parameters())
    assert extra == 2 * VOCAB * K * D + 4  # two tables, one gate per fed layer
    assert non_embedding_parameters(ve) == non_embedding_parameters(plain) + 4  # the tables are embeddings
    assert stock_architecture(ve.cfg) is None
    ids = random_ids()
    with torch.no_grad():  # zero tables: exactly the plain model (same weights otherwise)
        ve.load_state_dict(plain.state_dict(), strict=False)
        for table in ve.trunk.value_embeds:
            table.weight.zero_()
        torch.testing.assert_close(ve(ids)["logits"], plain(ids)["logits"])
        inputs, values = {}, []
        attn = ve.trunk.blocks[3].attn  # fed by table 1: its values are v + gate * table[ids]
        attn.register_forward_hook(lambda m, i, o: inputs.update(x=i[0]))
        ve.trunk.value_embeds[1].weight.normal_()
        sdpa = model_module.F.scaled_dot_product_attention
        model_module.F.scaled_dot_product_attention = lambda q, k, v, **kw: values.append(v) or sdpa(q, k, v, **kw)
        try:
            out = ve(ids)["logits"]
        finally:
            model_module.F.scaled_dot_product_attention = sdpa
        assert not torch.allclose(out, plain(ids)["logits"])
        x = inputs["x"]
        B, T, _ = x.shape
        v = attn.qkv(x).view(B, T, -1, D)[:, :, -K:].transpose(1, 2)  # (B, K, T, D)
        gate = attn.value_gate
        torch.testing.assert_close(values[3], v + gate * ve.trunk.value_embeds[1](ids).view(B, T, K, D).transpose(1, 2))
    with pytest.raises(pydantic.ValidationError, match="value_embeddings 4 > .num_layers"):
        tiny_model(name, num_layers=5, value_embeddings=4)


def test_softcapped_linear_cross_entropy_in_chunks():
    torch.manual_seed(0)
    hidden, weight = torch.randn(37, 8, requires_grad=True), torch.randn(50, 8, requires_grad=True)
    targets = torch.randint(0, 50, (37,))
    loss = linear_cross_entropy(hidden, weight, None, targets, rows=8, softcap=2.0)
    ref = F.cross_entropy(2.0 * torch.tanh(hidden @ weight.T / 2.0), targets)
    torch.testing.assert_close(loss, ref)
    g = torch.autograd.grad(loss, (hidden, weight))
    torch.testing.assert_close(g, torch.autograd.grad(ref, (hidden, weight)))


def test_qk_norm_under_bf16_autocast_takes_the_fused_kernel():
    """Under bf16 autocast the QKV projection hands bf16 queries and keys to the norm: it runs in
    float32 (as autocast runs the other norms), so RMSNorm's fused kernel is taken (torch warns
    'Mismatch dtype' when it falls back), and attention still gets bf16."""
    import warnings

    model = tiny_model("llama-tiny", qk_norm=True)
    attn = model.trunk.blocks[0].attn
    seen = {}
    attn.q_norm.register_forward_hook(lambda m, i, o: seen.update(inp=i[0].dtype, out=o.dtype))
    with warnings.catch_warnings(record=True) as caught, torch.autocast("cpu", dtype=torch.bfloat16):
        warnings.simplefilter("always")
        model(random_ids())
    assert not [w for w in caught if "Mismatch dtype" in str(w.message)]
    assert seen == {"inp": torch.float32, "out": torch.float32}
