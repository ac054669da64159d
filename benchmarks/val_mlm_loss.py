"""Held-out loss and bits per byte of finished runs, by the very function `cramlm eval` uses
(data/heldout.py, definition heldout-v1: the validation file's sequences, a fixed-seed 15 % mask for
MLMs, nats averaged over the scored tokens, fp32), so this benchmark and the pipeline's eval stage
print the same numbers. Runs sharing a data config are scored on identical sequences and masks.
Prints one JSON line per run.

    python benchmarks/val_mlm_loss.py outputs/cpu-1h outputs/cpu-1h-untrained
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch

from cramlm.eval.lm import run_heldout


def val_loss(run_dir: str) -> dict:
    """The held-out numbers of ``run_dir`` (a run folder; suffix -untrained for its twin): ``cramlm
    eval``'s (an RTD run: its generator's loss, labelled so), its perplexity and the seconds taken."""
    start = time.perf_counter()
    heldout = run_heldout(run_dir)
    return {**heldout, "val_mlm_loss": round(heldout["loss"], 4),  # (the old key, kept for readers)
            "perplexity": round(math.exp(heldout["loss"]), 2), "seconds": round(time.perf_counter() - start, 1)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+")
    args = parser.parse_args()
    torch.manual_seed(0)
    for run in args.runs:
        print(json.dumps(val_loss(run)), flush=True)
