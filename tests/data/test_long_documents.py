"""Very long documents: tokenized in pieces with the same ids as in one piece, in bounded memory."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cramlm.data.packing import encode
from cramlm.data.tokenizer import TokenizerConfig, split_text, train_tokenizer

from .conftest import WORDS

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _text(n_words: int, seed: int = 1) -> str:
    """Words with every kind of whitespace, punctuation and accents between them."""
    rng = random.Random(seed)
    words = [*WORDS, "Captain's", "île", "café", "naïve", "1851", "Ishmael!", "船", "--", "..."]
    seps = [" ", "  ", "\n", " \n", "\n\n", "\t", ", ", ". "]
    return "".join(rng.choice(words) + rng.choice(seps) for _ in range(n_words))


def test_split_text_cuts_before_a_space_and_keeps_every_character():
    text = _text(2000)
    pieces = split_text(text, 100)
    assert "".join(pieces) == text and max(map(len, pieces)) <= 100 and len(pieces) > 100
    assert all(p[0] == " " and not q[-1].isspace() for q, p in zip(pieces, pieces[1:]))
    blob = "x" * 1000  # no whitespace at all: cut at the limit
    assert split_text(blob, 300) == ["x" * 300] * 3 + ["x" * 100]
    assert split_text("short", 300) == ["short"]


@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "byte-bpe", "unigram"])
def test_pieces_tokenize_like_the_whole_text(kind):
    text = _text(3000)
    tok = train_tokenizer(TokenizerConfig(kind=kind, vocab_size=300, min_frequency=1), [text])
    whole = tok.encode(text, add_special_tokens=False).ids
    short = tok.encode("call me ishmael", add_special_tokens=False).ids
    for piece_chars in (100, 1000):  # pieces grouped into calls of at most 500 characters
        ids = encode(tok, [text, "call me ishmael"], call_chars=500, piece_chars=piece_chars)
        assert isinstance(ids[0], np.ndarray) and ids[0].tolist() == whole, (kind, piece_chars)
        assert list(ids[1]) == short


def _pack_peak_mb(tmp_path: Path, name: str, text: str) -> float:
    """Peak RSS (MB) of a subprocess packing one document (plus a short one) with `pack_files`."""
    corpus = tmp_path / f"{name}.jsonl"
    corpus.write_text(json.dumps({"text": text}) + "\n" + json.dumps({"text": "a short one"}) + "\n")
    code = ("import sys; from cramlm.data.commands import pack_files; "
            "info = pack_files([sys.argv[1]], sys.argv[2], sys.argv[3]); assert info['packed'] == 2, info")
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-c", code, str(corpus), str(tmp_path / "tok.json"),
                             str(tmp_path / f"{name}.cramtok")], env=env, stderr=subprocess.PIPE)
    stderr = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak, not the test process's
    assert os.waitstatus_to_exitcode(status) == 0, stderr.decode()[-2000:]
    return usage.ru_maxrss / 1024  # Linux: KiB


def test_a_4mb_document_packs_in_bounded_memory(tmp_path):
    """Issue 12.12: one long single-line document took ~100x its size (30 MB -> 3.2 GB); in
    pieces it stays within a few times its size above a tiny run (measured on a loaded machine:
    +60 MB for this 4 MB document, where the unchunked code took +400 MB)."""
    text = _text(700_000)  # ~4 MB of text on one JSONL line
    assert len(text) > 4_000_000
    tok = train_tokenizer(TokenizerConfig(vocab_size=300, min_frequency=1), [text[:100_000]])
    tok.save(str(tmp_path / "tok.json"))
    base = _pack_peak_mb(tmp_path, "tiny", "call me ishmael")
    big = _pack_peak_mb(tmp_path, "big", text)
    assert big - base < 250, (base, big)  # memory, not time: the bound holds under load


def test_a_consumer_that_fails_after_the_reader_is_done_does_not_hang():
    """The reader thread has read everything and the queue is full when packing fails (disk full,
    Ctrl-C): the failure must come out, not wait forever on the reader's last hand-over."""
    import threading

    from cramlm.data.packing import prefetch

    outcome = []

    def consume():
        try:
            for _ in prefetch(iter(range(3)), depth=2):
                import time

                time.sleep(0.3)  # the reader is done and the queue full by now
                raise OSError("disk full")
        except OSError as e:
            outcome.append(str(e))

    worker = threading.Thread(target=consume, daemon=True)
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive() and outcome == ["disk full"]  # was: blocked in the reader's join
