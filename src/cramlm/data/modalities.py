"""Read Modalities' packed ``.pbin`` files and raw ``.idx`` indexes without executing pickles (and
write a ``.pbin`` as Modalities does, for the tests and benchmarks/adversarial.py).

``.pbin`` layout: [uint64 LE data-segment length][uint32 LE token width 1/2/4][tokens, little-endian]
[pickled list of (byte offset, byte length) per document, offsets relative to the token segment].
``.idx``: a pickled list of (byte offset, byte length) per JSONL line.

Both indexes are pickles, and unpickling runs whatever code a crafted file names. The loader here
resolves no global at all (so no class, function or module can be reached), accepts only the
opcodes that build ints, tuples and lists, and checks the shape of the result; anything else is
refused with :class:`UnsafePickleError` before it can run.
"""

from __future__ import annotations

import io
import pickle
import pickletools
from pathlib import Path

import numpy as np

from cramlm.data.cramtok import PackedFormatError, PackedWriter
from cramlm.io import atomic_write

# opcodes that only push ints, tuples and lists (or frame/memoize them); nothing callable
_ALLOWED_OPCODES = {
    "PROTO", "FRAME", "STOP", "MARK", "POP", "POP_MARK", "DUP",
    "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "NEWTRUE", "NEWFALSE",
    "EMPTY_LIST", "APPEND", "APPENDS", "LIST",
    "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3",
    "PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE", "GET", "BINGET", "LONG_BINGET",
}


class UnsafePickleError(PackedFormatError):
    """A pickle holds something other than lists, tuples and ints; it was not executed."""


class _NoGlobals(pickle.Unpickler):
    def find_class(self, module, name):  # never reached after the opcode check; a second wall
        raise UnsafePickleError(f"pickle references {module}.{name}; refused")

    def persistent_load(self, pid):
        raise UnsafePickleError("pickle uses persistent ids; refused")


def safe_load_index(data: bytes, where: str) -> list[tuple[int, int]]:
    """Unpickle a list of (int, int) pairs; refuse anything else without executing it."""
    try:
        for op, _, pos in pickletools.genops(data):
            if op.name not in _ALLOWED_OPCODES:
                raise UnsafePickleError(f"{where}: pickle opcode {op.name} at byte {pos} is not allowed "
                                        "(only lists, tuples and ints); refused without executing it")
        value = _NoGlobals(io.BytesIO(data)).load()
    except UnsafePickleError:
        raise
    except Exception as e:  # truncated or malformed pickle
        raise PackedFormatError(f"{where}: unreadable index pickle ({e})") from None
    if not isinstance(value, list) or not all(
        isinstance(p, tuple) and len(p) == 2 and all(type(x) is int and 0 <= x < 1 << 63 for x in p) for p in value
    ):  # (the bound also keeps later messages printable: Python refuses to print ints of > 4300 digits)
        raise UnsafePickleError(f"{where}: index must be a list of (offset, length) int pairs in [0, 2^63)")
    return value


def read_pbin(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Tokens (memory-mapped) and document offsets in tokens (uint64[D+1]) of a ``.pbin`` file."""
    path = Path(path)
    if path.stat().st_size < 12:
        raise PackedFormatError(f"{path}: too short for a .pbin header (truncated?)")
    with open(path, "rb") as f:
        head = f.read(12)
        data_len, width = int.from_bytes(head[:8], "little"), int.from_bytes(head[8:], "little")
        if width not in (1, 2, 4) or data_len % width:
            raise PackedFormatError(f"{path}: invalid token width {width} / data length {data_len}")
        if 12 + data_len > path.stat().st_size:
            raise PackedFormatError(f"{path}: data segment of {data_len} bytes runs past the end (truncated)")
        f.seek(12 + data_len)
        pairs = safe_load_index(f.read(), str(path))
    tokens = np.memmap(path, dtype=np.dtype(f"<u{width}"), mode="r", offset=12, shape=(data_len // width,)) if data_len else np.zeros(0, f"<u{width}")
    offsets = [0]
    for start, length in pairs:  # documents must tile the data segment in order
        if start != offsets[-1] * width or length % width or start + length > data_len:
            raise PackedFormatError(f"{path}: document ({start}, {length}) does not follow the previous one")
        offsets.append(offsets[-1] + length // width)
    return tokens, np.array(offsets, np.uint64)


def write_pbin(path: str | Path, documents: list, width: int = 2) -> Path:
    """Write ``documents`` (token id lists) to a ``.pbin`` the way Modalities does, its pickled index
    of (byte offset, byte length) per document included; ``width``: bytes per token (1, 2 or 4)."""
    data = b"".join(np.asarray(d, f"<u{width}").tobytes() for d in documents)
    index, pos = [], 0
    for d in documents:
        index.append((pos, len(d) * width))
        pos += len(d) * width
    with atomic_write(path) as tmp:
        tmp.write_bytes(len(data).to_bytes(8, "little") + width.to_bytes(4, "little") + data + pickle.dumps(index))
    return Path(path)


def read_idx(path: str | Path) -> np.ndarray:
    """A Modalities raw index as int64[N, 2] (offset, length), the same as cramlm's index."""
    pairs = safe_load_index(Path(path).read_bytes(), str(path))
    return np.array(pairs, np.int64).reshape(-1, 2)


def convert_pbin(src: str | Path, dst: str | Path, vocab_size: int | None = None, fingerprint: bytes = b"\0" * 16) -> Path:
    """Convert a ``.pbin`` to a ``.cramtok`` (vocab size: given, or largest id + 1)."""
    if vocab_size is not None and vocab_size < 1:
        raise ValueError(f"vocab size {vocab_size}: must be at least 1")
    tokens, offsets = read_pbin(src)
    top = int(tokens.max()) + 1 if len(tokens) else 1
    vocab_size = vocab_size or top
    if top > vocab_size:
        raise PackedFormatError(f"{src}: token id {top - 1} >= vocab size {vocab_size}")
    with PackedWriter(dst, vocab_size, fingerprint) as w:
        step = 1 << 20  # documents a bounded chunk at a time
        for a in range(0, len(offsets) - 1, step):
            o = offsets[a : a + step + 1].astype(np.int64)
            w.add_batch(tokens[o[0] : o[-1]], np.diff(o))
    return Path(dst)
