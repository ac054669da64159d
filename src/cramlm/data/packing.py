"""The packing pass: sources -> clean -> batched Rust tokenization -> numpy writes, streaming.

One pass writes a *shard* folder: ``train.cramtok`` / ``val.cramtok`` (documents in read order,
each followed by the separator token), ``train.docs.bin`` / ``val.docs.bin`` (one record per
document: global record number, text hash, source index, UTF-8 bytes of the cleaned text; see
:data:`DOC_RECORD`), optional
``*.minhash.bin`` signatures, and ``shard.json`` (counts, written last: it marks the shard done).

Memory stays flat: a reader thread parses and cleans batches of about ``batch_chars`` characters
while the main thread tokenizes the previous batch (``encode_batch`` releases the GIL and runs on
all cores in Rust) and writes it with numpy. An error in the reader stops the run with its message.
A document longer than 256k characters is tokenized in pieces that give the same ids
(:func:`cramlm.data.tokenizer.split_text`), so memory does not grow with one document's length.
"""

from __future__ import annotations

import json
import queue
import threading
import time
import zlib
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Iterator

import numpy as np
from tokenizers import Tokenizer

from cramlm.data.clean import Cleaner, MinHasher, text_hash
from cramlm.data.cramtok import PackedWriter
from cramlm.data.sources import DataError, SkipReport, documents
from cramlm.data.tokenizer import PIECE_CHARS, split_text
from cramlm.io import atomic_dir, on_full_disk
from cramlm.progress import progress_bar

# bytes: of the cleaned text the document's tokens encode (bits per byte, data/heldout.py)
DOC_RECORD = np.dtype([("number", "<u8"), ("hash", "<u8"), ("source", "<u2"), ("bytes", "<u8")])
SPLITS = ("train", "val")


@dataclass
class Batch:
    texts: list[str] = field(default_factory=list)
    numbers: list[int] = field(default_factory=list)
    sources: list[int] = field(default_factory=list)
    chars: int = 0


def is_validation(text: str, fraction: float) -> bool:
    """Stable held-out choice: the same document lands on the same side whatever the order."""
    return fraction > 0 and zlib.crc32(text.encode("utf-8", "surrogatepass")) % 1_000_000 < fraction * 1_000_000


def read_batches(cfg, report: SkipReport, cleaner: Cleaner, batch_chars: int, batch_docs: int = 8192) -> Iterator[Batch]:
    """Cleaned documents of ``cfg.sources`` (this shard's only), in batches of bounded size."""
    batch = Batch()
    for source_index, source in enumerate(cfg.sources):
        for text in documents(source, report, source_index):
            if cleaner.active:
                text, reason = cleaner(text)
                if text is None:
                    report.skip(reason, f"record {report.last_number}")
                    continue
            batch.texts.append(text)
            batch.numbers.append(report.last_number)
            batch.sources.append(source_index)
            batch.chars += len(text)
            if batch.chars >= batch_chars or len(batch.texts) >= batch_docs:
                yield batch
                batch = Batch()
        if report.done:
            break
    if batch.texts:
        yield batch


def prefetch(items: Iterator, depth: int = 2) -> Iterator:
    """Run ``items`` in a background thread, ``depth`` items ahead; its exceptions re-raise here."""
    q: queue.Queue = queue.Queue(depth)
    done = object()
    stop = threading.Event()

    def put(item) -> bool:
        """Hand ``item`` on unless the consumer has stopped (then False): never blocks past a stop."""
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            for item in items:
                if not put(item):
                    return
            put(done)
        except BaseException as e:  # handed to the consumer, which raises it
            put(e)

    thread = threading.Thread(target=work, name="cramlm-reader", daemon=True)
    thread.start()
    try:
        while (item := q.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join()


def encode(tok: Tokenizer, texts: list[str], call_chars: int = 2_000_000, piece_chars: int = PIECE_CHARS) -> list:
    """Token ids of each text (a list, or a uint32 array for a text tokenized in pieces), batched
    in Rust (no special tokens, no offsets needed).

    Memory stays bounded whatever the document size: texts longer than ``piece_chars`` are cut
    into pieces that tokenize the same (:func:`split_text`), and one tokenizer call gets at most
    ``call_chars`` characters (or one piece)."""
    fast = getattr(tok, "encode_batch_fast", None)  # tokenizers >= 0.20 skips offset tracking
    run = fast or tok.encode_batch
    if all(len(t) <= piece_chars for t in texts) and sum(map(len, texts)) <= call_chars:
        return [e.ids for e in run(texts, add_special_tokens=False)]  # the usual case: one call
    parts: list[list] = [[] for _ in texts]
    group: list[tuple[int, str]] = []
    size = 0

    def flush() -> None:
        long_doc = [len(texts[i]) > piece_chars for i, _ in group]
        for (i, _), is_long, e in zip(group, long_doc, run([p for _, p in group], add_special_tokens=False)):
            parts[i].append(np.array(e.ids, np.uint32) if is_long else e.ids)  # arrays: 4 bytes a token

    for i, text in enumerate(texts):
        for piece in split_text(text, piece_chars):
            if group and size + len(piece) > call_chars:
                flush()
                group, size = [], 0
            group.append((i, piece))
            size += len(piece)
    if group:
        flush()
    return [p[0] if len(p) == 1 else np.concatenate(p) for p in parts]


class ShardWriter:
    """Per-split packed file + per-document records (+ MinHash signatures)."""

    def __init__(self, folder: Path, split: str, vocab_size: int, fp: bytes, minhash: bool):
        self.packed = PackedWriter(folder / f"{split}.cramtok", vocab_size, fp)
        self.docs = open(folder / f"{split}.docs.bin", "wb")
        self.minhash = open(folder / f"{split}.minhash.bin", "wb") if minhash else None
        self.documents = 0
        self.tokens = 0
        self.bytes = 0

    def add(self, flat: np.ndarray, lengths: np.ndarray, records: np.ndarray, signatures: np.ndarray | None) -> None:
        self.packed.add_batch(flat, lengths)
        self.docs.write(records.tobytes())
        if self.minhash is not None and signatures is not None:
            self.minhash.write(signatures.astype("<u4").tobytes())
        self.documents += len(lengths)
        self.tokens += int(lengths.sum())
        self.bytes += int(records["bytes"].sum())

    def close(self) -> None:
        self.packed.close()
        self.docs.close()
        if self.minhash is not None:
            self.minhash.close()

    def abort(self) -> None:
        self.packed.abort()
        for f in (self.docs, self.minhash):
            try:
                if f is not None:
                    f.close()
            except OSError:  # a full disk: the folder is removed anyway
                pass


SHARD_KEYS = ("shard", "read", "skipped", "skipped_examples", "seconds")


def read_shard_info(folder: Path) -> dict:
    """A finished shard's ``shard.json``; a missing, unreadable or incomplete one is an error naming the file."""
    path = folder / "shard.json"
    if not path.is_file():
        raise FileNotFoundError(f"{folder}: shard not finished (no shard.json); run its prepare first")
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: unreadable ({e}); delete the shard folder and prepare it again") from None
    missing = [k for k in SHARD_KEYS if not isinstance(info, dict) or k not in info]
    if missing:
        raise ValueError(f"{path}: not a finished shard record (missing {', '.join(missing)}); delete the shard folder and prepare it again")
    return info


def pack_shard(cfg, tok: Tokenizer, separator: int, folder: Path, shard: tuple[int, int] = (0, 1),
               batch_chars: int = 2_000_000, progress: bool = True) -> dict:
    """Write shard ``shard=(index, count)`` of ``cfg`` into ``folder`` (skipped if already done):
    read and clean -> tokenize -> filter -> split -> append with separators, then ``shard.json``."""
    if (folder / "shard.json").is_file():
        return read_shard_info(folder)
    start = time.perf_counter()
    with naming_a_full_disk(folder, "packing"), atomic_dir(folder) as tmp:  # a crash leaves no shard folder: packed again next time
        info = _pack_into(tmp, cfg, tok, separator, shard, batch_chars, progress, start)
        (tmp / "shard.json").write_text(json.dumps(info, indent=2))
    return info


def naming_a_full_disk(folder: Path, doing: str):
    """A full disk while writing ``folder``: one DataError naming it and the free space, raised once
    the partial output is removed."""
    return on_full_disk(folder, f"disk full while {doing} {folder} ({{free}}); its partial files were removed. Free some "
                        "space, or prepare into another cache folder (cache=... for `cramlm data`, impl.data_cache=... for a run)",
                        DataError)


def _pack_into(tmp: Path, cfg, tok: Tokenizer, separator: int, shard: tuple[int, int], batch_chars: int,
               progress: bool, start: float) -> dict:
    """Pack every batch of documents of this shard into ``tmp``; the shard's info (counts)."""
    from cramlm.data.tokenizer import fingerprint

    report = SkipReport(shard, cfg.max_entries_in_raw_dataset)
    cleaner = Cleaner(cfg.clean)
    hasher = MinHasher(cfg.dedup) if cfg.dedup.near else None
    writers = {s: ShardWriter(tmp, s, tok.get_vocab_size(), fingerprint(tok), hasher is not None) for s in SPLITS}
    bar = progress_bar(desc=f"packing shard {shard[0]}/{shard[1]}", unit=" docs", enabled=progress)
    total_tokens = 0
    try:
        for batch in prefetch(read_batches(cfg, report, cleaner, batch_chars)):
            total_tokens += _pack_batch(batch, cfg, tok, separator, report, cleaner, hasher, writers, batch_chars)
            bar.set_postfix_str(f"{total_tokens / max(bar.format_dict['elapsed'], 1e-9):,.0f} tokens/s", refresh=False)
            bar.update(len(batch.texts))
        for w in writers.values():
            w.close()
    except BaseException:
        for w in writers.values():
            w.abort()  # (a closed one: nothing left to do)
        raise
    finally:
        bar.close()
    packed = sum(w.documents for w in writers.values())
    if report.read != packed + sum(report.skipped.values()):  # the "nothing lost" invariant
        raise RuntimeError(f"shard {shard}: read {report.read} != packed {packed} + skipped {dict(report.skipped)}")
    return {
        "shard": list(shard),
        "read": report.read,
        "packed": packed,
        "skipped": dict(report.skipped),
        "skipped_examples": report.examples,
        "skipped_sources": report.sources_list(),
        "splits": {s: {"documents": w.documents, "tokens": w.tokens, "bytes": w.bytes} for s, w in writers.items()},
        "minhash": hasher is not None,
        "seconds": round(time.perf_counter() - start, 3),
    }


def _pack_batch(batch, cfg, tok: Tokenizer, separator: int, report: SkipReport, cleaner: Cleaner,
                hasher: MinHasher | None, writers: dict, batch_chars: int) -> int:
    """Tokenize one batch, count what is dropped (no tokens, trash), split train/val and append each
    kept document with its separator; the tokens added."""
    ids = encode(tok, batch.texts, batch_chars)
    lengths = np.fromiter(map(len, ids), np.int64, len(ids))
    chars = np.fromiter(map(len, batch.texts), np.int64, len(ids))
    keep = lengths > 0
    for i in np.flatnonzero(~keep):
        report.skip("no_tokens", f"record {batch.numbers[i]}")
    trash = cleaner.trash(lengths, chars) & keep
    for i in np.flatnonzero(trash):
        report.skip("trash", f"record {batch.numbers[i]}")
    keep &= ~trash
    is_val = np.array([is_validation(t, cfg.validation_fraction) for t in batch.texts], bool)
    records = np.zeros(len(ids), DOC_RECORD)
    records["number"], records["source"] = batch.numbers, batch.sources
    records["bytes"] = [len(t.encode("utf-8", "surrogatepass")) for t in batch.texts]
    if cfg.dedup.exact:
        records["hash"] = [text_hash(t) for t in batch.texts]
    for split, in_split in (("train", keep & ~is_val), ("val", keep & is_val)):
        docs = np.flatnonzero(in_split)
        if len(docs):
            signatures = np.stack([hasher.signature(batch.texts[i]) for i in docs]) if hasher else None
            out = with_separators([ids[i] for i in docs], lengths[docs], separator, writers[split].packed.dtype)
            writers[split].add(out, lengths[docs] + 1, records[docs], signatures)
    return int(lengths[keep].sum()) + int(keep.sum())


def with_separators(pieces: list, n: np.ndarray, separator: int, dtype) -> np.ndarray:
    """The documents' token ids concatenated, ``separator`` after each one (``n``: their lengths)."""
    if any(isinstance(p, np.ndarray) for p in pieces):  # long documents: already arrays
        flat = np.concatenate([np.asarray(p, dtype) for p in pieces])
    else:
        flat = np.fromiter(chain.from_iterable(pieces), dtype, int(n.sum()))
    # scatter tokens around separator slots
    out = np.full(int(n.sum()) + len(pieces), separator, dtype)
    mask = np.ones(len(out), bool)
    mask[np.cumsum(n + 1) - 1] = False
    out[mask] = flat
    return out
