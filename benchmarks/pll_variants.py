"""Which pseudo-log-likelihood variant minimal pairs should use by default (eval.minimal_pairs.pll):
the original PLL (Salazar et al. 2020: each token masked alone) or word-l2r (Kauf & Ivanova 2023:
the token and the rest of its word masked), measured on a checkpoint and its untrained twin.

    python benchmarks/pll_variants.py CHECKPOINT [--max-pairs 100] [--out results.json]

For each variant: BLiMP accuracy (macro over paradigms, ties half), accuracy on the pairs whose two
sentences have the same number of tokens and on those that differ, and how often the sentence with
more tokens wins; and, over every word-internal piece (a token followed by more of its word), the
mean log-probability the variant gives it: the original PLL lets a piece be read off its word's
other pieces, which is what inflates the score of words split into many pieces. Prints one JSON
object, then a table.
"""

from __future__ import annotations

import argparse
import json
import os
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

VARIANTS = ["word-l2r", "original"]


def measure(checkpoint: str, pairs, batch_tokens: int) -> dict:
    from cramlm.eval.checkpoints import load_checkpoint
    from cramlm.eval.pair_models import pair_models
    from cramlm.eval.pairs import accuracy
    from cramlm.eval.sentence_scores import Sentence, pll_scores

    ckpt = load_checkpoint(checkpoint, Path("."))
    pm = next(m for m in pair_models(ckpt, "cpu") if m.kind == "mlm")
    texts = list(dict.fromkeys(t for p in pairs for t in (p.good, p.bad)))
    sentences = pm.encode(texts)
    scores = pll_scores(pm.fn, sentences, pm.mask_id, pm.pad_id, VARIANTS, batch_tokens, pm.full_logits_vocab)
    inner = [Sentence(s.ids, [t for t in s.scored if t + 1 < len(s.words) and s.words[t + 1] == s.words[t]], s.words)
             for s in sentences]
    inner = [s for s in inner if s.scored]
    pieces = sum(len(s.scored) for s in inner)
    inner_scores = pll_scores(pm.fn, inner, pm.mask_id, pm.pad_id, VARIANTS, batch_tokens, pm.full_logits_vocab)
    length = {t: len(s.ids) for t, s in zip(texts, sentences)}
    same = [p for p in pairs if length[p.good] == length[p.bad]]
    differ = [p for p in pairs if length[p.good] != length[p.bad]]
    out = {"checkpoint": ckpt.label, "pairs": len(pairs), "same_length_pairs": len(same), "word_internal_pieces": pieces}
    for v in VARIANTS:
        s = dict(zip(texts, scores[v]))
        acc = lambda ps: accuracy(ps, [s[p.good] for p in ps], [s[p.bad] for p in ps]) if ps else None  # noqa: E731
        longer = [s[p.good] > s[p.bad] if length[p.good] > length[p.bad] else s[p.bad] > s[p.good] for p in differ]
        out[v] = {"accuracy": acc(pairs)["accuracy"], "tie_rate": acc(pairs)["tie_rate"],
                  "accuracy_same_length": acc(same)["accuracy"] if same else None,
                  "accuracy_length_differs": acc(differ)["accuracy"] if differ else None,
                  "longer_sentence_wins": float(np.mean(longer)) if longer else None,
                  "mean_logp_word_internal_piece": float(np.sum(inner_scores[v]) / max(1, pieces))}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint", help="a cramlm masked-LM run folder (its untrained twin is measured too)")
    data = Path(os.environ.get("CRAMLM_DATA_DIR", "../shared/data"))
    parser.add_argument("--pairs-dir", type=Path, default=data / "minimal_pairs" / "blimp")
    parser.add_argument("--max-pairs", type=int, default=100, help="pairs per paradigm (first N of each)")
    parser.add_argument("--batch-tokens", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    from cramlm.eval.pairs import PairsConfig, load_pairs

    torch.set_num_threads(args.threads)
    pairs = load_pairs(PairsConfig(paths=[str(args.pairs_dir)], max_pairs=args.max_pairs))
    rows = [measure(c, pairs, args.batch_tokens) for c in (args.checkpoint, args.checkpoint.rstrip("/") + "-untrained")]
    result = {"benchmark": "pll_variants", "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "rows": rows}
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\n{'checkpoint':<28} {'variant':<9} {'acc':>6} {'same len':>9} {'len differs':>12} {'longer wins':>12} {'logp inner piece':>17}")
    for r in rows:
        for v in VARIANTS:
            x = r[v]
            pct = lambda a: "-" if a is None else f"{100 * a:.1f}"  # noqa: E731
            print(f"{r['checkpoint']:<28} {v:<9} {pct(x['accuracy']):>6} {pct(x['accuracy_same_length']):>9} "
                  f"{pct(x['accuracy_length_differs']):>12} {pct(x['longer_sentence_wins']):>12} {x['mean_logp_word_internal_piece']:>17.3f}")


if __name__ == "__main__":
    main()
