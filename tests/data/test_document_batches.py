"""Masked-LM batches from document-aware packing: the collator keeps the boundaries the dataset
gives (so the model confines attention to each document: FlexAttention block masks on a GPU),
never masks padding, and draws the same masks as for bare ids."""

from __future__ import annotations

import numpy as np
import torch

from cramlm.data.collate import MLMCollator
from cramlm.data.cramtok import PackedWriter, read_packed
from cramlm.train.batches import StepData
from tests.data.helpers import DocumentPackedDataset
from tests.models.helpers import tiny_model


def test_mlm_batches_of_packed_documents(tmp_path):
    rng = np.random.default_rng(0)
    with PackedWriter(tmp_path / "p.cramtok", 300) as w:
        for n in (5, 9, 30, 3, 14, 20, 7, 11):
            w.add(rng.integers(5, 300, n))
    ds = DocumentPackedDataset(read_packed(w.path), 32, pad_id=0)
    data = StepData(ds, MLMCollator(300, mask_id=4, num_special=5, mlm_probability=0.4, seed=0), seed=0)
    batch = data.take(4)
    assert set(batch) == {"input_ids", "labels", "document_ids", "position_ids", "attention_mask"}
    padding = batch["attention_mask"] == 0
    assert padding.any() and (batch["labels"][padding] == -100).all() and (batch["input_ids"][padding] == 0).all()
    assert (batch["labels"] != -100).sum() > 10
    # the same seed and positions give the same masks for bare ids (no padding here: pad id 0 is special anyway)
    ids = ds.batch(np.arange(4))["input_ids"]
    a = MLMCollator(300, 4, 5, 0.4, seed=1)(ids)
    b = MLMCollator(300, 4, 5, 0.4, seed=1)({"input_ids": ids, "attention_mask": (ids != 0).long()})
    assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["labels"], b["labels"])
    # and a model trains on it: documents kept apart, positions from the dataset
    model = tiny_model("crammed-bert-tiny").train()
    model.zero_grad()
    loss = model(**batch)["loss"]
    loss.backward()
    assert torch.isfinite(loss) and model.trunk.tokens.weight.grad.abs().sum() > 0


def test_cut_documents_keep_positions_inside_the_block(tmp_path):
    """A document longer than a block is cut; its later pieces must not carry positions past the
    block length, or a model with an absolute position table of that length cannot take them."""
    from cramlm.data.dataset import BlockDataset

    with PackedWriter(tmp_path / "p.cramtok", 300) as w:
        w.add(np.arange(5, 75))  # 70 tokens: several blocks of 16
        w.add(np.arange(5, 12))
    packed = read_packed(w.path)
    model = tiny_model("bert-original-tiny", max_seq_length=16)  # learned positions, 16 of them
    for batch in (DocumentPackedDataset(packed, 16, pad_id=0).batch(np.arange(5)),
                  BlockDataset(packed, 16, cls_id=2).batch_with_boundaries(np.arange(4))):
        assert batch["position_ids"].max() < 16
        with torch.no_grad():
            model.encode(batch["input_ids"], attention_mask=batch.get("attention_mask"),
                         position_ids=batch["position_ids"], document_ids=batch["document_ids"])
