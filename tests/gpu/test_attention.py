"""Which attention kernel runs. Plain encoder and causal batches must take SDPA's flash kernel,
padded ones flash or memory-efficient (never the math fallback, which materialises the T x T
scores), and packed documents FlexAttention's block-sparse kernel with the same results as the
dense mask. Each check runs under ``sdpa_kernel`` limited to the allowed backends, where SDPA
raises instead of falling back."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from cramlm.models import model as modeling
from cramlm.train.impl import autocast
from tests.gpu.helpers import WIDE
from tests.models.helpers import random_ids, tiny_model

pytestmark = pytest.mark.cuda

MODELS = ["crammed-bert-tiny", "crammed-bert-modern", "gpt2-tiny", "llama-tiny"]  # llama: grouped-query
FAST = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]


def step(model, ids, dtype=torch.bfloat16, attention_mask=None, **inputs) -> torch.Tensor:
    """Forward + backward under autocast (dtype None: fp32); returns the hidden states."""
    with autocast(ids.device, dtype):
        hidden = model.encode(ids, attention_mask=attention_mask, **inputs)
    scored = hidden if attention_mask is None else hidden[attention_mask.bool()]
    scored.float().square().mean().backward()
    return hidden


def packed(device, B: int = 2, T: int = 64):
    """A batch of packed documents with padding at the end of the second row."""
    ids = random_ids(B, T).to(device)
    docs = torch.tensor([[0] * 20 + [1] * 30 + [2] * 14, [0] * 9 + [1] * 40 + [-1] * 15], device=device)
    mask = (docs >= 0).long()
    return ids, docs, mask


@pytest.mark.parametrize("name", MODELS)
def test_plain_batches_take_the_flash_kernel(name, device):
    model = tiny_model(name, **WIDE).train().to(device)
    ids = random_ids(4, 64).to(device)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):  # encoder: no mask; decoder: is_causal, no mask
        step(model, ids)


@pytest.mark.parametrize("name", MODELS)
def test_padded_batches_avoid_the_math_kernel(name, device):
    if device.type == "cpu":
        pytest.skip("the memory-efficient kernel is CUDA-only")
    model = tiny_model(name, **WIDE).train().to(device)
    ids, _, mask = packed(device)
    with sdpa_kernel(FAST):
        step(model, ids, attention_mask=mask)


def rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


# an encoder and a causal grouped-query decoder: each variant compiles its own flex kernels
@pytest.mark.parametrize("name", ["crammed-bert-tiny", "llama-tiny"])
def test_packed_documents_take_flex_attention_and_match_the_dense_mask(name, device, monkeypatch):
    model = tiny_model(name, **WIDE).train().to(device)
    ids, docs, mask = packed(device)
    cpu = device.type == "cpu"
    head_dim = model.cfg.hidden_size // model.cfg.num_heads
    # auto takes flex on CUDA only past one 128-token block (flex_pays): not at this batch's 64 tokens
    assert modeling.use_block_mask(docs, head_dim, 0.0, "auto") == (not cpu and docs.shape[1] > modeling.FLEX_BLOCK)
    assert modeling.use_block_mask(torch.zeros(2, 256, dtype=torch.long, device=device), head_dim, 0.0, "auto") == (not cpu)
    model.trunk.document_kernel = "flex"
    if cpu:  # FlexAttention has no CPU backward: compare forwards there
        model.eval()
    assert modeling.use_block_mask(docs, head_dim, 0.0, model.trunk.document_kernel)
    block, _ = modeling.attention_mask_for(mask, docs, model.trunk.causal, docs.shape[1], block_mask=True)
    assert isinstance(block, modeling.BlockMask)
    keep = mask.bool()

    def run(mode: str, dtype):
        model.trunk.document_kernel = mode
        model.zero_grad(set_to_none=True)
        if cpu:
            with torch.no_grad(), autocast(device, dtype):
                return model.encode(ids, attention_mask=mask, document_ids=docs).float(), {}
        # flex must not call SDPA: with the flash kernel alone, SDPA would raise on a dense mask
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION] if mode == "flex" else FAST):
            hidden = step(model, ids, dtype, attention_mask=mask, document_ids=docs).float()
        return hidden, {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}

    # fp32 (no autocast), then bf16 autocast: rounding of bf16 operands, about 1e-2 relative
    for dtype, tol in ((None, 1e-4), (torch.bfloat16, 2e-2)):
        flex_h, flex_g = run("flex", dtype)
        dense_h, dense_g = run("dense", dtype)
        assert torch.isfinite(flex_h).all() and torch.isfinite(dense_h).all()  # padding rows too
        assert rel_error(flex_h[keep], dense_h[keep]) < tol
        assert flex_g.keys() == dense_g.keys()
        for n in dense_g:
            assert rel_error(flex_g[n], dense_g[n]) < 2 * tol, n
