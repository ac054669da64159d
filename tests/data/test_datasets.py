"""Datasets, collators, shuffling (O(1) memory), exact resume and rank sharding."""

from __future__ import annotations

import numpy as np
import pytest

from cramlm.data.dataset import BlockDataset, ShuffledStream
from cramlm.data.cramtok import PackedWriter, read_packed
from cramlm.data.permute import Permutation


@pytest.fixture
def packed(tmp_path):
    docs = [np.arange(10, 10 + n) for n in (5, 3, 12, 1, 7, 4)]  # 32 tokens
    with PackedWriter(tmp_path / "p.cramtok", 100) as w:
        for d in docs:
            w.add(d)
    return read_packed(w.path), docs


def test_blocks_cover_the_stream_and_carry_boundaries(packed):
    p, docs = packed
    ds = BlockDataset(p, 9, cls_id=2)  # 8 tokens per block after [CLS]
    assert len(ds) == 4 and ds.unused_tail_tokens == 0
    assert np.concatenate([ds[i][1:] for i in range(4)]).tolist() == np.concatenate(docs).tolist()
    b = ds.boundaries(0)  # [CLS] 10..14 (doc 0) 10 11 12 (doc 1)
    assert b["document_ids"].tolist() == [0, 0, 0, 0, 0, 0, 1, 1, 1]
    assert b["position_ids"].tolist() == [0, 1, 2, 3, 4, 5, 0, 1, 2]
    b = ds.boundaries(1)  # doc 2 from its start, 8 tokens
    assert b["position_ids"].tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8]
    plain = BlockDataset(p, 8, cls_id=None)
    assert plain[1].tolist() == docs[2][:8].tolist()
    assert plain.boundaries(2)["position_ids"].tolist() == [0, 1, 2, 3, 0, 0, 1, 2]  # doc 2's piece counts from the block
    assert plain.boundaries(2)["document_ids"].tolist() == [0, 0, 0, 0, 1, 2, 2, 2]


@pytest.mark.parametrize("n", [1, 2, 7, 1000, 4097])
def test_feistel_permutation_is_a_permutation(n):
    perm = Permutation(n, key=3)(np.arange(n))
    assert sorted(perm.tolist()) == list(range(n))
    if n > 10:
        assert perm.tolist() != list(range(n))
        assert Permutation(n, key=4)(np.arange(n)).tolist() != perm.tolist()


def test_stream_epochs_and_resume():
    n = 103
    s = ShuffledStream(n, seed=5)
    first = s.take(n)
    assert sorted(first.tolist()) == list(range(n)) and s.epoch == 1 and s.position == 0
    second = s.take(50)
    assert second.tolist() != first[:50].tolist()
    state = s.state_dict()
    expected = s.take(77)
    resumed = ShuffledStream(n, seed=5)
    resumed.load_state_dict(state)
    assert resumed.take(77).tolist() == expected.tolist()
