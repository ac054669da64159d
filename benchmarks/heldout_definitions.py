"""The held-out MLM loss of the same checkpoints under the three definitions cramlm used before
heldout-v1 and under heldout-v1 itself (data/heldout.py): what changed in the reported numbers.

- ``old-4x64``: pretraining's val_loss and `cramlm eval`'s LM loss under ``train=bert-o4-cpu``: the
  first 4 microbatches of 64 validation blocks (256), masked by the training collator seeded with
  the run's seed + 1 at ``train.mlm_probability``, the mean of the 4 microbatch means;
- ``old-8x64``: the same under ``train=bert-o4`` (8 microbatches: 512 blocks);
- ``old-benchmark``: benchmarks/val_mlm_loss.py before: every block (up to 2,000), the training
  collator seeded 1234, token-weighted;
- ``heldout-v1``: every block up to 2^18 tokens (else a seeded sample), a fixed-seed 15 % mask
  drawn by (block, position), token-weighted, fp32 -- what `cramlm eval` now writes.

    python benchmarks/heldout_definitions.py outputs/run-a outputs/run-b   # JSON lines, then a table
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from cramlm.data.collate import MLMCollator
from cramlm.data.cramtok import read_packed
from cramlm.data.dataset import BlockDataset
from cramlm.data.tokenizer import CLS_ID, MASK_ID, SPECIAL_TOKENS
from cramlm.eval.checkpoints import load_checkpoint
from cramlm.data.heldout import run_heldout_set
from cramlm.eval.lm import heldout_eval


def _collator(lm, seed: int) -> MLMCollator:
    return MLMCollator(lm.vocab_size, MASK_ID, len(SPECIAL_TOKENS), lm.config.train.mlm_probability, seed)


@torch.inference_mode()
def old_microbatch_mean(lm, blocks: BlockDataset, batches: int, microbatch: int) -> tuple[float, int]:
    """The definition before heldout-v1 (held_out_batches, before it): mean of microbatch means."""
    size = max(1, min(microbatch, len(blocks) // batches))
    count = min(batches, len(blocks) // size)
    collate = _collator(lm, lm.config.seed + 1)
    losses = [float(lm.model(**collate(blocks.batch(range(i * size, (i + 1) * size))))["loss"]) for i in range(count)]
    return sum(losses) / len(losses), count * size


@torch.inference_mode()
def old_benchmark(lm, blocks: BlockDataset, max_blocks: int = 2000, batch: int = 64) -> tuple[float, int]:
    collate = _collator(lm, 1234)
    n = min(len(blocks), max_blocks)
    total, weight = 0.0, 0
    for lo in range(0, n, batch):
        b = collate(blocks.batch(np.arange(lo, min(n, lo + batch))))
        scored = int((b["labels"] != -100).sum())
        total += float(lm.model(**b)["loss"]) * scored
        weight += scored
    return total / weight, n


def definitions(run_dir: str) -> dict:
    lm = load_checkpoint(run_dir, ".").lm
    lm.model.eval()
    val = read_packed(lm.val_path)
    blocks = BlockDataset(val, lm.seq_length, CLS_ID)
    torch.manual_seed(0)
    out = {"run": run_dir, "validation_blocks": len(blocks)}
    for name, (loss, n) in {"old-4x64": old_microbatch_mean(lm, blocks, 4, 64),
                            "old-8x64": old_microbatch_mean(lm, blocks, 8, 64),
                            "old-benchmark": old_benchmark(lm, blocks)}.items():
        out[name] = {"loss": round(loss, 4), "sequences": n}
    new = heldout_eval(lm.model, run_heldout_set(lm.config, val, lm.vocab_size, lm.val_path), progress=False)
    out["heldout-v1"] = {"loss": round(new["loss"], 4), "sequences": new["sequences"],
                         "bpb": None if new["bpb"] is None else round(new["bpb"], 4)}
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+")
    args = parser.parse_args()
    rows = []
    for run in args.runs:
        rows.append(definitions(run))
        print(json.dumps(rows[-1]), flush=True)
    names = ["old-4x64", "old-8x64", "old-benchmark", "heldout-v1"]
    print("\n| run | " + " | ".join(names) + " | spread |\n|---|" + "---:|" * (len(names) + 1))
    for r in rows:
        losses = [r[n]["loss"] for n in names]
        print(f"| {r['run']} | " + " | ".join(f"{r[n]['loss']:.3f} ({r[n]['sequences']})" for n in names)
              + f" | {max(losses) - min(losses):.3f} |")
