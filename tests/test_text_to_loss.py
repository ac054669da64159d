"""Text to loss, one check per link: tokenizer ids, .cramtok files, MLM masking, the BERT loss and tied decoder."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cramlm.data.collate import MLMCollator
from cramlm.data.cramtok import PackedFormatError, PackedWriter, read_packed
from cramlm.data.tokenizer import SPECIAL_TOKENS, TokenizerConfig, fingerprint, train_tokenizer
from cramlm.models.config import CrammedBertConfig
from cramlm.models.crammed_bert import CrammedBert

TEXTS = ["The whale swam under the ship.", "Call me Ishmael. Some years ago...", "Ahab stood on deck."] * 30


def test_tokenizer_special_ids_fixed_and_independent_of_corpus():
    for texts in (TEXTS, list(reversed(TEXTS)) + ["zebra quagga"]):
        tok = train_tokenizer(TokenizerConfig(vocab_size=200, min_frequency=1), texts)
        assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
        enc = tok.encode("the whale", "ahab")
        assert enc.ids[0] == 2 and enc.ids.count(3) == 2  # [CLS] a [SEP] b [SEP]


def test_tokenizer_ids_are_canonical():
    """HF's trainer numbers equal-count tokens in hash order (different each run); we renumber:
    specials first, then sorted, so the same token set always gets the same ids."""
    tok = train_tokenizer(TokenizerConfig(vocab_size=200, min_frequency=1), TEXTS)
    by_id = sorted(tok.get_vocab(), key=tok.token_to_id)
    assert by_id[:5] == list(SPECIAL_TOKENS) and by_id[5:] == sorted(by_id[5:])
    assert tok.encode("whale").tokens == ["[CLS]", "whale", "[SEP]"]
    assert len(fingerprint(tok)) == 16


@pytest.mark.parametrize("vocab", [1000, 70000])  # uint16 and uint32 tokens
def test_packed_round_trip(tmp_path, vocab):
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, vocab, size=n) for n in (5, 0, 17, 1, 300)]
    with PackedWriter(tmp_path / "x.cramtok", vocab, b"f" * 16) as w:
        for d in docs:
            w.add(d)
    packed = read_packed(tmp_path / "x.cramtok", verify=True)
    assert packed.tokens.dtype.itemsize == (2 if vocab <= 65536 else 4)
    assert packed.num_documents == len(docs) and packed.fingerprint == b"f" * 16
    for i, d in enumerate(docs):
        np.testing.assert_array_equal(packed.document(i), d)


def test_packed_truncated_and_corrupted_files_fail_clearly(tmp_path):
    path = tmp_path / "x.cramtok"
    with PackedWriter(path, 1000) as w:
        w.add(np.arange(100))
    data = path.read_bytes()
    (tmp_path / "short.cramtok").write_bytes(data[:-5])
    with pytest.raises(PackedFormatError, match="short.cramtok.*truncated"):
        read_packed(tmp_path / "short.cramtok")
    flipped = bytearray(data)
    flipped[64 + 10] ^= 0xFF
    (tmp_path / "flip.cramtok").write_bytes(bytes(flipped))
    with pytest.raises(PackedFormatError, match="checksum"):
        read_packed(tmp_path / "flip.cramtok", verify=True)
    (tmp_path / "junk.cramtok").write_bytes(b"hello world" * 10)
    with pytest.raises(PackedFormatError, match="bad magic"):
        read_packed(tmp_path / "junk.cramtok")


def test_writer_rejects_out_of_range_ids(tmp_path):
    with pytest.raises(ValueError, match="out of range"):
        with PackedWriter(tmp_path / "x.cramtok", 10) as w:
            w.add([3, 12])
    assert not (tmp_path / "x.cramtok").exists()


def test_mlm_masking_statistics():
    """Masks keyed by stream position (data/collate.py): BERT's rates, specials never chosen."""
    vocab, n = 1000, 200_000
    ids = torch.randint(5, vocab, (n // 100, 100))
    ids[:, 0], ids[:, -1] = 2, 3  # [CLS] ... [SEP]
    collate = MLMCollator(vocab, mask_id=4, num_special=5, mlm_probability=0.25, seed=0)
    out = collate(ids, positions=np.arange(n // 100))
    chosen = out["labels"] != -100
    assert not chosen[:, 0].any() and not chosen[:, -1].any()  # specials never chosen
    assert chosen[:, 1:-1].float().mean().item() == pytest.approx(0.25, abs=0.005)
    assert torch.equal(out["labels"][chosen], ids[chosen])
    became_mask = (out["input_ids"] == 4) & chosen
    unchanged = (out["input_ids"] == ids) & chosen
    randomised = chosen & ~became_mask & ~unchanged
    total = chosen.sum().item()
    assert became_mask.sum().item() / total == pytest.approx(0.8, abs=0.01)
    # a random replacement equals the original 1/995 of the time: counted as unchanged
    assert unchanged.sum().item() / total == pytest.approx(0.1, abs=0.01)
    assert randomised.sum().item() / total == pytest.approx(0.1, abs=0.01)
    assert (out["input_ids"][~chosen] == ids[~chosen]).all()
    replaced = out["input_ids"][randomised]
    assert replaced.min() >= 5 and replaced.max() < vocab and len(replaced.unique()) > 0.8 * min(len(replaced), vocab - 5)
    assert (out["input_ids"][randomised] >= 5).all()  # random tokens are never special


def tiny_bert(**kw) -> CrammedBert:
    cfg = CrammedBertConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_seq_length=16, **kw)
    return CrammedBert(cfg, vocab_size=50)


def test_sparse_prediction_equals_dense():
    torch.manual_seed(0)
    sparse = tiny_bert(sparse_prediction=True)
    dense = tiny_bert(sparse_prediction=False)
    dense.load_state_dict(sparse.state_dict())
    ids = torch.randint(5, 50, (3, 16))
    labels = torch.where(torch.rand(3, 16) < 0.3, ids, torch.full_like(ids, -100))
    torch.testing.assert_close(sparse(ids, labels=labels)["loss"], dense(ids, labels=labels)["loss"])


def test_decoder_is_tied_and_no_biases():
    model = tiny_bert()
    assert model.decoder.weight is model.tokens.weight
    assert not any(n.endswith("bias") and "norm" not in n for n, _ in model.named_parameters())
