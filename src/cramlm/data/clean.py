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

from cramlm.config.base import Config

if TYPE_CHECKING:  # numpy is imported where arrays are made: the configs here stay light to import
    import numpy as np


class CleanConfig(Config):
    unicode: Literal["none", "NFC", "NFKC", "NFD", "NFKD"] = "none"  # Unicode normalisation of the text
    min_chars: int = 0  # drop shorter documents (after normalisation)
    max_chars: int | None = None  # drop longer documents
    min_words: int = 0  # drop documents with fewer whitespace-separated words
    # cramming's "trash" filter: keep a document only if tokens < max_tokens_per_char * chars
    # (0.25 in cramming; None: off). Catches tables, code dumps and text the tokenizer cannot handle.
    max_tokens_per_char: float | None = None


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
    exact: bool = False  # drop documents whose text equals an earlier one (64-bit hash of the text)
    near: bool = False  # drop near-duplicates: MinHash LSH over word shingles (needs the `dedup` extra: datasketch)
    threshold: float = 0.8  # estimated Jaccard similarity above which a document is a near-duplicate
    num_perm: int = 64  # MinHash permutations (signature size)
    shingle_words: int = 5  # shingle = this many consecutive words


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
