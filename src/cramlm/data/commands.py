"""The standalone data tools behind ``cramlm data pack | inspect | dedup``."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np

from cramlm.data.clean import Cleaner, MinHasher, NearDuplicateIndex, text_hash
from cramlm.data.cramtok import read_packed
from cramlm.data.sources import SkipReport, check_packages, documents
from cramlm.io import atomic_write, write_json


def pack_files(inputs: list[str], tokenizer: str, out: str, text_key: str = "text", on_error: str = "raise") -> dict:
    """Pack files with a given tokenizer into one ``.cramtok`` (every document, no held-out split).

    ``inputs`` are files, folders or globs; every file is read by the format its name says
    (source type ``auto``, the same rule as ``prepare``), so a folder of .jsonl files is JSONL."""
    from cramlm.data.prepare import DataConfig, prepare_data

    sources = [{"type": "auto", "path": p, "text_key": text_key, "on_error": on_error} for p in inputs]
    cfg = DataConfig(name="pack", sources=sources,
                     tokenizer={"path": tokenizer}, validation_fraction=0.0)
    with tempfile.TemporaryDirectory(dir=Path(out).resolve().parent) as tmp:
        prepared = prepare_data(cfg, tmp, progress=True)
        shutil.move(str(prepared.folder / "train.cramtok"), out)
        manifest = prepared.manifest
    write_json(out + ".manifest.json", manifest)
    return {"out": out, **manifest["documents"], "tokens": manifest["train"]["tokens"], "skipped_reasons": manifest["skipped"],
            **({"skipped_sources": manifest["skipped_sources"]} if manifest.get("skipped_sources") else {})}


def inspect_packed(path: str, tokenizer: str | None = None, samples: int = 2, chars: int = 300) -> dict:
    """Stats and decoded samples of a packed file, or of the train file of a prepared folder."""
    from cramlm.data.tokenizer import fingerprint, load_tokenizer

    p = Path(path)
    folder = p if p.is_dir() else None
    if folder and not (folder / "train.cramtok").is_file():
        raise FileNotFoundError(f"{folder}: not a prepared data folder (no train.cramtok in it)")
    packed = read_packed(p / "train.cramtok" if folder else p)  # verifies the checksum
    tok_path = tokenizer or (folder / "tokenizer.json" if folder else None)
    lengths = packed.lengths()
    stats = {
        "file": str(packed.path), "version": packed.version, "vocab_size": packed.vocab_size,
        "token_bytes": packed.width, "documents": packed.num_documents, "tokens": packed.num_tokens,
        "fingerprint": packed.fingerprint.hex(), "checksum": "ok",
        "doc_tokens": {q: int(np.percentile(lengths, v)) for q, v in (("min", 0), ("p50", 50), ("p90", 90), ("max", 100))} if len(lengths) else {},
    }
    if tok_path:
        tok = load_tokenizer(tok_path, strict=False)
        stats["tokenizer_matches"] = fingerprint(tok) == packed.fingerprint
        stats["samples"] = [tok.decode(packed.document(i).tolist(), skip_special_tokens=False)[:chars]
                            for i in np.linspace(0, packed.num_documents - 1, min(samples, packed.num_documents)).astype(int)]
    if folder and (folder / "manifest.json").is_file():
        m = json.loads((folder / "manifest.json").read_text())
        stats["manifest"] = {"documents": m["documents"], "skipped": m["skipped"]}
    return stats


def dedup_sources(cfg, out: str | None = None) -> dict:
    """Stream the cleaned documents of ``cfg.sources``; count exact and near duplicates (first
    copy kept) and optionally write the kept documents as JSONL."""
    check_packages(cfg.sources)
    report, cleaner = SkipReport(limit=cfg.max_entries_in_raw_dataset), Cleaner(cfg.clean)
    seen: set[int] = set()
    near = (MinHasher(cfg.dedup), NearDuplicateIndex(cfg.dedup)) if cfg.dedup.near else None
    if out:  # the output under its name only once complete (a kill leaves none)
        with atomic_write(Path(out)) as tmp, open(tmp, "w", encoding="utf-8") as sink:
            kept = _dedup_into(cfg, report, cleaner, seen, near, sink)
    else:
        kept = _dedup_into(cfg, report, cleaner, seen, near, None)
    return {"read": report.read, "kept": kept, "skipped": dict(report.skipped), "examples": report.examples, "out": out}


def _dedup_into(cfg, report, cleaner, seen, near, sink) -> int:
    """The kept documents' count, each written to ``sink`` (if any) as a JSONL record."""
    kept = 0
    for index, source in enumerate(cfg.sources):
        for text in documents(source, report, index):
            number = report.last_number
            text, reason = cleaner(text)
            if text is None:
                report.skip(reason, f"record {number}")
                continue
            h = text_hash(text)
            if h in seen:
                report.skip("duplicate", f"record {number}")
                continue
            seen.add(h)
            if near is not None and near[1].seen(number, near[0].signature(text)):
                report.skip("near_duplicate", f"record {number}")
                continue
            kept += 1
            if sink:
                sink.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    return kept
