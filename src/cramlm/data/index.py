"""Raw JSONL index and the dataset that tokenizes documents on the fly through it.

The index is a numpy ``.npy`` file (loaded with ``allow_pickle=False``: never code) holding
``int64[N, 2]`` = (byte offset, byte length) of every non-blank line, found by scanning the file
in 16 MB chunks with numpy: disk speed, flat memory. :class:`IndexedJsonlDataset` is Modalities'
MemMapDataset: sample ``i`` is line ``i`` parsed and tokenized when asked for, without packing.
"""

from __future__ import annotations

import json
import mmap
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from cramlm.data.sources import DataError, field
from cramlm.io import atomic_write

CHUNK = 1 << 24


def index_path(jsonl: str | Path) -> Path:
    return Path(str(jsonl) + ".idx.npy")


def build_index(jsonl: str | Path, out: str | Path | None = None) -> Path:
    """Write the (offset, length) index of ``jsonl``'s non-blank lines; returns its path."""
    jsonl = Path(jsonl)
    if jsonl.suffix in (".gz", ".zst"):
        raise DataError(f"{jsonl}: an index needs an uncompressed file (byte offsets into the file)")
    out = Path(out) if out else index_path(jsonl)
    ends = []  # position of every newline
    size = jsonl.stat().st_size
    with open(jsonl, "rb") as f:
        base = 0
        while chunk := f.read(CHUNK):
            ends.append(np.flatnonzero(np.frombuffer(chunk, np.uint8) == 10) + base)
            base += len(chunk)
    newlines = np.concatenate(ends) if ends else np.zeros(0, np.int64)
    if size and (not len(newlines) or newlines[-1] != size - 1):
        newlines = np.append(newlines, size)  # last line without a final newline
    starts = np.concatenate([[0], newlines[:-1] + 1]).astype(np.int64) if size else np.zeros(0, np.int64)
    lengths = newlines.astype(np.int64) - starts
    index = np.stack([starts, lengths], axis=1)
    if len(index):
        index = _drop_blank(jsonl, index)
    with atomic_write(out) as tmp, open(tmp, "wb") as f:
        np.save(f, index.astype("<i8"), allow_pickle=False)
    return out


def _drop_blank(jsonl: Path, index: np.ndarray) -> np.ndarray:
    """Remove whitespace-only lines: the empty ones and those that start with whitespace are checked
    through a memory map (a record's line starts with its JSON, so that is few lines)."""
    with open(jsonl, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        data = np.frombuffer(m, np.uint8)
        nonempty = index[:, 1] > 0
        first = np.zeros(len(index), np.uint8)
        first[nonempty] = data[index[nonempty, 0]]
        candidates = np.flatnonzero(~nonempty | np.isin(first, np.frombuffer(b" \t\r\n\x0b\x0c", np.uint8)))
        blank = [i for i in candidates if not m[index[i, 0] : index[i, 0] + index[i, 1]].strip()]
        del data  # the map closes only once no array views it
    return np.delete(index, blank, axis=0)


def load_index(path: str | Path) -> np.ndarray:
    try:
        index = np.load(path, allow_pickle=False, mmap_mode="r")
    except (ValueError, OSError) as e:
        raise DataError(f"{path}: not a cramlm JSONL index ({e})") from None
    if index.ndim != 2 or index.shape[1] != 2 or index.dtype != np.dtype("<i8"):
        raise DataError(f"{path}: expected int64[N, 2] (offset, length), got {index.dtype}{list(index.shape)}")
    return index


class IndexedJsonlDataset:
    """Documents of a JSONL file by index, tokenized on access (no packing step).

    ``self[i]`` -> int64 token ids of document ``i`` followed by ``separator``; ``batch(indices)``
    tokenizes many with one Rust call."""

    def __init__(self, jsonl: str | Path, tokenizer: Tokenizer, separator: int, text_key: str = "text",
                 index: str | Path | None = None):
        self.path = Path(jsonl)
        index = Path(index) if index else index_path(self.path)
        if not index.is_file():
            build_index(self.path, index)
        self.index = load_index(index)
        self.tokenizer, self.separator, self.text_key = tokenizer, separator, text_key
        self._file = open(self.path, "rb")
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        if len(self.index) and int(self.index[-1].sum()) > len(self._map):
            raise DataError(f"{index}: points past the end of {self.path} (stale index: rebuild it)")

    def __len__(self) -> int:
        return len(self.index)

    def text(self, i: int) -> str:
        offset, length = (int(x) for x in self.index[i])
        raw = self._map[offset : offset + length]
        try:
            value = field(json.loads(raw), self.text_key)
        except ValueError as e:
            raise DataError(f"{self.path}: record {i} (byte {offset}): {e}") from None
        if not isinstance(value, str):
            raise DataError(f"{self.path}: record {i} (byte {offset}): no string field '{self.text_key}'")
        return value

    def _ids(self, encoding) -> np.ndarray:
        return np.array(encoding.ids + [self.separator], np.int64)

    def __getitem__(self, i: int) -> np.ndarray:
        return self._ids(self.tokenizer.encode(self.text(i), add_special_tokens=False))

    def batch(self, indices) -> list[np.ndarray]:
        texts = [self.text(int(i)) for i in indices]
        return [self._ids(e) for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]
