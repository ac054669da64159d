"""The data stage: sources -> tokenizer -> packed train/validation files, cached by config hash.

Output folder ``<cache>/<name>-<key>/`` (key = hash of the data config and the format version):
``tokenizer.json``, ``train.cramtok``, ``val.cramtok``, ``manifest.json`` (what was read, packed
and skipped, with reasons). A folder appears under its final name only once complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import zlib
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Iterable, Iterator

from tokenizers import Tokenizer
from tqdm import tqdm

from cramlm.config.base import Config, component
from cramlm.config.registry import build
from cramlm.data.packed import PackedTokens, PackedWriter, read_packed
from cramlm.data.sources import JsonlSourceConfig, SkipReport, SourceConfig
from cramlm.data.tokenizer import SEP_ID, TokenizerConfig, fingerprint, load_tokenizer, train_tokenizer

PIPELINE_VERSION = 1  # bump when the output of the same config changes; part of the cache key


class DataConfig(Config):
    name: str = "default"
    sources: list[component(SourceConfig)] = [JsonlSourceConfig(path="pkg://moby_dick.jsonl.gz")]
    tokenizer: TokenizerConfig = TokenizerConfig()
    seq_length: int = 128
    validation_fraction: float = 0.02  # documents held out (chosen by a hash of their text)
    max_entries_in_raw_dataset: int | None = None  # read at most this many documents

    def cache_key(self) -> str:
        blob = json.dumps([PIPELINE_VERSION, self.model_dump(mode="json")], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


class PrepareConfig(Config):
    """Root config of ``cramlm data prepare`` (same keys as in ``cramlm pretrain``)."""

    data: DataConfig = DataConfig()
    cache: str = "outputs/data"
    plugins: list[str] = []


PREPARE_DEFAULTS: dict = {"data": "default"}


@dataclass
class PreparedData:
    folder: Path
    tokenizer: Tokenizer
    train: PackedTokens
    val: PackedTokens | None
    manifest: dict


def iter_documents(cfg: DataConfig, report: SkipReport) -> Iterator[str]:
    docs = (doc for source in cfg.sources for doc in build("source", source, report))
    return islice(docs, cfg.max_entries_in_raw_dataset) if cfg.max_entries_in_raw_dataset else docs


def is_validation(text: str, fraction: float) -> bool:
    """Stable held-out choice: the same document lands on the same side whatever the order."""
    return fraction > 0 and zlib.crc32(text.encode("utf-8")) % 1_000_000 < fraction * 1_000_000


def _batches(items: Iterable[str], size: int) -> Iterator[list[str]]:
    it = iter(items)
    while batch := list(islice(it, size)):
        yield batch


def load_prepared(folder: Path) -> PreparedData:
    manifest = json.loads((folder / "manifest.json").read_text())
    val = folder / "val.cramtok"
    return PreparedData(
        folder, load_tokenizer(folder), read_packed(folder / "train.cramtok"),
        read_packed(val) if val.exists() else None, manifest,
    )


def prepare_data(cfg: DataConfig, cache_root: str | Path, progress: bool = True) -> PreparedData:
    """Prepare (or reuse) the packed data for ``cfg`` under ``cache_root``."""
    folder = Path(cache_root) / f"{cfg.name}-{cfg.cache_key()}"
    if (folder / "manifest.json").is_file():
        return load_prepared(folder)
    start = time.perf_counter()
    tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)

    if cfg.tokenizer.path:
        tok = load_tokenizer(cfg.tokenizer.path)
    else:
        texts = iter_documents(cfg, SkipReport())
        if cfg.tokenizer.max_training_docs:
            texts = islice(texts, cfg.tokenizer.max_training_docs)
        tok = train_tokenizer(cfg.tokenizer, texts)
    tok.save(str(tmp / "tokenizer.json"))
    vocab_size, fp = tok.get_vocab_size(), fingerprint(tok)

    report = SkipReport()
    counts = {"train": [0, 0], "val": [0, 0]}  # documents, tokens
    writers = {"train": PackedWriter(tmp / "train.cramtok", vocab_size, fp)}
    if cfg.validation_fraction > 0:
        writers["val"] = PackedWriter(tmp / "val.cramtok", vocab_size, fp)
    bar = tqdm(desc="packing", unit=" docs", disable=not progress, dynamic_ncols=True)
    for batch in _batches(iter_documents(cfg, report), 1024):
        for text, enc in zip(batch, tok.encode_batch(batch, add_special_tokens=False)):
            if not enc.ids:
                report.skip("no_tokens", text[:40])
                continue
            split = "val" if "val" in writers and is_validation(text, cfg.validation_fraction) else "train"
            writers[split].add(enc.ids + [SEP_ID])
            counts[split][0] += 1
            counts[split][1] += len(enc.ids) + 1
        bar.update(len(batch))
        bar.set_postfix(tokens=counts["train"][1] + counts["val"][1])
    bar.close()
    for writer in writers.values():
        writer.close()
    packed = counts["train"][0] + counts["val"][0]
    manifest = {
        "config": cfg.model_dump(mode="json"),
        "pipeline_version": PIPELINE_VERSION,
        "vocab_size": vocab_size,
        "documents": {"read": report.read, "packed": packed, "skipped": sum(report.skipped.values())},
        "skipped": dict(report.skipped),
        "skipped_examples": report.examples,
        "train": {"documents": counts["train"][0], "tokens": counts["train"][1]},
        "val": {"documents": counts["val"][0], "tokens": counts["val"][1]},
        "seconds": round(time.perf_counter() - start, 3),
    }
    assert manifest["documents"]["read"] == packed + manifest["documents"]["skipped"], manifest["documents"]
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2))
    if folder.exists():  # another process finished first; keep its result
        shutil.rmtree(tmp)
    else:
        os.replace(tmp, folder)
    return load_prepared(folder)
