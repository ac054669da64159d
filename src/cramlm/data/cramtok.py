"""The packed token file (``.cramtok``): a versioned header, the tokens, a document-offset array.

Layout (all little-endian; specified in docs/data-format.md)::

    offset  size  field
    0       8     magic b"CRAMTOK\\0"
    8       4     format version (uint32) = 2
    12      4     token width in bytes (uint32): 2 (uint16) or 4 (uint32), from the vocabulary size
    16      8     vocab size (uint64)
    24      8     number of tokens (uint64)
    32      8     number of documents (uint64)
    40      16    tokenizer fingerprint: the first 16 bytes of the sha256 of the tokenizer's canonical
                  JSON (``Tokenizer.to_str()``), not of tokenizer.json's bytes
    56      4     CRC32 of the token bytes followed by the offset bytes (uint32)
    60      4     CRC32 of header bytes 0..59 (uint32)
    64      ...   tokens (num_tokens * width bytes), then zero padding to a multiple of 8
    ...     ...   document offsets: uint64[num_documents + 1]; document i is tokens[o[i]:o[i+1]]

No pickle anywhere: reading a file never executes code. Files are written to a temporary name and
renamed, so a crash never leaves a half-written file under the final name. Writing streams: the
offsets go to a side file while tokens are written, so memory stays flat whatever the corpus size.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAGIC = b"CRAMTOK\0"
VERSION = 2
HEADER = struct.Struct("<8sIIQQQ16sII")
assert HEADER.size == 64
CHUNK = 1 << 24  # bytes per read when checksumming or copying


class PackedFormatError(ValueError):
    """A packed file is truncated, corrupted or not a packed file; the message names the file."""


def width_for_vocab(vocab_size: int) -> int:
    return 2 if vocab_size <= 1 << 16 else 4


def token_dtype(width: int) -> np.dtype:
    return np.dtype("<u2") if width == 2 else np.dtype("<u4")


def _padded(nbytes: int) -> int:
    return (nbytes + 7) // 8 * 8


def _crc_of_file(f, start: int, nbytes: int, crc: int, buffer: bytearray) -> int:
    """CRC32 of ``nbytes`` of ``f`` from ``start``, read through one fixed buffer (plain reads, not
    the memory map: the checked file's pages do not stay in this process's resident memory)."""
    f.seek(start)
    view = memoryview(buffer)
    while nbytes:
        n = f.readinto(view[: min(nbytes, len(buffer))])
        if not n:
            raise PackedFormatError(f"{f.name}: unexpected end of file (truncated)")
        crc = zlib.crc32(view[:n], crc)
        nbytes -= n
    return crc


def _header(width, vocab, n_tok, n_doc, fingerprint, crc) -> bytes:
    body = HEADER.pack(MAGIC, VERSION, width, vocab, n_tok, n_doc, fingerprint, crc, 0)[:60]
    return body + struct.pack("<I", zlib.crc32(body))


class PackedWriter:
    """Streams documents into a packed file: ``add(tokens)`` per document or ``add_batch(flat,
    lengths)`` for many at once, then ``close()``."""

    def __init__(self, path: str | Path, vocab_size: int, tokenizer_fingerprint: bytes = b"\0" * 16):
        self.path = Path(path)
        self.tmp = self.path.with_name(self.path.name + ".tmp")
        self.offsets_tmp = self.path.with_name(self.path.name + ".offsets.tmp")
        self.vocab_size = vocab_size
        self.width = width_for_vocab(vocab_size)
        self.dtype = token_dtype(self.width)
        self.fingerprint = tokenizer_fingerprint
        self.num_tokens = 0
        self.num_documents = 0
        self.crc = 0
        self.file = open(self.tmp, "wb")
        self.file.write(b"\0" * HEADER.size)
        self.offsets_file = open(self.offsets_tmp, "wb")
        self.offsets_file.write(np.zeros(1, "<u8").tobytes())

    def add(self, tokens) -> None:
        array = np.asarray(tokens)
        self.add_batch(array, np.array([array.size]))

    def add_batch(self, flat: np.ndarray, lengths: np.ndarray) -> None:
        """Append ``len(lengths)`` documents whose tokens are concatenated in ``flat``."""
        flat, lengths = np.asarray(flat), np.asarray(lengths, dtype=np.int64)
        if int(lengths.sum()) != flat.size:
            raise ValueError(f"{self.path}: lengths sum to {int(lengths.sum())}, got {flat.size} tokens")
        if flat.size and (int(flat.min()) < 0 or int(flat.max()) >= self.vocab_size):
            raise ValueError(f"{self.path}: token id out of range [0, {self.vocab_size})")
        data = flat.astype(self.dtype, copy=False)
        self.crc = zlib.crc32(data, self.crc)
        self.file.write(data.tobytes())
        ends = self.num_tokens + np.cumsum(lengths, dtype=np.uint64)
        self.offsets_file.write(ends.astype("<u8").tobytes())
        self.num_tokens += flat.size
        self.num_documents += len(lengths)

    def close(self) -> Path:
        """The file complete under its name; a failure (a full disk) aborts it: nothing left open or behind."""
        try:
            return self._close()
        except BaseException:
            self.abort()
            raise

    def _close(self) -> Path:
        token_bytes = self.num_tokens * self.width
        self.file.write(b"\0" * (_padded(token_bytes) - token_bytes))
        self.offsets_file.close()
        with open(self.offsets_tmp, "rb") as offsets:  # append offsets, checksumming as we copy
            while chunk := offsets.read(CHUNK):
                self.crc = zlib.crc32(chunk, self.crc)
                self.file.write(chunk)
        self.offsets_tmp.unlink()
        self.file.seek(0)
        self.file.write(_header(self.width, self.vocab_size, self.num_tokens, self.num_documents, self.fingerprint, self.crc))
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.tmp, self.path)
        return self.path

    def abort(self) -> None:
        for f in (self.file, self.offsets_file):
            try:
                f.close()
            except OSError:  # its buffer cannot be flushed (a full disk): discarded with the file
                pass
        self.tmp.unlink(missing_ok=True)
        self.offsets_tmp.unlink(missing_ok=True)

    def __enter__(self) -> "PackedWriter":
        return self

    def __exit__(self, exc_type, *_) -> None:
        self.close() if exc_type is None else self.abort()


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

    @property
    def width(self) -> int:
        return self.tokens.dtype.itemsize

    def document(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets.astype(np.int64))

    def verify(self) -> None:
        """Recompute the checksum (reads the whole file, a chunk at a time)."""
        token_bytes, buffer = self.num_tokens * self.width, bytearray(min(CHUNK, 1 << 20))
        with open(self.path, "rb") as f:
            crc = _crc_of_file(f, HEADER.size, token_bytes, 0, buffer)
            crc = _crc_of_file(f, HEADER.size + _padded(token_bytes), 8 * (self.num_documents + 1), crc, buffer)
        if crc != self.crc:
            raise PackedFormatError(f"{self.path}: checksum mismatch (file corrupted)")

    def pread(self, fd: int, start: int, end: int) -> np.ndarray:
        """tokens[start:end] read from ``fd`` (this file, opened by the caller) without the memory
        map, so one pass over a large file does not leave its pages in resident memory."""
        data = os.pread(fd, (end - start) * self.width, HEADER.size + start * self.width)
        return np.frombuffer(data, self.tokens.dtype)


def read_packed(path: str | Path, verify: bool = True, fingerprint: bytes | None = None) -> PackedTokens:
    """Open a packed file. Every structural check is done here, so a bad file fails with a clear
    :class:`PackedFormatError`; ``verify`` also checks the data checksum (one pass over the file),
    ``fingerprint`` that it was packed with the given tokenizer."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no packed file at {path}")
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(HEADER.size)
    if not raw[:8] or raw[:8] != MAGIC[: len(raw[:8])]:
        raise PackedFormatError(f"{path}: not a cramlm packed-token file (bad magic {raw[:8]!r})")
    if size < HEADER.size:
        raise PackedFormatError(f"{path}: {size} bytes is too short for a packed-token header (truncated?)")
    magic, version, width, vocab, n_tok, n_doc, fp, crc, header_crc = HEADER.unpack(raw)
    if magic != MAGIC:
        raise PackedFormatError(f"{path}: not a cramlm packed-token file (bad magic {magic!r})")
    if version != VERSION:
        raise PackedFormatError(f"{path}: format version {version}, this cramlm reads version {VERSION} (re-run prepare)")
    if zlib.crc32(raw[:60]) != header_crc:
        raise PackedFormatError(f"{path}: header checksum mismatch (header corrupted)")
    if width not in (2, 4) or width != width_for_vocab(vocab):
        raise PackedFormatError(f"{path}: token width {width} does not fit vocab size {vocab}")
    token_bytes = _padded(n_tok * width)
    expected = HEADER.size + token_bytes + (n_doc + 1) * 8
    if size != expected:
        raise PackedFormatError(f"{path}: size {size} bytes, header promises {expected} (truncated or corrupted)")
    if fingerprint is not None and fp != fingerprint:
        raise PackedFormatError(f"{path}: packed with a different tokenizer (fingerprint {fp.hex()} != {fingerprint.hex()})")
    dtype = token_dtype(width)
    tokens = np.memmap(path, dtype=dtype, mode="r", offset=HEADER.size, shape=(n_tok,)) if n_tok else np.zeros(0, dtype)
    offsets = np.memmap(path, dtype="<u8", mode="r", offset=HEADER.size + token_bytes, shape=(n_doc + 1,))
    if offsets[0] != 0 or offsets[-1] != n_tok or (n_doc and np.any(offsets[1:] < offsets[:-1])):
        raise PackedFormatError(f"{path}: document offsets are inconsistent (corrupted)")
    packed = PackedTokens(path, version, vocab, fp, crc, tokens, offsets)
    if verify:
        packed.verify()
    return packed
