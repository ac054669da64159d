"""Packed documents without a dense mask: the FlexAttention block mask (the CUDA default, see
model.Trunk.document_kernel, impl.document_attention_kernel) gives exactly what the dense SDPA mask gives. Here on the CPU, forward
only (FlexAttention has no CPU backward); tests/gpu/test_attention.py checks forward, backward
and the kernels on a GPU."""

from __future__ import annotations

import pytest
import torch

from cramlm.models import model as modeling
from tests.models.helpers import random_ids, tiny_model

pytestmark = pytest.mark.skipif(modeling.BlockMask is None, reason="torch without FlexAttention")
WIDE = dict(hidden_size=64, num_heads=4, intermediate_size=128)  # head dim 16


def packed_batch(T: int = 24):
    ids = random_ids(2, T)
    docs = torch.tensor([[0] * 7 + [1] * 10 + [2] * (T - 17), [0] * 11 + [1] * (T - 16) + [-1] * 5])
    return ids, docs, (docs >= 0).long()


@pytest.mark.parametrize("name", ["crammed-bert-tiny", "llama-tiny"])  # bidirectional; causal + grouped-query
def test_block_mask_gives_the_dense_masks_results(name):
    model = tiny_model(name, **WIDE)
    ids, docs, mask = packed_batch()
    outputs = {}
    for mode in ("dense", "flex"):
        model.trunk.document_kernel = mode
        with torch.no_grad():
            outputs[mode] = model.encode(ids, attention_mask=mask, document_ids=docs)
    keep = mask.bool()
    torch.testing.assert_close(outputs["flex"][keep], outputs["dense"][keep], rtol=1e-5, atol=1e-5)
    assert torch.isfinite(outputs["flex"]).all() and torch.isfinite(outputs["dense"]).all()


@pytest.mark.parametrize("causal", [False, True])
def test_block_mask_is_the_dense_mask(causal):
    _, docs, mask = packed_batch()
    T = docs.shape[1]
    dense, _ = modeling.attention_mask_for(mask, docs, causal, T)
    block, _ = modeling.attention_mask_for(mask, docs, causal, T, block_mask=True)
    assert isinstance(block, modeling.BlockMask)
    q, kv = torch.arange(T)[:, None], torch.arange(T)[None, :]
    for b in range(2):
        expected = torch.stack([torch.stack([block.mask_mod(torch.tensor(b), 0, i, j) for j in kv[0]]) for i in q[:, 0]])
        assert torch.equal(expected, dense[b, 0])


def test_every_query_sees_a_key():
    """A padding document's queries see only padding keys, which the padding mask hides: without a
    key, SDPA kernels may give NaN, and 0 * NaN spreads through the next layer. Each sees itself."""
    _, docs, mask = packed_batch()
    for causal in (False, True):
        dense, _ = modeling.attention_mask_for(mask, docs, causal, docs.shape[1])
        assert dense.any(dim=-1).all()


def test_when_the_block_mask_is_used():
    docs = torch.zeros(2, 8, dtype=torch.long)
    assert not modeling.use_block_mask(docs, 16, 0.0)  # auto: on CUDA only (here: the dense mask)
    # auto on CUDA: only past one block, where the block mask can skip the blocks between documents
    assert [modeling.flex_pays("cuda", T) for T in (64, 128, 129, 512)] == [False, False, True, True]
    assert not modeling.flex_pays("cpu", 512)
    assert modeling.use_block_mask(docs, 16, 0.0, "flex") and modeling.use_block_mask(docs, 64, 0.0, "flex")
    assert not modeling.use_block_mask(None, 16, 0.0, "flex")
    assert not modeling.use_block_mask(docs, 8, 0.0, "flex") and not modeling.use_block_mask(docs, 24, 0.0, "flex")  # torch 2.5's head dims
    assert not modeling.use_block_mask(docs, 16, 0.1, "flex")  # attention dropout: FlexAttention has none
    assert not modeling.use_block_mask(docs, 16, 0.0, "dense")


def test_the_kernel_is_set_from_the_impl_config():
    from cramlm.train.impl import ImplConfig
    from cramlm.train.parallelize import set_document_kernel

    model = tiny_model("crammed-bert-tiny", **WIDE)
    assert model.trunk.document_kernel == "auto"
    set_document_kernel(model, ImplConfig(document_attention_kernel="flex").document_attention_kernel)
    assert model.trunk.document_kernel == "flex"
