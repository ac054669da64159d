"""The packed format: round trips at both token widths; every damaged file fails with a clear error."""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest

from cramlm.data.cramtok import HEADER, PackedFormatError, PackedWriter, read_packed


def _write(path, vocab_size, docs, fp=b"f" * 16):
    with PackedWriter(path, vocab_size, fp) as w:
        w.add(docs[0])
        w.add_batch(np.concatenate(docs[1:]), np.array([len(d) for d in docs[1:]]))
    return path


@pytest.mark.parametrize("vocab_size,dtype", [(1 << 16, np.uint16), ((1 << 16) + 1, np.uint32)])
def test_round_trip_both_widths(tmp_path, vocab_size, dtype):
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, vocab_size, n) for n in (5, 0, 17, 1, 3)]
    docs[2][0] = vocab_size - 1  # the largest id survives
    p = read_packed(_write(tmp_path / "x.cramtok", vocab_size, docs), fingerprint=b"f" * 16)
    assert p.tokens.dtype == dtype and p.vocab_size == vocab_size and p.num_documents == 5
    for i, d in enumerate(docs):
        np.testing.assert_array_equal(p.document(i), d)
    assert p.num_tokens == sum(map(len, docs))


def test_empty_file_round_trips(tmp_path):
    with PackedWriter(tmp_path / "e.cramtok", 100) as w:
        pass
    p = read_packed(w.path)
    assert p.num_tokens == 0 and p.num_documents == 0


def test_out_of_range_ids_are_refused(tmp_path):
    with pytest.raises(ValueError, match="out of range"):
        with PackedWriter(tmp_path / "x.cramtok", 10) as w:
            w.add([1, 10])
    assert not list(tmp_path.iterdir())  # the temporary files are gone too


@pytest.fixture
def good(tmp_path):
    return _write(tmp_path / "g.cramtok", 1000, [np.arange(i, i + 50) for i in range(0, 400, 50)])


def _damage(path, offset, new: bytes):
    data = bytearray(path.read_bytes())
    data[offset : offset + len(new)] = new
    path.write_bytes(bytes(data))


def test_truncated_file(good):
    good.write_bytes(good.read_bytes()[:-3])
    with pytest.raises(PackedFormatError, match="truncated"):
        read_packed(good)
    good.write_bytes(good.read_bytes()[:20])
    with pytest.raises(PackedFormatError, match="too short"):
        read_packed(good)


def test_flipped_token_is_caught_by_the_checksum(good):
    data = good.read_bytes()
    _damage(good, HEADER.size + 100, bytes([data[HEADER.size + 100] ^ 1]))
    read_packed(good, verify=False)  # structure is intact, so only the checksum sees it
    with pytest.raises(PackedFormatError, match="checksum mismatch"):
        read_packed(good)


def test_damaged_header_fields(good):
    original = good.read_bytes()
    _damage(good, 16, struct.pack("<Q", 999))  # vocab size
    with pytest.raises(PackedFormatError, match="header checksum"):
        read_packed(good)
    good.write_bytes(original)
    _damage(good, 0, b"NOTMAGIC")
    with pytest.raises(PackedFormatError, match="bad magic"):
        read_packed(good)
    good.write_bytes(original)
    _damage(good, 8, struct.pack("<I", 7))
    with pytest.raises(PackedFormatError, match="version 7"):
        read_packed(good)


def test_corrupted_offsets_are_caught(good):
    size = good.stat().st_size
    _damage(good, size - 16, struct.pack("<Q", 10))  # second-to-last offset goes backwards
    with pytest.raises(PackedFormatError, match="offsets are inconsistent"):
        read_packed(good, verify=False)


def test_other_tokenizer_and_other_file(good, tmp_path):
    with pytest.raises(PackedFormatError, match="different tokenizer"):
        read_packed(good, fingerprint=b"g" * 16)
    other = tmp_path / "notes.txt"
    other.write_text("hello " * 30)
    with pytest.raises(PackedFormatError, match="not a cramlm packed-token file"):
        read_packed(other)


def test_the_packed_fingerprint_is_of_the_canonical_json_as_documented(tmp_path):
    from cramlm.data import cramtok
    from cramlm.data.tokenizer import TokenizerConfig, fingerprint, train_tokenizer

    tok = train_tokenizer(TokenizerConfig(vocab_size=120, min_frequency=1), ["call me ishmael"] * 20)
    assert fingerprint(tok) == hashlib.sha256(tok.to_str().encode("utf-8")).digest()[:16]
    assert "Tokenizer.to_str()" in cramtok.__doc__
