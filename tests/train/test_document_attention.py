"""train.document_attention: pretrain batches carry each block's document boundaries, so a token
attends only within its own document (the models take ``document_ids``)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from cramlm.data.collate import MLMCollator
from cramlm.data.cramtok import PackedWriter, read_packed
from cramlm.data.dataset import BlockDataset
from cramlm.data.collate import causal_collate
from cramlm.train.batches import StepData

from .helpers import CAUSAL, losses, run_inprocess


def blocks(tmp_path, cls_id):
    with PackedWriter(tmp_path / "p.cramtok", 100) as w:
        for n in (5, 3, 12, 1, 7, 4):  # 32 tokens, 6 documents
            w.add(np.arange(10, 10 + n))
    return BlockDataset(read_packed(w.path), 8, cls_id)


def test_step_data_draws_document_boundaries_when_on(tmp_path):
    ds = blocks(tmp_path, cls_id=None)
    on = StepData(ds, causal_collate, seed=0, documents=True).take(4)
    assert set(on) == {"input_ids", "labels", "document_ids", "position_ids"}
    order = StepData(ds, causal_collate, seed=0).order.take(4)  # the same stream either way
    assert torch.equal(on["document_ids"], torch.from_numpy(np.stack([ds.boundaries(int(i))["document_ids"] for i in order])))
    assert set(StepData(ds, causal_collate, seed=0).take(4)) == {"input_ids", "labels"}  # off: plain blocks
    mlm = StepData(blocks(tmp_path, cls_id=2), MLMCollator(100, 4, 5, 0.25), seed=0, documents=True).take(2)
    assert {"document_ids", "position_ids", "labels"} <= set(mlm) and mlm["document_ids"].shape == (2, 8)


def test_pretrain_with_document_attention(tmp_path, monkeypatch):
    first = []
    sequences = StepData.sequences

    def recording(self, positions):  # the real one; keeps the first batch to look at
        batch = sequences(self, positions)
        if not first:
            first.append(batch)
        return batch

    monkeypatch.setattr(StepData, "sequences", recording)
    # short documents (~12 tokens), so most 32-token blocks hold several
    rng, words = random.Random(0), "the whale sea ship captain ahab white boat harpoon deck crew storm".split()
    corpus = tmp_path / "short.jsonl"
    corpus.write_text("".join(json.dumps({"text": " ".join(rng.choices(words, k=rng.randint(4, 12)))}) + "\n"
                              for _ in range(400)))
    steps = ("budget=null", "train.budget.steps=3", "train.validate_every=0",
             f"data.sources=[{{type: jsonl, path: {corpus}}}]", "data.name=short-docs",
             "data.max_entries_in_raw_dataset=null", "data.tokenizer.vocab_size=128")
    summary = run_inprocess(tmp_path, "docs", *steps, "train.document_attention=true")
    assert summary["steps"] == 3
    docs = first[0]["document_ids"]
    assert docs.shape == first[0]["input_ids"].shape and int(docs.max()) > 0  # blocks span documents
    monkeypatch.setattr(StepData, "sequences", sequences)
    assert run_inprocess(tmp_path, "plain", *steps)["steps"] == 3
    # the same batches, masked differently: the model saw the boundaries
    assert losses(tmp_path / "docs")[1] != losses(tmp_path / "plain")[1]


def test_a_model_without_document_ids_is_refused_before_training(tmp_path):
    # the test plugin's TinyCausal.forward takes no document_ids: one clear line, not a TypeError mid-step
    with pytest.raises(ValueError, match="train.document_attention=true: arch.type=.* takes no document_ids"):
        run_inprocess(tmp_path, "plugin", *CAUSAL, "budget=null", "train.budget.steps=1", "train.document_attention=true")
    assert not (tmp_path / "plugin").exists()
