"""Document sources: each yields text documents and counts what it skips, and why.

Paths may be local files, directories, globs, or ``pkg://<file>`` for the corpora shipped in
``cramlm/resources/``. ``.gz`` files are read transparently.
"""

from __future__ import annotations

import glob
import gzip
import io
import json
from collections import Counter
from importlib import resources
from pathlib import Path
from typing import ClassVar, Iterator, Literal

from cramlm.config.base import ComponentConfig
from cramlm.config.registry import register


class DataError(ValueError):
    """Bad input data; the message names the file and line."""


class SkipReport:
    """Counts documents read, kept, and skipped per reason, with a few examples of each."""

    def __init__(self) -> None:
        self.read = 0
        self.skipped: Counter[str] = Counter()
        self.examples: dict[str, list[str]] = {}

    def skip(self, reason: str, where: str) -> None:
        self.skipped[reason] += 1
        self.examples.setdefault(reason, [])
        if len(self.examples[reason]) < 5:
            self.examples[reason].append(where)

    def to_dict(self) -> dict:
        return {"read": self.read, "skipped": dict(self.skipped), "skipped_examples": self.examples}


class SourceConfig(ComponentConfig):
    kind: ClassVar[str] = "source"
    path: str
    on_error: Literal["raise", "skip"] = "raise"  # invalid JSON / UTF-8: stop with an error, or count and skip


def expand_paths(pattern: str) -> list[Path]:
    if pattern.startswith("pkg://"):
        path = Path(str(resources.files("cramlm") / "resources" / pattern[len("pkg://") :]))
        if not path.exists():
            raise DataError(f"{pattern}: no such packaged resource")
        return [path]
    path = Path(pattern).expanduser()
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file())
    elif any(ch in pattern for ch in "*?["):
        files = sorted(Path(p) for p in glob.glob(str(path), recursive=True) if Path(p).is_file())
    else:
        files = [path] if path.is_file() else []
    if not files:
        raise DataError(f"{pattern}: no such file, or no files match")
    return files


def open_binary(path: Path):
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


class JsonlSourceConfig(SourceConfig):
    type: Literal["jsonl"] = "jsonl"
    text_key: str = "text"  # dotted path into each object, e.g. "meta.body"


class TextSourceConfig(SourceConfig):
    type: Literal["text"] = "text"
    split: Literal["file", "blank-line"] = "file"  # one document per file, or per blank-line block


def _field(obj, key_path: str):
    for key in key_path.split("."):
        if not isinstance(obj, dict) or key not in obj:
            return None
        obj = obj[key]
    return obj


def _fail_or_skip(cfg: SourceConfig, report: SkipReport, reason: str, where: str, detail: str) -> None:
    if cfg.on_error == "raise":
        raise DataError(f"{where}: {detail} (set on_error: skip on this source to count and skip it)")
    report.skip(reason, where)


def jsonl_documents(cfg: JsonlSourceConfig, report: SkipReport) -> Iterator[str]:
    for path in expand_paths(cfg.path):
        with open_binary(path) as f:
            for lineno, raw in enumerate(f, 1):
                where = f"{path}:{lineno}"
                if not raw.strip():
                    continue  # blank line between records: not a document
                report.read += 1
                try:
                    obj = json.loads(raw)
                except UnicodeDecodeError as e:
                    _fail_or_skip(cfg, report, "invalid_utf8", where, f"invalid UTF-8: {e}")
                    continue
                except json.JSONDecodeError as e:
                    _fail_or_skip(cfg, report, "invalid_json", where, f"invalid JSON: {e}")
                    continue
                text = _field(obj, cfg.text_key)
                if not isinstance(text, str):
                    _fail_or_skip(cfg, report, "missing_field", where, f"no string field '{cfg.text_key}'")
                    continue
                if not text.strip():
                    report.skip("empty", where)
                    continue
                yield text


def text_documents(cfg: TextSourceConfig, report: SkipReport) -> Iterator[str]:
    for path in expand_paths(cfg.path):
        with open_binary(path) as f:
            try:
                content = io.TextIOWrapper(f, encoding="utf-8").read()
            except UnicodeDecodeError as e:
                report.read += 1
                _fail_or_skip(cfg, report, "invalid_utf8", str(path), f"invalid UTF-8: {e}")
                continue
        blocks = [content] if cfg.split == "file" else content.split("\n\n")
        for i, block in enumerate(blocks):
            report.read += 1
            if block.strip():
                yield block.strip("\n")
            else:
                report.skip("empty", f"{path}#{i}")


register("source", "jsonl", JsonlSourceConfig)(jsonl_documents)
register("source", "text", TextSourceConfig)(text_documents)
