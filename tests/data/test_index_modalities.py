"""Raw JSONL index, on-the-fly dataset, Modalities .pbin/.idx reading with a pickle that is never run."""

from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest

from cramlm.data.index import IndexedJsonlDataset, build_index, load_index
from cramlm.data.modalities import UnsafePickleError, convert_pbin, read_idx, read_pbin, write_pbin
from cramlm.data.cramtok import PackedFormatError, read_packed
from cramlm.data.sources import DataError
from cramlm.data.tokenizer import SEP_ID, TokenizerConfig, train_tokenizer

from .conftest import document


def test_index_offsets_match_lines(tmp_path):
    lines = [json.dumps({"text": document(i)}) for i in range(50)]
    raw = ("\n".join(lines[:10]) + "\n\n  \n        \r\n" + "\n".join(lines[10:20]) + "\n  \t "
           + "\n" + "\n".join(lines[20:])).encode()  # blank lines (a long one too: was an entry), no final newline
    path = tmp_path / "c.jsonl"
    path.write_bytes(raw)
    index = load_index(build_index(path))
    assert index.shape == (50, 2)
    for i, (offset, length) in enumerate(index):
        assert raw[offset : offset + length].decode() == lines[i]
    (tmp_path / "e.jsonl").write_bytes(b"")
    assert load_index(build_index(tmp_path / "e.jsonl")).shape == (0, 2)


def test_indexed_dataset_tokenizes_on_the_fly(tmp_path):
    texts = [document(i) for i in range(30)]
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"meta": {"body": t}}) + "\n" for t in texts))
    tok = train_tokenizer(TokenizerConfig(vocab_size=200, min_frequency=1), texts)
    ds = IndexedJsonlDataset(path, tok, SEP_ID, text_key="meta.body")
    assert len(ds) == 30
    expected = tok.encode(texts[7], add_special_tokens=False).ids + [SEP_ID]
    assert ds[7].tolist() == expected
    assert [a.tolist() for a in ds.batch([7, 3])] == [expected, ds[3].tolist()]
    path.write_text("{}\n")  # the file shrank: the index is stale
    with pytest.raises(DataError, match="stale index"):
        IndexedJsonlDataset(path, tok, SEP_ID)


def test_index_file_holds_no_pickle(tmp_path):
    bad = tmp_path / "bad.idx.npy"
    np.save(bad, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(DataError, match="not a cramlm JSONL index"):
        load_index(bad)


@pytest.mark.parametrize("width", [1, 2, 4])
def test_pbin_round_trip_and_convert(tmp_path, width):
    docs = [[1, 2, 3], [4], [5, 6, 7, 8, 200]]
    tokens, offsets = read_pbin(write_pbin(tmp_path / "d.pbin", docs, width))
    assert [tokens[offsets[i] : offsets[i + 1]].tolist() for i in range(3)] == docs
    packed = read_packed(convert_pbin(tmp_path / "d.pbin", tmp_path / "d.cramtok", vocab_size=256))
    assert [packed.document(i).tolist() for i in range(3)] == docs


class _Evil:
    """Unpickling this would create a file (code execution)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_crafted_pickle_is_refused_without_running(tmp_path):
    marker = tmp_path / "pwned"
    payload = pickle.dumps([(0, 6), _Evil(str(marker))])
    pbin = tmp_path / "evil.pbin"
    pbin.write_bytes((6).to_bytes(8, "little") + (2).to_bytes(4, "little") + b"\1\0\2\0\3\0" + payload)
    with pytest.raises(UnsafePickleError, match="refused"):
        read_pbin(pbin)
    (tmp_path / "evil.idx").write_bytes(payload)
    with pytest.raises(UnsafePickleError):
        read_idx(tmp_path / "evil.idx")
    assert not marker.exists()
    pickle.loads(payload)[1].close()  # the same bytes do run code when unpickled freely
    assert marker.exists()
    os.remove(marker)


def test_other_pickled_values_and_damage_are_refused(tmp_path):
    (tmp_path / "s.idx").write_bytes(pickle.dumps([(0, "x")]))
    with pytest.raises(UnsafePickleError):
        read_idx(tmp_path / "s.idx")
    (tmp_path / "d.idx").write_bytes(pickle.dumps({"a": 1}))
    with pytest.raises(UnsafePickleError):
        read_idx(tmp_path / "d.idx")
    (tmp_path / "ok.idx").write_bytes(pickle.dumps([(0, 10), (11, 5)]))
    assert read_idx(tmp_path / "ok.idx").tolist() == [[0, 10], [11, 5]]
    good = write_pbin(tmp_path / "g.pbin", [[1, 2], [3]], 2).read_bytes()
    (tmp_path / "t.pbin").write_bytes(good[:20])
    with pytest.raises(PackedFormatError):
        read_pbin(tmp_path / "t.pbin")
