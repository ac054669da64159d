"""What zero-shot minimal-pair scoring costs (eval/sentence_scores.py): seconds per 1,000 pairs for a
masked LM's pseudo-log-likelihood (each variant alone and both together, sharing their common
copies), ELECTRA's detector and a causal LM's log-probability, at 128x4 (crammed-bert-tiny, the
cpu-1h model) and at crammed-bert base size (768x12), random weights (the cost does not depend on them).

    python benchmarks/minimal_pairs_cost.py                      # BLiMP's shared paradigms, both sizes
    python benchmarks/minimal_pairs_cost.py --pairs 200 --sizes crammed-bert-tiny --threads 1

Pairs: the first ``--pairs`` // 36 pairs of each paradigm under $CRAMLM_DATA_DIR/minimal_pairs/blimp
(``--pairs-dir``). Tokenizer: cramlm's masked-LM WordPiece (vocab 8,192, lowercased, as cpu-1h)
trained on the Moby-Dick text shipped with cramlm, so nothing else is needed. Prints one JSON object
(per size and scorer: pairs, sentences, forward rows (masked copies), seconds, seconds per 1,000
pairs), then a table. At base size only word-l2r is timed (original costs the same).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

SIZES = ("crammed-bert-tiny", "crammed-bert-base")


def tokenizer():
    """cpu-1h's masked-LM tokenizer kind, trained on the shipped Moby-Dick."""
    from cramlm.data.tokenizer import TokenizerConfig, train_tokenizer
    from cramlm.io import package_path

    with gzip.open(package_path("pkg://moby_dick.jsonl.gz"), "rt", encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    cfg = TokenizerConfig(kind="auto", vocab_size=8192).for_objective("mlm")
    return train_tokenizer(cfg, texts)


def pairs_sample(folder: Path, total: int):
    from cramlm.eval.pairs import PairsConfig, load_pairs

    files = sorted(folder.glob("*.jsonl"))
    return load_pairs(PairsConfig(paths=[str(folder)], max_pairs=max(1, total // max(1, len(files)))))


def model(arch: str, vocab: int, causal: bool = False):
    """``arch``'s model with random weights; ``causal``: a gpt2 decoder of the same width and depth."""
    from cramlm.cli.common import resolve_or_exit
    from cramlm.models.base import build_model

    cfg = resolve_or_exit("pretrain", [f"arch={arch}"]).arch
    if causal:
        sizes = {k: getattr(cfg, k) for k in ("hidden_size", "num_layers", "num_heads", "intermediate_size")}
        cfg = resolve_or_exit("pretrain", ["arch=gpt2", *(f"arch.{k}={v}" for k, v in sizes.items())]).arch
    torch.manual_seed(0)
    return build_model(cfg, vocab).eval()


def measure(arch: str, tok, pairs, threads: int, all_variants: bool = True) -> list[dict]:
    """Seconds per scorer on ``pairs``; ``all_variants``: each PLL variant alone and both together
    (else word-l2r alone: the other variant costs the same)."""
    from cramlm.data.tokenizer import CLS_ID, MASK_ID, PAD_ID, SEP_ID
    from cramlm.eval.pair_models import cramlm_encoder
    from cramlm.models.objectives.base import at_positions
    from cramlm.eval.sentence_scores import clm_scores, pll_copies, pll_scores, rtd_scores

    torch.set_num_threads(threads)
    texts = list(dict.fromkeys(t for p in pairs for t in (p.good, p.bad)))
    sentences = cramlm_encoder(tok, [CLS_ID], [SEP_ID])(texts)
    mlm = model(arch, tok.get_vocab_size())
    predict = at_positions(mlm.encode, mlm.head)
    detector = torch.nn.Linear(mlm.hidden_size, 1)  # the detector's cost is negligible beside the encoder's
    out = []

    clock = {}

    def start():
        clock.update(wall=time.perf_counter(), cpu=time.process_time())

    def row(scorer, copies):
        seconds, cpu = time.perf_counter() - clock["wall"], time.process_time() - clock["cpu"]
        out.append({"arch": arch, "scorer": scorer, "pairs": len(pairs), "sentences": len(texts), "forward_rows": copies,
                    "seconds": round(seconds, 2), "seconds_per_1000_pairs": round(1000 * seconds / len(pairs), 2),
                    "cpu_seconds_per_1000_pairs": round(1000 * cpu / len(pairs), 2)})
        print(f"  {arch} {scorer}: {seconds:.1f}s ({cpu:.1f} CPU-s)", flush=True)

    sets = (["word-l2r"], ["original"], ["word-l2r", "original"]) if all_variants else (["word-l2r"],)
    for variants in sets:
        start()
        pll_scores(predict, sentences, MASK_ID, PAD_ID, variants)
        row("pll " + " + ".join(variants), len(pll_copies(sentences, variants)[0]))
    start()
    rtd_scores(lambda ids, mask: detector(mlm.encode(ids, mask)).squeeze(-1), sentences, PAD_ID)
    row("rtd detector", len(sentences))
    clm = model(arch, tok.get_vocab_size(), causal=True)
    start()
    clm_scores(lambda ids, mask: clm(ids, mask)["logits"], sentences, PAD_ID, vocab_size=tok.get_vocab_size())
    row("clm log-probability", len(sentences))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    data = Path(os.environ.get("CRAMLM_DATA_DIR", "../shared/data"))
    parser.add_argument("--pairs-dir", type=Path, default=data / "minimal_pairs" / "blimp")
    parser.add_argument("--pairs", type=int, default=1008, help="pairs in all, spread over the paradigms (default 28 each)")
    parser.add_argument("--base-pairs", type=int, default=108, help="pairs at other sizes (base costs ~100x per pair)")
    parser.add_argument("--sizes", default=",".join(SIZES))
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args()
    if not args.pairs_dir.is_dir():
        raise SystemExit(f"Error: {args.pairs_dir}: no such folder (set CRAMLM_DATA_DIR or --pairs-dir)")
    tok = tokenizer()
    load = os.getloadavg()[0]  # the machine is shared: the wall clock depends on what else runs
    rows = []
    for arch in args.sizes.split(","):
        pairs = pairs_sample(args.pairs_dir, args.pairs if arch.endswith("tiny") else args.base_pairs)
        rows += measure(arch, tok, pairs, args.threads, all_variants=arch.endswith("tiny"))
    result = {"benchmark": "minimal_pairs_cost", "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
              "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}",
              "threads": args.threads, "load_average_before": load, "load_average_after": os.getloadavg()[0], "rows": rows}
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\n{'arch':<20} {'scorer':<28} {'pairs':>6} {'rows':>8} {'seconds':>8} {'s / 1,000 pairs':>16} {'CPU-s / 1,000':>14}")
    for r in rows:
        print(f"{r['arch']:<20} {r['scorer']:<28} {r['pairs']:>6} {r['forward_rows']:>8} {r['seconds']:>8} "
              f"{r['seconds_per_1000_pairs']:>16} {r['cpu_seconds_per_1000_pairs']:>14}")


if __name__ == "__main__":
    main()
