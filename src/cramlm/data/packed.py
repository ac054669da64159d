"""The packed token file (``.cramtok``): a versioned header, the tokens, a document-offset array.

Layout (all little-endian; specified in docs/data-format.md)::

    offset  size  field
    0       8     magic b"CRAMTOK\\0"
    8       4     format version (uint32) = 1
    12      4     token width in bytes (uint32): 2 (uint16) or 4 (uint32), from the vocabulary size
    16      8     vocab size (uint64)
    24      8     number of tokens (uint64)
    32      8     number of documents (uint64)
    40      16    tokenizer fingerprint (sha256 of tokenizer.json, first 16 bytes)
    56      4     CRC32 of the token bytes followed by the offset bytes (uint32)
    60      4     reserved, zero
    64      ...   tokens (num_tokens * width bytes), then zero padding to a multiple of 8
    ...     ...   document offsets: uint64[num_documents + 1]; document i is tokens[o[i]:o[i+1]]

No pickle anywhere: reading a file never executes code. Files are written to a temporary name and
renamed, so a crash never leaves a half-written file under the final name.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAGIC = b"CRAMTOK\0"
VERSION = 1
HEADER = struct.Struct("<8sIIQQQ16sII")
assert HEADER.size == 64


class PackedFormatError(ValueError):
    """A packed file is truncated, corrupted or not a packed file; the message names the file."""


def width_for_vocab(vocab_size: int) -> int:
    return 2 if vocab_size <= 1 << 16 else 4


def _dtype(width: int) -> np.dtype:
    return np.dtype("<u2") if width == 2 else np.dtype("<u4")


def _padded(nbytes: int) -> int:
    return (nbytes + 7) // 8 * 8


class PackedWriter:
    """Streams documents into a packed file: ``add(tokens)`` per document, then ``close()``."""

    def __init__(self, path: str | Path, vocab_size: int, tokenizer_fingerprint: bytes = b"\0" * 16):
        self.path = Path(path)
        self.tmp = self.path.with_name(self.path.name + ".tmp")
        self.vocab_size = vocab_size
        self.width = width_for_vocab(vocab_size)
        self.dtype = _dtype(self.width)
        self.fingerprint = tokenizer_fingerprint
        self.offsets = [0]
        self.crc = 0
        self.file = open(self.tmp, "wb")
        self.file.write(b"\0" * HEADER.size)

    @property
    def num_tokens(self) -> int:
        return self.offsets[-1]

    def add(self, tokens) -> None:
        array = np.asarray(tokens)
        if array.size and (array.min() < 0 or array.max() >= self.vocab_size):
            raise ValueError(f"{self.path}: token id out of range [0, {self.vocab_size})")
        data = array.astype(self.dtype, copy=False).tobytes()
        self.crc = zlib.crc32(data, self.crc)
        self.file.write(data)
        self.offsets.append(self.offsets[-1] + array.size)

    def close(self) -> Path:
        token_bytes = self.num_tokens * self.width
        self.file.write(b"\0" * (_padded(token_bytes) - token_bytes))
        offsets = np.asarray(self.offsets, dtype="<u8").tobytes()
        self.crc = zlib.crc32(offsets, self.crc)
        self.file.write(offsets)
        header = HEADER.pack(
            MAGIC, VERSION, self.width, self.vocab_size, self.num_tokens, len(self.offsets) - 1,
            self.fingerprint, self.crc, 0,
        )
        self.file.seek(0)
        self.file.write(header)
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.tmp, self.path)
        return self.path

    def __enter__(self) -> "PackedWriter":
        return self

    def __exit__(self, exc_type, *_) -> None:
        if exc_type is None:
            self.close()
        else:
            self.file.close()
            self.tmp.unlink(missing_ok=True)


@dataclass
class PackedTokens:
    """A memory-mapped packed file: ``tokens`` (uint16/uint32 array) and ``offsets`` (uint64)."""

    path: Path
    version: int
    vocab_size: int
    fingerprint: bytes
    crc: int
    tokens: np.ndarray
    offsets: np.ndarray

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def num_documents(self) -> int:
        return len(self.offsets) - 1

    def document(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]

    def verify(self) -> None:
        """Recompute the checksum (reads the whole file)."""
        crc = zlib.crc32(self.offsets.tobytes(), zlib.crc32(self.tokens.tobytes()))
        if crc != self.crc:
            raise PackedFormatError(f"{self.path}: checksum mismatch (file corrupted)")


def read_packed(path: str | Path, verify: bool = False) -> PackedTokens:
    path = Path(path)
    size = path.stat().st_size
    if size < HEADER.size:
        raise PackedFormatError(f"{path}: {size} bytes is too short for a packed-token header")
    with open(path, "rb") as f:
        magic, version, width, vocab, n_tok, n_doc, fp, crc, _ = HEADER.unpack(f.read(HEADER.size))
    if magic != MAGIC:
        raise PackedFormatError(f"{path}: not a cramlm packed-token file (bad magic {magic!r})")
    if version != VERSION:
        raise PackedFormatError(f"{path}: format version {version}, this cramlm reads version {VERSION}")
    if width not in (2, 4):
        raise PackedFormatError(f"{path}: invalid token width {width}")
    token_bytes = _padded(n_tok * width)
    expected = HEADER.size + token_bytes + (n_doc + 1) * 8
    if size != expected:
        raise PackedFormatError(f"{path}: size {size} bytes, header promises {expected} (truncated or corrupted)")
    tokens = np.memmap(path, dtype=_dtype(width), mode="r", offset=HEADER.size, shape=(n_tok,)) if n_tok else np.zeros(0, _dtype(width))
    offsets = np.memmap(path, dtype="<u8", mode="r", offset=HEADER.size + token_bytes, shape=(n_doc + 1,))
    if offsets[0] != 0 or offsets[-1] != n_tok or (n_doc and np.any(np.diff(offsets.astype(np.int64)) < 0)):
        raise PackedFormatError(f"{path}: document offsets are inconsistent (corrupted)")
    packed = PackedTokens(path, version, vocab, fp, crc, tokens, offsets)
    if verify:
        packed.verify()
    return packed
