"""Cleaning, filtering and deduplication of documents; everything removed is counted by reason.

Text-level steps (:class:`CleanConfig`) run while reading; the token-level "trash" filter runs
right after tokenization (it needs the token count); deduplication (:class:`DedupConfig`) runs at
merge time over per-document hashes and MinHash signatures computed while packing, in global
document order, so a sharded prepare removes exactly what a single one does.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from typing import Literal

from typing import TYPE_CHECKING

from pydantic import Field

from cramlm.config.base import Config, NonNegativeInt, PositiveFloat, PositiveInt, UnitFloat

if TYPE_CHECKING:  # numpy is imported where arrays are made: the configs here stay light to import
    import numpy as np


class CleanConfig(Config):
    unicode: Literal["none", "NFC", "NFKC", "NFD", "NFKD"] = Field(
        "none", description="Unicode normalisation applied to each document's text before any other step (none: as read)")
    min_chars: NonNegativeInt = Field(
        0, description="drop documents shorter than this many characters, after normalisation (counted as too_short)")
    max_chars: PositiveInt | None = Field(
        None, description="drop documents longer than this many characters (too_long); null: no upper limit")
    min_words: NonNegativeInt = Field(
        0, description="drop documents with fewer whitespace-separated words (too_few_words); 0: off")
    max_tokens_per_char: PositiveFloat | None = Field(
        None, description="cramming's trash filter: keep a document only if its tokens < this x its characters "
        "(cramming: 0.25); catches tables, code dumps and text the tokenizer cannot handle. null: off")


class Cleaner:
    """``clean(text) -> (text, None)`` or ``(None, reason)``."""

    def __init__(self, cfg: CleanConfig):
        self.cfg = cfg
        self.active = cfg != CleanConfig()

    def __call__(self, text: str) -> tuple[str | None, str | None]:
        cfg = self.cfg
        if cfg.unicode != "none":
            text = unicodedata.normalize(cfg.unicode, text)
        if len(text) < cfg.min_chars:
            return None, "too_short"
        if cfg.max_chars is not None and len(text) > cfg.max_chars:
            return None, "too_long"
        if cfg.min_words and len(text.split()) < cfg.min_words:
            return None, "too_few_words"
        return text, None

    def trash(self, num_tokens: np.ndarray, num_chars: np.ndarray) -> np.ndarray:
        """Boolean mask of documents the trash filter removes."""
        if self.cfg.max_tokens_per_char is None:
            import numpy as np

            return np.zeros(len(num_tokens), bool)
        return num_tokens >= self.cfg.max_tokens_per_char * num_chars


class DedupConfig(Config):
    exact: bool = Field(False, description="drop documents whose text equals an earlier one (64-bit hash of the text)")
    near: bool = Field(
        False, description="drop near-duplicates: MinHash LSH over word shingles (needs the `dedup` extra: datasketch)")
    threshold: UnitFloat = Field(
        0.8, description="estimated Jaccard similarity of shingle sets above which a document is a near-duplicate")
    num_perm: PositiveInt = Field(64, description="MinHash permutations, i.e. signature length (more: finer estimate, slower)")
    shingle_words: PositiveInt = Field(5, description="words per shingle (consecutive whitespace-separated words)")


def text_hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


_WORD = re.compile(r"\w+")
SCHEME = "affine32"  # datasketch >= 2: 32-bit hash values, stored as uint32 per permutation


class MinHasher:
    """MinHash signatures (uint32[num_perm]) of word-shingle sets, with datasketch."""

    def __init__(self, cfg: DedupConfig):
        try:
            from datasketch import MinHash
        except ImportError:
            raise ValueError("near-duplicate removal needs datasketch (pip install 'cramlm[dedup]')") from None
        self.cfg = cfg
        self.MinHash = MinHash

    def signature(self, text: str) -> np.ndarray:
        words = _WORD.findall(text.lower())
        n = self.cfg.shingle_words
        shingles = {" ".join(words[i : i + n]).encode() for i in range(max(1, len(words) - n + 1))}
        m = self.MinHash(num_perm=self.cfg.num_perm, seed=1, scheme=SCHEME)
        m.update_batch(list(shingles))
        return m.hashvalues.astype("uint32")


class NearDuplicateIndex:
    """The kept documents' MinHash signatures (LSH): ``seen(key, signature)`` is True for a near
    duplicate of one kept before, else it keeps this one under ``key``."""

    def __init__(self, cfg: DedupConfig):
        from datasketch import MinHash, MinHashLSH

        self.cfg, self.MinHash = cfg, MinHash
        self.lsh = MinHashLSH(threshold=cfg.threshold, num_perm=cfg.num_perm)

    def seen(self, key, signature: np.ndarray) -> bool:
        m = self.MinHash(num_perm=self.cfg.num_perm, seed=1, hashvalues=signature, scheme=SCHEME)
        if self.lsh.query(m):
            return True
        self.lsh.insert(key, m)
        return False


def near_duplicates(signatures: np.ndarray, cfg: DedupConfig) -> np.ndarray:
    """Mask over documents (in the given order): True where an earlier kept document is similar."""
    import numpy as np

    index = NearDuplicateIndex(cfg)
    return np.array([index.seen(i, sig) for i, sig in enumerate(signatures)], bool)


def first_occurrences(hashes: np.ndarray) -> np.ndarray:
    """Mask: True where a hash appears for the first time in this order."""
    import numpy as np

    _, first = np.unique(hashes, return_index=True)
    keep = np.zeros(len(hashes), bool)
    keep[first] = True
    return keep
