"""Merge packed shards into the final files: global order, dedup, mixture weights, ordering, caps.

Works on per-document arrays only (a few bytes per document) and copies tokens a bounded chunk
at a time, so memory does not grow with the token count. Shards are ordered by global record
number, so ``N`` shards merge to exactly what one shard gives.
"""

from __future__ import annotations

import os
import shutil
from collections import Counter
from pathlib import Path

import numpy as np

from cramlm.data.clean import first_occurrences, near_duplicates
from cramlm.data.packing import DOC_RECORD, SPLITS, read_shard_info
from cramlm.data.cramtok import PackedFormatError, PackedTokens, PackedWriter, read_packed
from cramlm.data.permute import Permutation, uniform


SUBSET_SALT = np.uint64(0x5EED5B5E7)  # data.train_subset's draw, apart from the mixture weights'


def mixture_copies(numbers: np.ndarray, weights: np.ndarray, seed: int) -> np.ndarray:
    """How many times each document is packed: floor(w), plus one with probability frac(w)."""
    u = uniform(numbers.astype(np.uint64) ^ np.uint64(seed))
    return (np.floor(weights) + (u < weights - np.floor(weights))).astype(np.int64)


def write_documents(parts: list[PackedTokens], part_of: np.ndarray, local: np.ndarray, writer: PackedWriter,
                    chunk_tokens: int = 1 << 22) -> None:
    """Append document ``local[k]`` of part ``part_of[k]`` for every k, in order, chunk by chunk."""
    offsets = [p.offsets[:].astype(np.int64) for p in parts]
    files = [open(p.path, "rb") for p in parts]  # plain reads: merged files do not stay resident
    pieces, lengths, size = [], [], 0
    for p, d in zip(part_of.tolist(), local.tolist()):
        start, end = int(offsets[p][d]), int(offsets[p][d + 1])
        pieces.append(parts[p].pread(files[p].fileno(), start, end))
        lengths.append(end - start)
        size += end - start
        if size >= chunk_tokens:
            writer.add_batch(np.concatenate(pieces), np.array(lengths))
            pieces, lengths, size = [], [], 0
    if pieces:
        writer.add_batch(np.concatenate(pieces), np.array(lengths))
    for f in files:
        f.close()


def read_split(cfg, shard_folders: list[Path], split: str, fp: bytes):
    """One split of every shard, in global read order: (packed parts, document records, part and
    index within the part of each document, lengths, MinHash signatures or None)."""
    parts, records, part_of, local, signatures = [], [], [], [], []
    for i, folder in enumerate(shard_folders):
        packed = read_packed(folder / f"{split}.cramtok", fingerprint=fp)
        docs = np.fromfile(folder / f"{split}.docs.bin", dtype=DOC_RECORD)
        if len(docs) != packed.num_documents:
            raise PackedFormatError(f"{folder}: {len(docs)} document records for {packed.num_documents} documents")
        parts.append(packed)
        records.append(docs)
        part_of.append(np.full(len(docs), i, np.int64))
        local.append(np.arange(len(docs)))
        if cfg.dedup.near:
            signatures.append(np.fromfile(folder / f"{split}.minhash.bin", dtype="<u4").reshape(-1, cfg.dedup.num_perm))
    docs, part_of, local = np.concatenate(records), np.concatenate(part_of), np.concatenate(local)
    order = np.argsort(docs["number"], kind="stable")  # global read order
    lengths = np.concatenate([p.lengths() for p in parts])[order] if parts else np.zeros(0, np.int64)
    sigs = np.concatenate(signatures)[order] if cfg.dedup.near else None
    return parts, docs[order], part_of[order], local[order], lengths, sigs


def ordered(cfg, sequence: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The documents to write in ``data.ordering``: as read, shuffled by seed, or shortest first."""
    if cfg.ordering == "random":
        return sequence[Permutation(len(sequence), cfg.seed)(np.arange(len(sequence)))] if len(sequence) else sequence
    if cfg.ordering == "sentence-length-curriculum":
        # cramming orders sequences so that many short sentences come first; at document level:
        # shortest documents first (ties keep read order)
        return sequence[np.argsort(lengths[sequence], kind="stable")]
    return sequence


def merge_split(cfg, shard_folders: list[Path], split: str, out: Path, vocab_size: int, fp: bytes,
                skipped: Counter, examples: dict) -> dict:
    """Merge one split of all shards into ``out``; returns its counts."""
    parts, docs, part_of, local, lengths, sigs = read_split(cfg, shard_folders, split, fp)
    keep = np.ones(len(docs), bool)

    def drop(mask: np.ndarray, reason: str) -> None:
        for k in np.flatnonzero(mask & keep)[: 20 - len(examples.get(reason, []))]:
            examples.setdefault(reason, []).append(f"record {int(docs['number'][k])}")
        if removed := int((mask & keep).sum()):
            skipped[reason] += removed
        keep[mask] = False

    if cfg.dedup.exact:
        drop(~first_occurrences(docs["hash"]), "duplicate")
    if cfg.dedup.near:
        kept = np.flatnonzero(keep)
        near = np.zeros(len(docs), bool)
        near[kept] = near_duplicates(sigs[kept], cfg.dedup)
        drop(near, "near_duplicate")
    if split == "train" and cfg.train_subset < 1:  # its own draw: independent of the mixture weights' below
        drop(uniform(docs["number"].astype(np.uint64) ^ np.uint64(cfg.seed) ^ SUBSET_SALT) >= cfg.train_subset, "train_subset")
    weights = np.array([s.weight for s in cfg.sources], np.float64)[docs["source"]]
    copies = np.where(keep, mixture_copies(docs["number"], weights, cfg.seed), 0)
    drop(keep & (copies == 0), "subsampled")
    sequence = np.repeat(np.arange(len(docs)), copies)  # documents, repeated by mixture weight

    sequence = ordered(cfg, sequence, lengths)
    capped = 0
    if split == "train" and cfg.max_seq_in_tokenized_dataset:
        budget = cfg.max_seq_in_tokenized_dataset * (cfg.seq_length - 1)
        cut = int(np.searchsorted(np.cumsum(lengths[sequence]), budget, side="left")) + 1
        capped = max(0, len(sequence) - cut)
        sequence = sequence[:cut]
    in_output = np.zeros(len(docs), bool)
    in_output[sequence] = True
    drop(keep & ~in_output, "capped")  # every copy fell beyond max_seq_in_tokenized_dataset
    if len(parts) == 1 and len(sequence) == parts[0].num_documents and np.array_equal(local[sequence], np.arange(len(sequence))):
        # one shard, nothing removed or reordered: the shard file is the output, linked (copied where
        # links fail), so the shard stays whole: kept shards, or a merge that fails later, still hold it
        try:
            os.link(parts[0].path, out)
        except OSError:
            shutil.copyfile(parts[0].path, out)
    else:
        with PackedWriter(out, vocab_size, fp) as writer:
            write_documents(parts, part_of[sequence], local[sequence], writer)
    return {"documents": int(keep.sum()), "copies_written": len(sequence), "capped_copies": capped,
            "tokens": int(lengths[sequence].sum()), "bytes": int(docs["bytes"][sequence].sum())}


def merge_shards(cfg, shard_folders: list[Path], out_folder: Path, vocab_size: int, fp: bytes) -> dict:
    """Merge shard folders into ``out_folder``/{train,val}.cramtok; returns the manifest counts."""
    infos = []
    for folder in shard_folders:
        infos.append(read_shard_info(folder))
    shards = sorted(tuple(i["shard"]) for i in infos)
    count = shards[0][1] if shards else 0
    if shards != [(i, count) for i in range(count)]:
        raise ValueError(f"merge needs shards 0..{count - 1} of {count}, got {shards}")
    skipped: Counter = Counter()
    examples: dict[str, list[str]] = {}
    sources: dict[str, str] = {}  # every shard reads every file: the same file once
    for info in infos:
        sources.update({s["path"]: s["reason"] for s in info.get("skipped_sources", [])})
        skipped.update(info["skipped"])
        for reason, where in info["skipped_examples"].items():
            examples.setdefault(reason, []).extend(where[: 20 - len(examples.get(reason, []))])
    splits = {s: merge_split(cfg, shard_folders, s, out_folder / f"{s}.cramtok", vocab_size, fp, skipped, examples)
              for s in SPLITS}
    read = sum(i["read"] for i in infos)
    packed = sum(s["documents"] for s in splits.values())
    if read != packed + sum(skipped.values()):
        raise RuntimeError(f"merge: read {read} != packed {packed} + skipped {dict(skipped)}")
    if splits["val"]["documents"] == 0:
        os.remove(out_folder / "val.cramtok")
    return {"documents": {"read": read, "packed": packed, "skipped": sum(skipped.values())},
            "skipped": dict(skipped), "skipped_examples": examples,
            "skipped_sources": [{"path": p, "reason": r} for p, r in sorted(sources.items())], **splits}
