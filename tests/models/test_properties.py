"""Properties every model must have: rotary positions rotate, decoders do not see the future,
document masking isolates documents, sparse prediction equals dense, FLOPs match the counter."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from cramlm.models.heads import SequenceClassifier
from cramlm.models.model import Rotary, apply_rotary, positions_from_documents
from tests.models.helpers import VOCAB, random_ids, tiny_model

ENCODERS = ["crammed-bert-tiny", "bert-original-tiny", "crammed-bert-modern"]
DECODERS = ["gpt2-tiny", "llama-tiny"]
ALL = ENCODERS + DECODERS


def hidden(model, ids, **kw):
    with torch.no_grad():
        return model.encode(ids, **kw)


def test_rotary_rotates_and_depends_only_on_relative_position():
    D, theta = 16, 10000.0
    rope = Rotary(D, theta)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 1, D, generator=g), torch.randn(1, 1, 1, D, generator=g)

    def score(m: int, n: int) -> torch.Tensor:
        cos_m, sin_m = rope(torch.tensor([[m]]))
        cos_n, sin_n = rope(torch.tensor([[n]]))
        return (apply_rotary(q, cos_m, sin_m) * apply_rotary(k, cos_n, sin_n)).sum()

    for shift in (1, 7, 300):
        torch.testing.assert_close(score(3, 10), score(3 + shift, 10 + shift), rtol=1e-4, atol=1e-5)
    assert not torch.allclose(score(3, 10), score(3, 11), atol=1e-3)  # relative position matters
    cos, sin = rope(torch.tensor([[5]]))
    assert not torch.allclose(apply_rotary(q, cos, sin), q, atol=1e-3)  # it really rotates
    torch.testing.assert_close(apply_rotary(q, cos, sin).norm(), q.norm())  # ... and only rotates


@pytest.mark.parametrize("name", ["llama-tiny", "crammed-bert-modern"])
def test_rope_model_is_invariant_to_a_global_position_shift(name):
    model, ids = tiny_model(name, init_std=0.3), random_ids()  # large weights: sharp attention
    T = ids.shape[1]
    base = hidden(model, ids)
    shifted = hidden(model, ids, position_ids=torch.arange(T)[None] + 11)
    torch.testing.assert_close(base, shifted, rtol=1e-4, atol=1e-4)
    scrambled = hidden(model, ids, position_ids=torch.arange(T).flip(0)[None])
    assert not torch.allclose(base, scrambled, atol=1e-3)  # positions are not ignored


@pytest.mark.parametrize("name", DECODERS)
def test_decoders_do_not_see_the_future(name):
    model, ids = tiny_model(name), random_ids()
    changed = ids.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % VOCAB
    a, b = hidden(model, ids), hidden(model, changed)
    torch.testing.assert_close(a[:, :10], b[:, :10])
    assert not torch.allclose(a[:, 10:], b[:, 10:], atol=1e-4)


@pytest.mark.parametrize("name", ENCODERS)
def test_encoders_see_both_directions(name):
    model, ids = tiny_model(name), random_ids()
    changed = ids.clone()
    changed[:, -1] = (changed[:, -1] + 1) % VOCAB
    assert not torch.allclose(hidden(model, ids)[:, 0], hidden(model, changed)[:, 0], atol=1e-5)


@pytest.mark.parametrize("name", ALL)
def test_document_masking_isolates_documents_and_resets_positions(name):
    model, ids = tiny_model(name), random_ids(B=1, T=20)
    docs = torch.tensor([[0] * 8 + [1] * 12])
    packed = hidden(model, ids, document_ids=docs)
    # each document alone gives the same states: no attention across, positions restart at 0
    torch.testing.assert_close(packed[:, :8], hidden(model, ids[:, :8]), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(packed[:, 8:], hidden(model, ids[:, 8:]), rtol=1e-4, atol=1e-5)
    # without the document ids, the second document does see the first
    assert not torch.allclose(hidden(model, ids)[:, 8:], packed[:, 8:], atol=1e-4)


def test_positions_from_documents():
    docs = torch.tensor([[4, 4, 4, 7, 7, 2, 2, 2, 2], [0, 0, 0, 0, 0, 0, 0, 0, 1]])
    expected = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5, 6, 7, 0]])
    assert torch.equal(positions_from_documents(docs), expected)


@pytest.mark.parametrize("name", ["crammed-bert-tiny", "crammed-bert-modern"])
def test_sparse_prediction_loss_equals_dense(name):
    ids = random_ids(B=3, T=16)
    labels = torch.full_like(ids, -100)
    labels[:, ::4] = ids[:, ::4]
    sparse = tiny_model(name, sparse_prediction=True)
    dense = tiny_model(name, sparse_prediction=False)
    dense.load_state_dict(sparse.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(sparse(ids, labels=labels)["loss"], dense(ids, labels=labels)["loss"])


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_fused_linear_cross_entropy_equals_the_plain_one(dtype, bias):
    """Loss and gradients of the fused, chunked decoder + loss equal F.linear + F.cross_entropy,
    with the decoder tied to an embedding (its gradient adds to the embedding's) and under autocast."""
    from cramlm.models.model import linear_cross_entropy

    g = torch.Generator().manual_seed(0)
    M, H, V = 37, 16, 50
    hidden = torch.randn(M, H, generator=g, requires_grad=True)
    emb = torch.nn.Embedding(V, H)
    b = torch.nn.Parameter(torch.randn(V, generator=g)) if bias else None
    targets = torch.randint(0, V, (M,), generator=g)
    ids = torch.randint(0, V, (5,), generator=g)

    def run(fused: bool):
        for t in (hidden, emb.weight, b):
            if t is not None:
                t.grad = None
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            if fused:
                loss = linear_cross_entropy(hidden, emb.weight, b, targets, rows=8)  # 5 chunks, the last one short
            else:
                loss = torch.nn.functional.cross_entropy(torch.nn.functional.linear(hidden, emb.weight, b).float(), targets)
            (3.0 * loss + emb(ids).sum()).backward()  # a scaled loss; the tied weight also gets the embedding's gradient
        return loss.detach(), hidden.grad.clone(), emb.weight.grad.clone(), None if b is None else b.grad.clone()

    tol = dict(rtol=1e-5, atol=1e-6) if dtype is None else dict(rtol=2e-2, atol=2e-3)
    reference = run(False)
    for mine, ref in zip(run(True), reference):
        if ref is not None:
            torch.testing.assert_close(mine, ref, **tol)
    with torch.no_grad(), torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        torch.testing.assert_close(linear_cross_entropy(hidden, emb.weight, b, targets), reference[0], **tol)  # loss alone


def test_clm_loss_shifts_labels():
    model, ids = tiny_model("gpt2-tiny"), random_ids()
    with torch.no_grad():
        out = model(ids, labels=ids)
        logits = model(ids)["logits"]
    manual = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
    torch.testing.assert_close(out["loss"], manual)


@pytest.mark.parametrize("name", ["gpt2-tiny", "llama-tiny"])
def test_fused_causal_loss_and_gradients_match_the_logits_path(name):
    """The causal head is fused with the loss (no (B, T, V) logits); loss and every gradient are
    those of logits -> float -> cross_entropy, unscored (-100) positions left out."""
    model, ids = tiny_model(name).train(), random_ids()
    labels = ids.clone()
    labels[0, 3:7] = -100
    out = model(ids, labels=labels)
    assert out["logits"] is None
    out["loss"].backward()
    fused = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    logits = model(ids)["logits"]
    manual = torch.nn.functional.cross_entropy(logits[:, :-1].float().reshape(-1, VOCAB), labels[:, 1:].reshape(-1))
    manual.backward()
    torch.testing.assert_close(out["loss"], manual)
    for n, p in model.named_parameters():
        torch.testing.assert_close(fused[n], p.grad, rtol=1e-4, atol=1e-6, msg=n)


def counted_flops(fn) -> int:
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:  # math: attention as bmm
        fn()
    return counter.get_total_flops()


@pytest.mark.parametrize("name", ALL + ["gpt2-60m"])
def test_flops_per_token_match_the_counter(name):
    model = tiny_model(name).train()
    B, T = 2, 16
    ids = random_ids(B, T)
    labels = ids.clone()
    predicted_fraction = 1.0
    if model.cfg.objective == "mlm":
        labels = torch.full_like(ids, -100)
        labels[:, ::4] = ids[:, ::4]  # 8 of 32 positions scored: the trainer passes this share, the model
        predicted_fraction = 0.25  # knows whether its head runs on them alone (sparse) or on every position

    with torch.no_grad():  # the forward alone (with gradients on, the fused MLM loss also forms them)
        forward = counted_flops(lambda: model(ids, labels=labels))
    kw = {"predicted_fraction": predicted_fraction} if model.cfg.objective == "mlm" else {}
    assert forward == pytest.approx(model.forward_flops_per_token(T, **kw) * B * T, rel=1e-9)
    train = counted_flops(lambda: model(ids, labels=labels)["loss"].backward())
    assert train == pytest.approx(model.flops_per_token(T, **kw) * B * T, rel=1e-9)


def test_sequence_classifier_pooling_and_regression():
    encoder = tiny_model("crammed-bert-tiny")
    ids, mask = random_ids(B=2, T=12), torch.ones(2, 12, dtype=torch.long)
    mask[1, 6:] = 0
    clf = SequenceClassifier(encoder, num_labels=3, pooling="mean").eval()
    out = clf(ids, mask, labels=torch.tensor([0, 2]))
    assert out["logits"].shape == (2, 3) and out["loss"].ndim == 0
    padded_tail = ids.clone()
    padded_tail[1, 6:] = 7  # what sits under the padding must not matter with mean pooling
    with torch.no_grad():
        torch.testing.assert_close(clf(ids, mask)["logits"], clf(padded_tail, mask)["logits"])
    reg = SequenceClassifier(encoder, num_labels=1)
    out = reg(ids, mask, labels=torch.tensor([0.5, 3.0]))
    assert out["logits"].shape == (2, 1) and out["loss"] > 0


def test_weight_tying_and_init_schemes():
    gpt = tiny_model("gpt2-tiny", num_layers=8, hidden_size=256, intermediate_size=1024)
    assert gpt.lm_head.weight is gpt.trunk.tokens.weight
    llama = tiny_model("llama-tiny")
    assert llama.lm_head.weight is not llama.trunk.tokens.weight  # llama presets are untied
    block = gpt.trunk.blocks[0]
    assert block.attn.qkv.weight.std().item() == pytest.approx(0.02, rel=0.05)
    scaled = 0.02 / (2 * 8) ** 0.5  # GPT-2: residual outputs get std / sqrt(2 L)
    assert block.attn.out.weight.std().item() == pytest.approx(scaled, rel=0.05)
    assert block.ffn.down.weight.std().item() == pytest.approx(scaled, rel=0.05)
    bert = tiny_model("crammed-bert-tiny", hidden_size=256, intermediate_size=1024)  # init: normal
    assert bert.trunk.blocks[0].attn.out.weight.std().item() == pytest.approx(0.02, rel=0.05)


def test_config_rejects_inconsistent_shapes():
    from pydantic import ValidationError

    from tests.models.helpers import preset

    with pytest.raises(ValidationError, match="do not divide"):
        preset("llama-tiny", num_kv_heads=3)
    # a post-norm block without its first norm would never normalise layer 0's residual (was: silently so)
    with pytest.raises(ValidationError, match="under norm_scheme=post it would drop that layer's residual norm"):
        preset("bert-original-tiny", first_attn_norm=False)
    assert not preset("crammed-bert-modern", first_attn_norm=False).first_attn_norm  # pre-norm: ModernBERT's choice


@pytest.mark.parametrize("name", ["gpt2-tiny", "llama-tiny"])
def test_left_padding_in_decoders_stays_finite(name):
    """A left-padded row's first queries see no real key (older torch returns NaN for such rows and
    0 * NaN spreads it); padding must neither poison the batch nor change the real tokens."""
    model = tiny_model(name).eval()
    ids = random_ids(2, 10)
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[0, :4] = 0
    with torch.no_grad():
        logits = model(ids, attention_mask=mask)["logits"]
        alone = model(ids[:1, 4:])["logits"]
    assert torch.isfinite(logits).all()
    if name == "llama-tiny":  # RoPE is relative: the padded row equals the same tokens unpadded
        torch.testing.assert_close(logits[0, 4:], alone[0], atol=1e-4, rtol=1e-4)


def full_size(name: str, vocab: int, **overrides) -> torch.nn.Module:
    """A preset at its real size on the meta device (shapes only: no memory, no init time)."""
    from cramlm.config.loader import load_preset
    from cramlm.config.registry import config_class
    from cramlm.models import build_model

    data = {**load_preset("arch", name), **overrides}
    with torch.device("meta"):
        return build_model(config_class("model", data["type"]).model_validate(data), vocab)


def test_parameter_counts_equal_the_reference_models():
    # cramming's own crammed-bert (skip_head_transform: the MLM head is the tied decoder alone)
    crammed = full_size("crammed-bert", 32768)
    assert sum(p.numel() for p in crammed.parameters()) == 119_589_889
    assert not hasattr(crammed.head, "dense")
    # with BERT's dense + GELU + LayerNorm transform: 768 * 768 + 2 * 768 more
    with_transform = full_size("crammed-bert", 32768, head_transform=True)
    assert sum(p.numel() for p in with_transform.parameters()) == 119_589_889 + 591_360
    # bert-original keeps the transform: transformers' BertForMaskedLM (bert-base-uncased) has 109,514,298
    assert sum(p.numel() for p in full_size("bert-original", 30522).parameters()) == 109_514_298


def test_mlm_head_without_transform_is_the_tied_decoder_alone():
    model = tiny_model("crammed-bert-tiny")
    assert not model.cfg.head_transform and model.head.decoder.weight is model.trunk.tokens.weight
    ids = random_ids()
    with torch.no_grad():
        torch.testing.assert_close(model(ids)["logits"], model.encode(ids) @ model.trunk.tokens.weight.T)


def test_crammed_bert_classifier_is_crammings_glue_sane_head():
    """first token -> dense 768 -> 1024 (with bias) -> tanh -> dropout -> linear 1024 -> labels."""
    with torch.device("meta"):
        clf = SequenceClassifier(full_size("crammed-bert", 32768), num_labels=3)
    assert (clf.pooler.in_features, clf.pooler.out_features, clf.pooler.bias is not None) == (768, 1024, True)
    assert (clf.classifier.in_features, clf.classifier.out_features) == (1024, 3) and clf.pooling == "first"
    with torch.device("meta"):  # BERT's pooler keeps the hidden width
        assert SequenceClassifier(full_size("bert-original", 30522), num_labels=2).pooler.out_features == 768
    # the computation, on a small model with a wider pooler
    encoder = tiny_model("crammed-bert-tiny", pooler_size=48)
    clf = SequenceClassifier(encoder, num_labels=2, dropout=0.5).eval()
    ids = random_ids()
    with torch.no_grad():
        expected = clf.classifier(torch.tanh(clf.pooler(encoder.encode(ids)[:, 0])))
        torch.testing.assert_close(clf(ids)["logits"], expected)
    clf.train()  # dropout sits between the tanh and the labels
    torch.manual_seed(0)
    with torch.no_grad():
        assert not torch.allclose(clf(ids)["logits"], expected)
