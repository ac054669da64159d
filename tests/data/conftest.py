"""Helpers for data tests: tiny corpora written on the fly, tiny tokenizers (fast on 2 cores)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

WORDS = ("whale ship sea captain harpoon boat crew ocean storm wind sail deck mast rope island "
         "coffin chapter white sperm oil voyage night day sun moon star wave deep call me ishmael").split()


def sentence(i: int, n: int = 12) -> str:
    return " ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(n)) + "."


def document(i: int) -> str:
    """A distinct little document (its first word is unique to it)."""
    return f"doc{i} " + " ".join(sentence(i + k, 8 + (i + k) % 9) for k in range(1 + i % 4))


def write_jsonl(path: Path, records: list, raw_lines: dict[int, bytes] | None = None) -> Path:
    """Records as JSONL; ``raw_lines`` replaces line k (0-based) by raw bytes (to corrupt it)."""
    lines = [json.dumps(r).encode() for r in records]
    for k, raw in (raw_lines or {}).items():
        lines[k] = raw
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def tiny_data(sources: list[dict], **overrides):
    from cramlm.data.prepare import DataConfig

    cfg = {"name": "t", "sources": sources, "tokenizer": {"vocab_size": 200, "min_frequency": 1},
           "seq_length": 16, "validation_fraction": 0.0}
    cfg.update(overrides)
    return DataConfig.model_validate(cfg)


@pytest.fixture
def corpus(tmp_path) -> Path:
    """100 distinct documents in a JSONL file."""
    return write_jsonl(tmp_path / "corpus.jsonl", [{"text": document(i), "id": i} for i in range(100)])
