"""Document sources: each yields text documents and counts what it skips, and why.

Types: ``jsonl`` (.jsonl, .jsonl.gz, .jsonl.zst), ``text`` (one document per file or per blank-line
block), ``parquet``, ``auto`` (each file read by the format its name says: :func:`infer_format`),
``hf`` (Hugging Face datasets, streaming by default; needs the ``hf-datasets`` extra and the hub). Paths may be local files, directories, globs, ``pkg://<file>`` for the
corpora shipped in ``cramlm/resources/``, or files inside an installed package: ``python://<package>==<version>/<glob>``,
``npm://<package>@<version>/<glob>`` (:func:`cramlm.io.installed_package_path`). The text is chosen by a dotted key path (``meta.body``).

Every raw record goes through :meth:`SkipReport.claim`, which numbers it (the global record index
that shards and merges order by), applies the ``max_entries_in_raw_dataset`` cap and tells a shard
whether the record is its own, so ``read == packed + skipped`` holds per shard and in total.
"""

from __future__ import annotations

import glob
import gzip
import io
import json
import os
import re
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar, Iterator, Literal

from pydantic import Field

from cramlm.config.base import ComponentConfig, NonNegativeFloat
from cramlm.config.registry import build, register
from cramlm.io import NPM_SCHEME, PKG_SCHEME, PYTHON_SCHEME, MissingPackage, installed_package_path, package_path


class DataError(ValueError):
    """Bad input data; the message names the file and line."""


class SkipReport:
    """Numbers raw records, counts documents read and skipped per reason, keeps examples of each.

    ``shard=(index, count)``: only records with ``number % count == index`` are this shard's.
    ``limit``: records numbered ``limit`` and above are not read at all (cramming's
    ``max_entries_in_raw_dataset``)."""

    MAX_EXAMPLES = 20

    def __init__(self, shard: tuple[int, int] = (0, 1), limit: int | None = None) -> None:
        self.shard_index, self.num_shards = shard
        self.limit = limit
        self.position = 0  # raw records seen so far, all shards together
        self.read = 0  # records this shard owns
        self.done = False
        self.skipped: Counter[str] = Counter()
        self.examples: dict[str, list[str]] = {}
        self.skipped_sources: dict[str, str] = {}  # file -> why none (or not all) of it was read

    def claim(self) -> bool:
        """Number the next raw record; True if this shard reads it."""
        if self.limit is not None and self.position >= self.limit:
            self.done = True
            return False
        number = self.position
        self.position += 1
        if number % self.num_shards != self.shard_index:
            return False
        self.read += 1
        return True

    @property
    def last_number(self) -> int:
        return self.position - 1

    def skip(self, reason: str, where: str) -> None:
        self.skipped[reason] += 1
        examples = self.examples.setdefault(reason, [])
        if len(examples) < self.MAX_EXAMPLES:
            examples.append(where)

    def skip_source(self, path: Path | str, reason: str) -> None:
        """A whole file that was not read (a dangling symlink), or not to its end (damaged, with
        ``on_error: skip``): not a record, so outside ``read == packed + skipped``; listed apart."""
        self.skipped_sources.setdefault(str(path), reason)

    def to_dict(self) -> dict:
        return {"read": self.read, "skipped": dict(self.skipped), "skipped_examples": self.examples,
                "skipped_sources": self.sources_list()}

    def sources_list(self) -> list[dict[str, str]]:
        return [{"path": path, "reason": reason} for path, reason in sorted(self.skipped_sources.items())]


class SourceConfig(ComponentConfig):
    kind: ClassVar[str] = "source"
    type: str = Field(description="the source's format: jsonl, text, parquet, auto (each file by its suffix), hf "
                      "(a Hugging Face dataset), or a plugin's registered name")
    path: str = Field(description="a file, a folder (read recursively), a glob (`corpus/*.jsonl.gz`), pkg://<name> for "
                      "a file shipped with cramlm, python://<package>==<version>/<glob> or npm://<package>@<version>/<glob> "
                      "for files inside an installed package (npm: under $CRAMLM_NPM_PREFIX, default <user cache>/npm); "
                      "for hf sources the dataset's hub name")
    on_error: Literal["raise", "skip"] = Field(
        "raise", description="a record with invalid JSON or UTF-8, or without the text field: raise stops with an error "
        "naming file:line; skip counts it in the manifest under its reason and goes on")
    weight: NonNegativeFloat = Field(
        1.0, description="mixture weight: each kept document is packed this many times on average (2.0: twice, 0.5: "
        "a hash-chosen half, 0: none)")


def check_packages(sources: list) -> None:
    """One DataError naming every python:// or npm:// package that ``sources`` read and that is
    missing (or at another version), each with its install command, before any source is read."""
    missing: dict[str, list[tuple[str, str]]] = {}  # install command -> (path, message) of each source it fixes
    for source in sources:
        path = getattr(source, "path", None)
        if isinstance(path, str) and path.startswith((PYTHON_SCHEME, NPM_SCHEME)):
            try:
                installed_package_path(path)
            except MissingPackage as e:
                missing.setdefault(e.install or str(e), []).append((path, str(e)))
    if len(missing) == 1:
        ((_, first), *more), = missing.values()
        raise DataError(first + (f" (and {len(more)} more source{'s' if len(more) > 1 else ''} of that package)" if more else ""))
    if missing:
        raise DataError(f"{len(missing)} packages the sources read are missing or at another version: " + "; ".join(
            f"{install} (" + (f"{len(found)} sources, the first " if len(found) > 1 else "") + f"{found[0][0]})"
            for install, found in missing.items()))


def expand_paths(pattern: str, report: SkipReport | None = None) -> list[Path]:
    """The files of a path, folder or glob; a dangling symlink among a folder's or a glob's files
    is no file, and is counted in ``report.skipped_sources`` with its target."""
    if pattern.startswith(PKG_SCHEME):
        path = package_path(pattern)
        if not path.exists():
            raise DataError(f"{pattern}: no such packaged resource")
        return [path]
    try:
        path = installed_package_path(pattern)
    except MissingPackage as e:
        raise DataError(str(e)) from None
    if path.is_dir():
        found = [p for p in path.rglob("*") if not any(part.startswith(".") for part in p.relative_to(path).parts)]  # nor in .git/
    elif any(ch in pattern for ch in "*?["):
        found = [Path(p) for p in glob.glob(str(path), recursive=True)]
    else:
        found = [path] if path.is_file() else []
    files = sorted(p for p in found if p.is_file())
    dangling = sorted(p for p in found if p.is_symlink() and not p.exists())
    if report is not None:
        for link in dangling:
            report.skip_source(link, f"dangling symlink (to {os.readlink(link)}, which does not exist)")
    if not files:
        more = f" ({len(dangling)} dangling symlinks)" if dangling else ""
        data_dir = os.environ.get("CRAMLM_DATA_DIR", "")
        if (data_dir and pattern.startswith(data_dir.rstrip("/") + "/")) or \
                (not data_dir and ("shared/data" in pattern or pattern.startswith("/corpus/"))):  # a preset's data folder
            more += (f"; the shared-corpus and english-prose presets read $CRAMLM_DATA_DIR ({'=' + data_dir if data_dir else 'unset'}: "
                     "default ../shared/data): set it to the folder holding corpus/")
        raise DataError(f"{pattern}: no such file, or no files match{more}")
    return files


def open_binary(path: Path):
    """A binary stream of the file, decompressing .gz and .zst (``zstd`` extra) on the fly."""
    if path.suffix == ".gz":
        return gzip.open(path, "rb")
    if path.suffix == ".zst":
        try:
            import zstandard
        except ImportError:
            raise DataError(f"{path}: reading .zst needs the zstandard package (pip install 'cramlm[zstd]')") from None
        return io.BufferedReader(ZstdFrames(open(path, "rb"), zstandard.ZstdDecompressor()), 1 << 20)
    return open(path, "rb")


class ZstdFrames(io.RawIOBase):
    """The decompressed bytes of a .zst file's frames, one after another; a file that ends inside a
    frame (cut short) raises EOFError, as gzip does (zstandard's stream reader just stops there)."""

    def __init__(self, raw, decompressor) -> None:
        self.raw, self.dctx = raw, decompressor
        self.obj, self.fed = decompressor.decompressobj(), False
        self.pending, self.pos = b"", 0  # decompressed bytes not yet read: pending[pos:]

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while self.pos == len(self.pending):
            chunk = self.raw.read(1 << 16)  # 64 KiB compressed at a time: text's ~4x is ~256 KiB held
            if not chunk:
                if self.fed and not self.obj.eof:
                    raise EOFError("the file ends inside a zstd frame (cut short)")
                return 0
            out = []
            while chunk:
                if self.obj.eof:  # the frame before ended: the next one starts here
                    self.obj, self.fed = self.dctx.decompressobj(), False
                self.fed = True
                out.append(self.obj.decompress(chunk))
                chunk = self.obj.unused_data if self.obj.eof else b""
            self.pending, self.pos = b"".join(out), 0
        n = min(len(buffer), len(self.pending) - self.pos)
        buffer[:n] = memoryview(self.pending)[self.pos:self.pos + n]
        self.pos += n
        return n

    def close(self) -> None:
        self.raw.close()
        super().close()


def field(obj, key_path: str):
    """``obj["a"]["b"]`` for key path ``a.b``; None when any step is missing."""
    for key in key_path.split("."):
        if not isinstance(obj, dict) or key not in obj:
            return None
        obj = obj[key]
    return obj


def fail_or_skip(cfg: SourceConfig, report: SkipReport, reason: str, where: str, detail: str) -> None:
    if cfg.on_error == "raise":
        raise DataError(f"{where}: {detail} (set on_error: skip on this source to count and skip it)")
    report.skip(reason, where)


_SURROGATE = re.compile("[\ud800-\udfff]")


def checked_text(cfg: SourceConfig, report: SkipReport, obj, key: str, where: str) -> str | None:
    """The document text of a record, or None after counting why there is none."""
    text = field(obj, key)
    if not isinstance(text, str):
        fail_or_skip(cfg, report, "missing_field", where, f"no string field '{key}'")
        return None
    if not text.strip():
        report.skip("empty", where)
        return None
    if not text.isascii() and (bad := _SURROGATE.search(text)):  # JSON "\ud800": no UTF-8 for it, tokenizers refuse it
        fail_or_skip(cfg, report, "invalid_utf8", where, f"lone surrogate {bad.group()!r} at character {bad.start()} "
                     "(not valid Unicode text)")
        return None
    return text


COMPRESSED = (".gz", ".zst")
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")


def infer_format(path: str | Path) -> Literal["jsonl", "parquet", "text"]:
    """The reader of one file, from its name (a .gz/.zst suffix is looked through): ``.jsonl``,
    ``.json``, ``.ndjson`` -> jsonl; ``.parquet`` -> parquet; anything else -> text. Source type
    ``auto`` and ``cramlm data pack`` use this for every file, also inside directories and globs."""
    name = Path(path).name.lower()
    for suffix in COMPRESSED:
        name = name.removesuffix(suffix)
    ext = Path(name).suffix
    return "jsonl" if ext in JSONL_SUFFIXES else "parquet" if ext == ".parquet" else "text"


class UnreadableFile(DataError):
    """A damaged or unreadable file (truncated .gz, bad .zst, I/O error)."""

    def __init__(self, path: Path, e: BaseException):
        self.path, self.reason = path, f"cannot read ({type(e).__name__}: {e})"
        super().__init__(f"{path}: {self.reason}")


@contextmanager
def read_errors(path: Path):
    """Damaged files (truncated .gz, bad .zst, unreadable): an UnreadableFile error naming the file."""
    try:
        yield
    except (OSError, EOFError) as e:
        raise UnreadableFile(path, e) from e
    except Exception as e:
        if type(e).__name__ not in ("ZstdError", "ArrowInvalid", "ArrowException"):
            raise
        raise UnreadableFile(path, e) from e


def jsonl_file(cfg, path: Path, report: SkipReport) -> Iterator[str]:
    """Documents of one JSONL file (``cfg.text_key``); blank lines are not records."""
    with read_errors(path), open_binary(path) as f:
        for lineno, raw in enumerate(f, 1):
            if report.done:
                return
            if not raw.strip() or not report.claim():
                continue  # blank lines between records are not documents
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(raw)
            except UnicodeDecodeError as e:
                fail_or_skip(cfg, report, "invalid_utf8", where, f"invalid UTF-8: {e}")
                continue
            except json.JSONDecodeError as e:
                fail_or_skip(cfg, report, "invalid_json", where, f"invalid JSON: {e}")
                continue
            text = checked_text(cfg, report, obj, cfg.text_key, where)
            if text is not None:
                yield text


def text_file(cfg, path: Path, report: SkipReport) -> Iterator[str]:
    """One document per file, or per blank-line block (``cfg.split``)."""
    with read_errors(path), open_binary(path) as f:
        raw = f.read()
    try:
        content = raw.decode("utf-8-sig")  # a byte order mark is no text (the JSONL reader drops it too)
    except UnicodeDecodeError as e:
        if report.claim():
            fail_or_skip(cfg, report, "invalid_utf8", str(path), f"invalid UTF-8: {e}")
        return
    del raw
    blocks = [content] if cfg.split == "file" else [b for b in content.split("\n\n") if b.strip()] or [""]
    for i, block in enumerate(blocks):  # a file without any block is one empty record: it is seen
        if report.done:
            return
        if not report.claim():
            continue
        if block.strip():
            yield block.strip("\n")
        else:
            report.skip("empty", f"{path}#{i}")


def parquet_file(cfg, path: Path, report: SkipReport) -> Iterator[str]:
    """Rows of one parquet file: column ``cfg.text_key`` (or a dotted path into a struct column)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError("parquet sources need pyarrow (pip install 'cramlm[parquet]')") from None
    column, _, rest = cfg.text_key.partition(".")
    with read_errors(path):
        parquet = pq.ParquetFile(path)
    if column not in parquet.schema_arrow.names:
        raise DataError(f"{path}: no column '{column}' (columns: {', '.join(parquet.schema_arrow.names)})")
    row = 0
    with read_errors(path):
        batches = iter(parquet.iter_batches(batch_size=1024, columns=[column]))
        while (batch := next(batches, None)) is not None:
            for value in batch.column(0).to_pylist():
                row += 1
                if report.done:
                    return
                if not report.claim():
                    continue
                text = checked_text(cfg, report, {column: value}, cfg.text_key if rest else column, f"{path}#row{row}")
                if text is not None:
                    yield text


FILE_READERS = {"jsonl": jsonl_file, "text": text_file, "parquet": parquet_file}


def file_documents(cfg: SourceConfig, report: SkipReport, fmt: str | None = None) -> Iterator[str]:
    """Documents of every file of ``cfg.path``, each read as ``fmt`` (None: :func:`infer_format`).
    With ``on_error: skip`` a damaged file (a truncated .gz) ends where it stops being readable:
    the documents before are kept, the file is counted in ``report.skipped_sources``."""
    for path in expand_paths(cfg.path, report):
        if report.done:
            return
        try:
            yield from FILE_READERS[fmt or infer_format(path)](cfg, path, report)
        except UnreadableFile as e:
            if cfg.on_error != "skip":
                raise
            report.skip_source(e.path, e.reason)


class JsonlSourceConfig(SourceConfig):
    type: Literal["jsonl"] = "jsonl"
    text_key: str = Field("text", description='the text field of each JSON object, a dotted path for nested ones ("meta.body")')


def jsonl_documents(cfg: JsonlSourceConfig, report: SkipReport) -> Iterator[str]:
    return file_documents(cfg, report, "jsonl")


class TextSourceConfig(SourceConfig):
    type: Literal["text"] = "text"
    split: Literal["file", "blank-line"] = Field(
        "file", description="document boundaries: one document per file, or one per block separated by an empty line "
        "(split on \\n\\n: a line holding spaces, or CRLF line ends, separates nothing)")


def text_documents(cfg: TextSourceConfig, report: SkipReport) -> Iterator[str]:
    return file_documents(cfg, report, "text")


class ParquetSourceConfig(SourceConfig):
    type: Literal["parquet"] = "parquet"
    text_key: str = Field("text", description='the text column, or a dotted path into a struct column ("meta.body")')


def parquet_documents(cfg: ParquetSourceConfig, report: SkipReport) -> Iterator[str]:
    return file_documents(cfg, report, "parquet")


class AutoSourceConfig(TextSourceConfig):
    """Each file read by the format its name says (:func:`infer_format`): a folder of mixed files
    (``split``: text files' document boundaries, as a text source's)."""

    type: Literal["auto"] = "auto"
    text_key: str = Field("text", description="the text field (dotted path) of .jsonl and .parquet files")


def auto_documents(cfg: AutoSourceConfig, report: SkipReport) -> Iterator[str]:
    return file_documents(cfg, report)


class HFSourceConfig(SourceConfig):
    """A Hugging Face dataset; ``path`` is its hub name (needs internet unless cached)."""

    type: Literal["hf"] = "hf"
    name: str | None = Field(None, description='the dataset\'s config (subset) name, e.g. "20231101.en" or "en"; null: its default')
    split: str = Field("train", description="the dataset split to read, in datasets' syntax (train, train[:10%])")
    streaming: bool = Field(True, description="stream records instead of downloading the whole dataset first")
    text_key: str = Field("text", description="the text field of each record (dotted path for nested fields)")
    trust_remote_code: bool = Field(
        False, description="let datasets run the dataset repository's own loading script (code from the hub)")


def hf_documents(cfg: HFSourceConfig, report: SkipReport) -> Iterator[str]:
    try:
        import datasets
    except ImportError:
        raise DataError("hf sources need the datasets package (pip install 'cramlm[hf-datasets]')") from None
    try:
        records = datasets.load_dataset(cfg.path, cfg.name, split=cfg.split, streaming=cfg.streaming,
                                        trust_remote_code=cfg.trust_remote_code)
    except Exception as e:  # offline, unknown name, ...: say which source failed
        raise DataError(f"hf dataset {cfg.path} ({cfg.name}, {cfg.split}): cannot load: {e}") from e
    for i, record in enumerate(records):
        if report.done:
            return
        if report.claim():
            text = checked_text(cfg, report, record, cfg.text_key, f"{cfg.path}#{i}")
            if text is not None:
                yield text


def documents(source: SourceConfig, report: SkipReport, index: int = 0) -> Iterator[str]:
    """The documents of ``source`` (``data.sources[index]``) as its registered reader yields them,
    each checked to be one text of a record the reader claimed: every reader, a plugin's too, numbers
    each raw record with ``report.claim()`` and yields at most one ``str`` per record that this
    returns True for, so records keep their global numbers, shards partition them and the manifest's
    ``read == packed + skipped`` holds."""
    claimed = report.read
    for text in build("source", source, report):
        if report.read == claimed or not isinstance(text, str):
            what = ("a document without claiming a record of its own" if report.read == claimed
                    else f"a {type(text).__name__}, not a str")
            raise DataError(f"data.sources.{index} (type {source.type}) yielded {what}: a source calls report.claim() "
                            "for each raw record and yields at most one text (str) per record it returned True for "
                            "(docs/data.md, 'Your own source')")
        claimed = report.read
        yield text


register("source", "jsonl", JsonlSourceConfig)(jsonl_documents)
register("source", "text", TextSourceConfig)(text_documents)
register("source", "parquet", ParquetSourceConfig)(parquet_documents)
register("source", "hf", HFSourceConfig)(hf_documents)
register("source", "auto", AutoSourceConfig)(auto_documents)
