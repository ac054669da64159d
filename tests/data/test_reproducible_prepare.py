"""The same data config and corpus give the same tokenizer and the same packed bytes on every
prepare, in any process (issue 20: a re-prepared cache gave another tokenizer of the same size,
and a resumed run trained on other ids without a word)."""

from __future__ import annotations

import pytest

from cramlm.data.prepare import prepare_data

from .conftest import document, tiny_data, write_jsonl


@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "byte-bpe"])
def test_prepare_twice_gives_the_same_bytes(tmp_path, kind):
    path = write_jsonl(tmp_path / "c.jsonl", [{"text": document(i) + f" Ünïcode {i}"} for i in range(120)])
    cfg = tiny_data([{"type": "jsonl", "path": str(path)}], validation_fraction=0.1,
                    tokenizer={"kind": kind, "vocab_size": 300, "min_frequency": 1})
    one, two = (prepare_data(cfg, tmp_path / cache, progress=False) for cache in ("one", "two"))
    assert one.folder != two.folder
    for name in ("tokenizer.json", "train.cramtok", "val.cramtok"):
        assert (one.folder / name).read_bytes() == (two.folder / name).read_bytes(), name
    assert one.manifest["tokenizer_fingerprint"] == two.manifest["tokenizer_fingerprint"]
