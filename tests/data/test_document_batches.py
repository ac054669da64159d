"""Masked-LM batches from document-aware packing: the collator keeps the boundaries the dataset
gives (so the model confines attention to each document: FlexAttention block masks on a GPU),
never masks padding, and draws the same masks as for bare ids."""

from __future__ import annotations

import numpy as np
import torch

from cramlm.data.collate import MLMCollator
from cramlm.data.dataset import DocumentPackedDataset
from cramlm.data.packed import PackedWriter, read_packed
from cramlm.train.trainer import StepData
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
    # the same generator state gives the same masks for bare ids (no padding here: pad id 0 is special anyway)
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
