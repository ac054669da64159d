"""Tokenizers via HF ``tokenizers``: trained here or loaded from a file, with fixed special ids.

Special tokens always take the first ids, in this order (documented in docs/data-format.md):
``[PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4``. (cramming's ids depended on Python's hash order.)
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Iterable, Literal

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from cramlm.config.base import Config

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = range(len(SPECIAL_TOKENS))


class TokenizerConfig(Config):
    kind: Literal["wordpiece"] = "wordpiece"
    vocab_size: int = 32768
    min_frequency: int = 2
    lowercase: bool = True  # cramming's final recipe: NFD, lowercase, strip accents
    strip_accents: bool = True
    max_training_docs: int | None = None  # train on at most this many documents (None: all)
    path: str | None = None  # load a tokenizer.json instead of training one


def _normalizer(cfg: TokenizerConfig) -> normalizers.Normalizer:
    steps: list[normalizers.Normalizer] = [normalizers.NFD()]
    if cfg.lowercase:
        steps.append(normalizers.Lowercase())
    if cfg.strip_accents:
        steps.append(normalizers.StripAccents())
    return normalizers.Sequence(steps)


def train_tokenizer(cfg: TokenizerConfig, texts: Iterable[str]) -> Tokenizer:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = _normalizer(cfg)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    trainer = trainers.WordPieceTrainer(
        vocab_size=cfg.vocab_size,
        min_frequency=cfg.min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.model = models.WordPiece(canonical_vocab(tok.get_vocab()), unk_token="[UNK]", max_input_chars_per_word=100)
    add_bert_template(tok)
    check_special_ids(tok, "trained tokenizer")
    return tok


def canonical_vocab(vocab: dict[str, int]) -> dict[str, int]:
    """Special tokens first, then the rest in sorted order. The trainer numbers tokens of equal
    count in hash order, which differs between runs; WordPiece encodes by longest match, so the
    ids are free to renumber and this makes them reproducible."""
    rest = sorted(t for t in vocab if t not in SPECIAL_TOKENS)
    return {t: i for i, t in enumerate([*SPECIAL_TOKENS, *rest])}


def add_bert_template(tok: Tokenizer) -> None:
    """``[CLS] a [SEP]`` and ``[CLS] a [SEP] b [SEP]`` for fine-tuning inputs."""
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", CLS_ID), ("[SEP]", SEP_ID)],
    )


def check_special_ids(tok: Tokenizer, where: str) -> None:
    for expected, token in enumerate(SPECIAL_TOKENS):
        got = tok.token_to_id(token)
        if got != expected:
            raise ValueError(f"{where}: special token {token} has id {got}, cramlm requires {expected}")


def load_tokenizer(path: str | Path) -> Tokenizer:
    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"no tokenizer at {path}")
    tok = Tokenizer.from_file(str(path))
    check_special_ids(tok, str(path))
    return tok


def fingerprint(tok: Tokenizer) -> bytes:
    """16 bytes identifying the tokenizer (sha256 of its canonical JSON)."""
    return hashlib.sha256(tok.to_str().encode("utf-8")).digest()[:16]
