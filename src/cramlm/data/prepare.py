"""The data stage: sources -> tokenizer -> packed shards -> merged train/val files, cached by config hash.

Output folder ``<cache>/<name>-<key>/`` (key = hash of the data config and the pipeline version;
``<cache>`` is per user unless set: ``$CRAMLM_CACHE/data``, else ``$XDG_CACHE_HOME/cramlm/data``,
else ``~/.cache/cramlm/data``, so runs from any folder share prepared data):
``tokenizer.json``, ``train.cramtok``, ``val.cramtok`` (absent when no document is held out),
``manifest.json`` (what was read, packed and skipped, with reasons). A folder appears under its
final name only once complete. Sharded preparation (N machines, e.g. a Slurm array) writes
``<cache>/<name>-<key>.shards/shard-<i>-of-<N>/`` per shard, then :func:`merge_prepared` builds
the same output folder a single-shard run gives. Finished shards are never redone.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Iterator, Literal

from pydantic import Field, model_validator
from tokenizers import Tokenizer

from cramlm.config.base import KEYLESS_DEFAULT, RESUME_FREE, Config, PositiveInt, SafeName, key_dump
from cramlm.config.registry import component
from cramlm.data.clean import Cleaner, CleanConfig, DedupConfig
from cramlm.data.sources import DataError, JsonlSourceConfig, SkipReport, SourceConfig, check_packages, documents
from cramlm.data.tokenizer import (TokenizerConfig, fingerprint, load_tokenizer, separator_id, special_ids, train_tokenizer,
                                   unknown_id)
from cramlm.io import atomic_dir, atomic_path, atomic_write, remove_leftover
from cramlm.locks import FolderLock

if TYPE_CHECKING:
    from cramlm.data.cramtok import PackedTokens

# merge, packing and cramtok (numpy) are imported where data is read or written: the config classes
# here are what `cramlm --help`, a config error and `config show` import, and those stay light.

PIPELINE_VERSION = 4  # bump when the output of the same config changes; part of the cache key (4: deterministic tokenizers)



class DataConfig(Config):
    name: SafeName = Field("default", description="the cache folder is <cache>/<name>-<key>", json_schema_extra=RESUME_FREE)
    sources: list[component(SourceConfig)] = Field(
        [JsonlSourceConfig(path="pkg://moby_dick.jsonl.gz")],
        description="the corpora to read, in order; each a component with its own type (jsonl, text, parquet, auto, hf)")
    tokenizer: TokenizerConfig = Field(TokenizerConfig(), description="the tokenizer trained (or loaded) for this corpus")
    clean: CleanConfig = Field(CleanConfig(), description="text normalisation and length filters, applied while reading")
    dedup: DedupConfig = Field(DedupConfig(), description="exact and near-duplicate removal, applied when merging shards")
    seq_length: Annotated[int, Field(ge=2)] = Field(128, description="tokens per sequence ([CLS] + at least one token)")
    validation_fraction: Annotated[float, Field(ge=0, lt=1)] = Field(
        0.02, description="documents held out (chosen by a hash of their text)"
    )
    max_entries_in_raw_dataset: PositiveInt | None = Field(
        None, description="read at most this many raw records (cramming)"
    )
    max_seq_in_tokenized_dataset: PositiveInt | None = Field(
        None, description="keep at most this many training sequences (cramming)"
    )
    ordering: Literal["as-read", "random", "sentence-length-curriculum"] = Field(
        "as-read", description="order of the training sequences: as read from the sources, shuffled once by seed, or "
        "shortest documents first (cramming's short-sentences-first curriculum at document level)")
    seed: int = Field(0, description="for random ordering and fractional mixture weights")
    train_subset: Annotated[float, Field(gt=0, le=1)] = Field(
        1.0, description="share of the training split's documents kept, chosen by a hash of each document's number "
        "and the seed (skipped as train_subset); validation stays whole, and the tokenizer is trained as without it: "
        "the same held-out set and tokens for a run on less text (what repetition costs at equal FLOPs). Mixture "
        "weights apply to the documents kept", json_schema_extra=KEYLESS_DEFAULT)

    def cache_key(self) -> str:
        blob = json.dumps([PIPELINE_VERSION, key_dump(self)], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def local_paths(self) -> list[tuple[str, str]]:
        """(source index, or "tokenizer"; path) of each plain local path the data reads: pkg://,
        python:// and npm:// files (fixed by their version) and hub datasets aside."""
        out = [(str(i), s.path) for i, s in enumerate(self.sources)
               if s.type != "hf" and isinstance(getattr(s, "path", None), str) and "://" not in s.path]
        return out + ([("tokenizer", self.tokenizer.path)] if self.tokenizer.path and "://" not in self.tokenizer.path else [])

    def input_files(self) -> list[dict] | None:
        """Each local file the sources and the tokenizer read (``local_paths``), named by its source and
        its place under that source's files (so a corpus moved whole is the same input): with its size
        and modification time, what a changed input shows, and its path; None where a source cannot be
        listed here (gone, a hub dataset, a plugin's own), and then a cache's inputs are not checked."""
        from cramlm.data.sources import expand_paths

        if any(s.type == "hf" or not isinstance(getattr(s, "path", None), str) for s in self.sources):
            return None
        named: list[tuple[str, Path]] = []
        try:
            for key, path in self.local_paths():
                if key == "tokenizer":
                    named.append((f"tokenizer:{Path(path).name}", Path(path).resolve()))
                    continue
                files = [p.resolve() for p in expand_paths(path)]
                root = Path(os.path.commonpath(files)) if len(files) > 1 else files[0].parent
                named += [(f"{key}:{f.relative_to(root)}", f) for f in files]
            return [{"input": name, "path": str(p), "bytes": (st := p.stat()).st_size, "mtime_ns": st.st_mtime_ns}
                    for name, p in named]
        except (DataError, OSError, ValueError):
            return None

    def resolve_tokenizer(self, objective: str) -> None:
        """Make the tokenizer's ``auto`` choices for a masked ("mlm") or causal ("clm") model, in
        place (root configs call this when validated, so the cache key and config.yaml show them)."""
        resolved = self.tokenizer.for_objective(objective)
        if resolved is not self.tokenizer:
            self.tokenizer = resolved


class PrepareConfig(Config):
    """Root config of ``cramlm data prepare`` (same keys as in ``cramlm pretrain``)."""

    data: DataConfig = Field(DataConfig(), description="corpus, tokenizer and packing (the data group)")
    objective: Literal["mlm", "clm"] = Field(
        "mlm", description="the kind of model the data is for (data.tokenizer.kind=auto follows it)"
    )
    cache: str | None = Field(
        None, description="folder of the prepared-data cache; null: per user, $CRAMLM_CACHE/data, $XDG_CACHE_HOME/cramlm/data or "
        "~/.cache/cramlm/data)")
    plugins: list[str] = Field([], description="modules to import first, which register their own components (sources)")

    @model_validator(mode="after")
    def _tokenizer_for_objective(self):
        self.data.resolve_tokenizer(self.objective)
        return self


PREPARE_DEFAULTS: dict = {"data": "default"}


@dataclass
class PreparedData:
    folder: Path
    tokenizer: Tokenizer
    train: PackedTokens
    val: PackedTokens | None
    manifest: dict

    def identity(self) -> dict[str, str]:
        """What pins this data's bytes: the tokenizer's fingerprint and each packed file's content
        checksum (CRC32 of its tokens and offsets, verified when it is loaded) with its token count.
        A run records it; a resume against other data is refused (train/checkpoint.py)."""
        files = {"train.cramtok": self.train, "val.cramtok": self.val}
        return {"tokenizer": fingerprint(self.tokenizer).hex(),
                **{name: f"crc32:{p.crc:08x} tokens:{p.num_tokens}" for name, p in files.items() if p is not None}}


def cache_dir(cache_root: str | Path | None = None) -> Path:
    """``cache_root``, or the per-user cache of prepared data when it is None."""
    if cache_root:
        return Path(cache_root)
    from cramlm.io import user_cache

    return user_cache() / "data"


def output_folder(cfg: DataConfig, cache_root: str | Path | None) -> Path:
    return cache_dir(cache_root) / f"{cfg.name}-{cfg.cache_key()}"


def shards_folder(cfg: DataConfig, cache_root: str | Path | None) -> Path:
    folder = output_folder(cfg, cache_root)
    return folder.with_name(folder.name + ".shards")


def iter_documents(cfg: DataConfig, report: SkipReport) -> Iterator[str]:
    """Cleaned documents of all sources (unsharded), for tokenizer training."""
    cleaner = Cleaner(cfg.clean)
    for index, source in enumerate(cfg.sources):
        for text in documents(source, report, index):
            text, _ = cleaner(text)
            if text is not None:
                yield text
        if report.done:
            return


def get_tokenizer(cfg: DataConfig, folder: Path, wait_s: float = 7200) -> Tokenizer:
    """The configured tokenizer, saved as ``folder/tokenizer.json`` (trained once, then reused).

    Training is deterministic (data/tokenizer.py), but it takes a while, so all shards share one
    tokenizer: the first process to take ``tokenizer.lock`` trains it, the others wait for it (a
    lock whose process died is free again: see cramlm.locks)."""
    saved = folder / "tokenizer.json"
    if saved.is_file():
        return load_tokenizer(saved, strict=False)
    with FolderLock(folder / "tokenizer.lock", f"{folder} (tokenizer training)", timeout=wait_s):
        if not saved.is_file():  # not trained by whoever held the lock before us
            tok = make_tokenizer(cfg)
            with atomic_write(saved) as tmp:
                tok.save(str(tmp))
    return load_tokenizer(saved, strict=False)


def make_tokenizer(cfg: DataConfig) -> Tokenizer:
    if cfg.tokenizer.path:
        return load_tokenizer(cfg.tokenizer.path, strict=False)
    check_packages(cfg.sources)
    limit = cfg.max_entries_in_raw_dataset
    if cfg.tokenizer.max_training_docs:
        limit = min(limit or cfg.tokenizer.max_training_docs, cfg.tokenizer.max_training_docs)
    return train_tokenizer(cfg.tokenizer, _Documents(cfg, limit))


@dataclass
class _Documents:
    """The tokenizer's training documents, read afresh on each iteration (train_tokenizer reads
    them twice; a list of them could take gigabytes)."""

    cfg: DataConfig
    limit: int | None

    def __iter__(self) -> Iterator[str]:
        return iter_documents(self.cfg, SkipReport(limit=self.limit))


def load_prepared(folder: Path, verify: bool = True) -> PreparedData:
    from cramlm.data.cramtok import read_packed

    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except ValueError as e:  # damaged cache: name the file, not only the JSON position
        raise ValueError(f"{folder / 'manifest.json'}: unreadable ({e}); remove {folder} to prepare again") from None
    tok = load_tokenizer(folder / "tokenizer.json", strict=False)
    fp = fingerprint(tok)
    val = folder / "val.cramtok"
    return PreparedData(
        folder, tok, read_packed(folder / "train.cramtok", verify, fp),
        read_packed(val, verify, fp) if val.exists() else None, manifest,
    )


def shard_name(index: int, count: int) -> str:
    return f"shard-{index:05d}-of-{count:05d}"


def prepare_shard(cfg: DataConfig, cache_root: str | Path | None, num_shards: int, shard_index: int,
                  progress: bool = True, batch_chars: int = 2_000_000) -> dict:
    """Pack shard ``shard_index`` of ``num_shards`` (a no-op if that shard is already done)."""
    if not 0 <= shard_index < num_shards:
        raise ValueError(f"shard index {shard_index} not in [0, {num_shards})")
    from cramlm.data.packing import naming_a_full_disk, pack_shard

    check_packages(cfg.sources)  # every missing package named at once, before the tokenizer reads any
    root = shards_folder(cfg, cache_root)
    with naming_a_full_disk(root, "saving the tokenizer in"):
        tok = get_tokenizer(cfg, root)
    return pack_shard(cfg, tok, separator_id(tok, cfg.tokenizer.separator), root / shard_name(shard_index, num_shards),
                      (shard_index, num_shards), batch_chars, progress)


def _merge_into(tmp: Path, cfg: DataConfig, root: Path, tok: Tokenizer, num_shards: int, start: float) -> None:
    """The merged train/val files, the tokenizer and the manifest, written into ``tmp``."""
    from cramlm.data.cramtok import VERSION as FORMAT_VERSION
    from cramlm.data.cramtok import read_packed
    from cramlm.data.merge import merge_shards
    from cramlm.data.packing import read_shard_info

    shutil.copyfile(root / "tokenizer.json", tmp / "tokenizer.json")
    fp = fingerprint(tok)
    shard_folders = [root / shard_name(i, num_shards) for i in range(num_shards)]
    counts = merge_shards(cfg, shard_folders, tmp, tok.get_vocab_size(), fp)
    packed = {split: read_packed(tmp / f"{split}.cramtok", verify=False) for split in ("train", "val")
              if (tmp / f"{split}.cramtok").is_file()}
    unk = unknown_id(tok)
    for split in ("train", "val"):
        counts[split]["unknown_tokens"] = count_id(packed[split], unk) if unk is not None and split in packed else 0
    manifest = {
        "config": cfg.model_dump(mode="json"),
        "pipeline_version": PIPELINE_VERSION,
        "format_version": FORMAT_VERSION,
        "vocab_size": tok.get_vocab_size(),
        "tokenizer_fingerprint": fp.hex(),
        "separator_id": separator_id(tok, cfg.tokenizer.separator),
        "special_ids": special_ids(tok),
        **counts,
        "shards": num_shards,
        "shard_seconds": [read_shard_info(f)["seconds"] for f in shard_folders],
        "merge_seconds": round(time.perf_counter() - start, 3),
        "inputs": cfg.input_files(),  # checked when the cache is reused (reuse_prepared)
    }
    manifest["checksums"] = {f"{split}.cramtok": f"crc32:{p.crc:08x}" for split, p in packed.items()}
    manifest["warnings"] = preparation_warnings(cfg, manifest)
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2))


SKIPPED_WARN = 0.1  # a preparation that skips more of what it read (train_subset's choice aside) says so
UNKNOWN_WARN = 0.001  # ... or whose training tokens are more often the unknown token (the shared corpus: 5 in 11M)


def count_id(packed, token: int, chunk: int = 1 << 24) -> int:
    """How often ``token`` occurs in a packed file, read a chunk at a time (a web corpus's file is GBs)."""
    import numpy as np

    tokens = packed.tokens
    return sum(int(np.count_nonzero(tokens[i:i + chunk] == token)) for i in range(0, len(tokens), chunk))


def preparation_warnings(cfg: DataConfig, manifest: dict) -> list[str]:
    """What a preparation made that a run would otherwise go on with unnoticed (manifest.json:
    ``warnings``; printed when it is prepared): a tokenizer smaller than asked, an empty or too short
    validation split, training tokens often the unknown token, a large share of the documents skipped."""
    out = []
    asked, got = cfg.tokenizer.vocab_size, manifest["vocab_size"]
    if not cfg.tokenizer.path and asked and got < asked:
        out.append(f"the tokenizer has {got:,} tokens, fewer than the {asked:,} asked (data.tokenizer.vocab_size): "
                   "its training text offers no more merges")
    docs = manifest["documents"]
    if cfg.validation_fraction > 0 and not manifest["val"]["documents"] and docs["packed"]:
        out.append(f"the validation split is empty (data.validation_fraction={cfg.validation_fraction} chose none of the "
                   f"{docs['packed']:,} documents packed): runs on it report no held-out loss; add text or raise it")
    elif cfg.validation_fraction > 0 and manifest["val"]["tokens"] < cfg.seq_length:
        out.append(f"the validation split holds {manifest['val']['tokens']:,} tokens, less than one sequence of "
                   f"{cfg.seq_length} (data.seq_length): runs on it report no held-out loss; add text or raise "
                   "data.validation_fraction")
    train = manifest["train"]
    if train.get("unknown_tokens", 0) > UNKNOWN_WARN * max(train["tokens"], 1):
        out.append(f"{train['unknown_tokens']:,} of the {train['tokens']:,} training tokens "
                   f"({100 * train['unknown_tokens'] / train['tokens']:.2f}%) are the unknown token: the tokenizer's "
                   "vocabulary cannot spell parts of this text (its characters, or words over its length limit), which the "
                   "model then never sees")
    reasons = {r: n for r, n in manifest["skipped"].items() if r != "train_subset"}
    if docs["read"] and sum(reasons.values()) > SKIPPED_WARN * docs["read"]:
        out.append(f"{sum(reasons.values()):,} of the {docs['read']:,} documents read were skipped ("
                   + ", ".join(f"{r} {n:,}" for r, n in sorted(reasons.items(), key=lambda x: -x[1]))
                   + "; manifest.json: skipped, skipped_examples)")
    return out


def _note(message: str) -> None:
    print(message, file=sys.stderr)  # stdout may be a command's JSON (cramlm data prepare)


def reuse_prepared(cfg: DataConfig, folder: Path, say=_note, resuming: bool = False) -> PreparedData:
    """The prepared data in ``folder``, if the files it was prepared from are the ones ``cfg`` reads
    now (the same files and sizes; a file only modified since is said in a line): a cache prepared
    from other text is refused, never trained on. ``resuming``: a run continues from a checkpoint
    (which pins the data it trained on: checked against this cache on resume), so changed inputs
    are said, not refused: the run goes on with the cache's tokens."""
    prepared = load_prepared(folder)
    then, now = prepared.manifest.get("inputs"), cfg.input_files()
    if then is None or now is None:  # prepared before inputs were recorded, or not listable here
        return prepared
    before = {f.get("input", f["path"]): f for f in then}
    current = {f["input"]: f for f in now}
    changed = sorted(current[k]["path"] for k in before.keys() & current.keys() if before[k]["bytes"] != current[k]["bytes"])
    added = sorted(current[k]["path"] for k in current.keys() - before.keys())
    gone = sorted(before[k]["path"] for k in before.keys() - current.keys())
    if changed or added or gone:
        what = "; ".join(f"{label} {names[0]}" + (f" (and {len(names) - 1} more)" if len(names) > 1 else "")
                         for label, names in (("changed size:", changed), ("new:", added), ("gone:", gone)) if names)
        if resuming:
            say(f"cramlm: note: {folder}: the input files changed since this cache was prepared ({what}); the run "
                "resumed goes on with the cache's tokens, the data it trained on (a fresh run would be refused)")
            return prepared
        raise DataError(f"{folder}: this data cache was prepared from other files than data.sources reads now ({what}); "
                        f"remove {folder} to prepare it again, or set data.name to keep both")
    touched = sorted(current[k]["path"] for k in before if before[k].get("mtime_ns") != current[k]["mtime_ns"])
    if touched:
        say(f"cramlm: note: {touched[0]}" + (f" and {len(touched) - 1} more input files were" if len(touched) > 1 else " was")
            + f" modified since {folder.name} was prepared (same size): its tokens are those of the files then; "
            f"remove {folder} to prepare again if their text changed")
    return prepared


def preparation_lock(folder: Path) -> FolderLock:
    """The lock one preparation or merge of a data-cache entry holds (``.<folder>.lock`` beside it)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    return FolderLock(folder.with_name(f".{folder.name}.lock"), f"data cache entry {folder} (preparation)", timeout=PREPARE_WAIT_S)


@contextmanager
def preparing(folder: Path) -> Iterator[None]:
    """Hold the entry's lock, its stopped preparations' temporaries removed first (the space they
    hold may be what packing needs); the lock file goes once the block has prepared the entry
    (whoever takes the lock from then on finds its manifest)."""
    with preparation_lock(folder) as lock:
        clear_stopped_writes(folder)
        yield
        lock.path.unlink(missing_ok=True)


def clear_stopped_writes(folder: Path, say=_note) -> list[Path]:
    """Remove the temporary folders (``.<folder>.tmp-<pid>``) that stopped preparations of this entry
    left, a kill's (SIGKILL, a lost machine) as large as the packed tokens. Called only while holding
    the entry's lock, so no live writer owns one (on a file system shared by several machines, where
    it honours ``flock`` as the run folders' locks need too: cramlm/locks.py)."""
    removed = []
    for stale in sorted(folder.parent.glob(atomic_path(folder, "*").name)):
        size = remove_leftover(stale)
        say(f"cramlm: removed {stale} ({size / 1e6:,.1f} MB), left by a preparation of {folder.name} that was stopped")
        removed.append(stale)
    return removed


def merge_prepared(cfg: DataConfig, cache_root: str | Path | None, num_shards: int, keep_shards: bool = False) -> PreparedData:
    """Merge the ``num_shards`` finished shards into the output folder (holding its lock, so a second
    merge or preparation of the same entry waits, then reuses the result; the shards, no longer
    needed, go unless ``keep_shards``)."""
    folder = output_folder(cfg, cache_root)
    prepared = None
    if not (folder / "manifest.json").is_file():
        with preparing(folder):
            if not (folder / "manifest.json").is_file():
                prepared = _merge_locked(cfg, cache_root, num_shards, keep_shards)
    if prepared is None:  # merged by another process (`cramlm run` preparing the same config, say)
        prepared = reuse_prepared(cfg, folder)
        if not keep_shards:
            remove_shards(shards_folder(cfg, cache_root), num_shards)
    return prepared


def _merge_locked(cfg: DataConfig, cache_root: str | Path | None, num_shards: int, keep_shards: bool = False) -> PreparedData:
    from cramlm.data.packing import naming_a_full_disk

    folder = output_folder(cfg, cache_root)
    start = time.perf_counter()
    root = shards_folder(cfg, cache_root)
    tok = get_tokenizer(cfg, root)
    with naming_a_full_disk(folder, "merging"), atomic_dir(folder, if_exists="keep") as tmp:  # (another process's result stands)
        _merge_into(tmp, cfg, root, tok, num_shards, start)
    if not keep_shards:
        remove_shards(root, num_shards)
    prepared = load_prepared(folder)
    for warning in prepared.manifest.get("warnings", []):
        _note(f"cramlm: warning: {folder.name}: {warning}")
    return prepared


SHARED = ("tokenizer.json", "tokenizer.lock", "tokenizer.lock.owner")  # what the shards of every count share


def remove_shards(root: Path, num_shards: int) -> None:
    """After a merge of ``num_shards``: those shards and their temporaries of killed packers; the
    whole ``.shards`` folder (its tokenizer too) only when no other count's shards are in it, as
    those of an array job still packing with another count would be."""
    for name in [shard_name(i, num_shards) for i in range(num_shards)]:
        for leftover in [root / name, *root.glob(atomic_path(root / name, "*").name)]:
            shutil.rmtree(leftover, ignore_errors=True)
    if root.is_dir() and all(p.name in SHARED or p.name.startswith(".tokenizer.json.tmp-") for p in root.iterdir()):
        shutil.rmtree(root, ignore_errors=True)


def prepare_data(cfg: DataConfig, cache_root: str | Path | None, progress: bool = True, batch_chars: int = 2_000_000,
                 resuming: bool = False) -> PreparedData:
    """Prepare (or reuse) the packed data for ``cfg`` under ``cache_root``: one shard, then merge.
    One process prepares a config at a time (``.<folder>.lock`` beside it): a second one waits for
    it and reuses its result, so neither removes the other's work in progress. ``resuming``: for a
    run that continues from a checkpoint (``reuse_prepared``)."""
    folder = output_folder(cfg, cache_root)
    if (folder / "manifest.json").is_file():
        return reuse_prepared(cfg, folder, resuming=resuming)
    prepared = None
    with preparing(folder):
        if not (folder / "manifest.json").is_file():  # else the process that held the lock prepared it
            prepare_shard(cfg, cache_root, 1, 0, progress, batch_chars)
            prepared = _merge_locked(cfg, cache_root, 1)
    return prepared or load_prepared(folder)


PREPARE_WAIT_S = 7200  # how long a second preparation of one config waits for the first
