"""Held-out MLM loss of finished runs on their own validation split (val.cramtok of their data).

Masking as in training (25% of positions, 80/10/10) with a fixed seed, so runs sharing a data
config are scored on identical batches. Prints one JSON line per run.

    python benchmarks/val_mlm_loss.py outputs/cpu-1h outputs/cpu-1h-untrained [--max-blocks 2000]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from cramlm.data.collate import MLMCollator
from cramlm.data.dataset import BlockDataset
from cramlm.data.prepare import load_prepared
from cramlm.data.tokenizer import CLS_ID, MASK_ID, SPECIAL_TOKENS
from cramlm.runs import load_run


@torch.inference_mode()
def val_loss(run_dir: str, max_blocks: int, batch: int = 64) -> dict:
    model, tok, cfg = load_run(run_dir)
    model.eval()
    data = load_prepared(Path(json.loads((Path(run_dir) / "summary.json").read_text())["data"]))
    dataset = BlockDataset(data.val, cfg.data.seq_length, CLS_ID)
    collator = MLMCollator(tok.get_vocab_size(), MASK_ID, len(SPECIAL_TOKENS), cfg.train.mlm_probability, seed=1234)
    n = min(len(dataset), max_blocks)
    total, weight, start = 0.0, 0, time.perf_counter()
    for lo in range(0, n, batch):
        b = collator(dataset.batch(np.arange(lo, min(n, lo + batch))))
        scored = int((b["labels"] != -100).sum())
        total += float(model(**b)["loss"]) * scored
        weight += scored
    loss = total / max(weight, 1)
    return {"run": run_dir, "val_mlm_loss": round(loss, 4), "perplexity": round(math.exp(loss), 2),
            "blocks": n, "scored_tokens": weight, "seconds": round(time.perf_counter() - start, 1)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--max-blocks", type=int, default=2000)
    args = parser.parse_args()
    torch.manual_seed(0)
    for run in args.runs:
        print(json.dumps(val_loss(run, args.max_blocks)), flush=True)
