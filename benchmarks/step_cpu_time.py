"""MFU of cramlm's training step measured in process CPU time on one thread: a figure that other
work on a shared machine hardly moves (wall-clock MFU there measures the neighbours). The step is
benchmarks/train_step.py's (Trainer.train_step: batch draw, masking, forward, backward, clipping, AdamW); the
peak is the best GEMM rate of the same thread in the same CPU-time units, per precision.

``--unfused`` also times the loss as it was before the fused head + cross-entropy (MLM:
``F.cross_entropy(decoder(hidden).float(), targets)``; causal: ``lm_head(hidden)`` over all (B, T, V)
logits, then a float copy of the shifted ones into ``F.cross_entropy``), steps of the two
interleaved in the same process, so that one run shows before and after.

    python -m benchmarks.step_cpu_time                                   # crammed-bert-tiny, microbatch 16, fp32 and bf16
    python -m benchmarks.step_cpu_time --unfused                         # and before the fused loss, interleaved
    python -m benchmarks.step_cpu_time --arch crammed-bert --microbatch 4 --precision fp32 bf16
    python -m benchmarks.step_cpu_time --arch gpt2-tiny --microbatch 64 --precision bf16 --unfused   # the causal head

(from the repository root: it imports benchmarks/train_step.py's step builder)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks import train_step  # the benchmark's own step builder
from cramlm.config.loader import load_preset
from cramlm.train.hardware import PRECISION_DTYPES


def gemm_peak(dtype, sizes=(512, 1024), reps: int = 8) -> float:
    """Best GEMM FLOP per CPU-second of this thread."""
    best = 0.0
    for n in sizes:
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        a @ b
        for _ in range(reps):
            start = time.process_time()
            for _ in range(8):
                a @ b
            best = max(best, 8 * 2 * n**3 / max(time.process_time() - start, 1e-9))
    return best


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="crammed-bert-tiny")
    ap.add_argument("--microbatch", type=int, nargs="+", default=[16])
    ap.add_argument("--precision", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16", "auto"])
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--unfused", action="store_true", help="also the MLM loss over materialised logits (before the fused one)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    import torch.nn.functional as F

    from cramlm.config.registry import config_class
    from cramlm.models.gpt import CausalLM
    from cramlm.models.model import IGNORE_INDEX, MLMHead

    arch = load_preset("arch", args.arch)
    causal = config_class("model", arch["type"]).objective == "clm"

    def unfused_causal(self, input_ids, attention_mask=None, labels=None, position_ids=None, document_ids=None,
                       token_type_ids=None):  # CausalLM.forward before the fused head
        logits = self.lm_head(self.encode(input_ids, attention_mask, position_ids, document_ids, token_type_ids))
        shifted = logits[:, :-1].float().reshape(-1, self.vocab_size)
        return {"loss": F.cross_entropy(shifted, labels[:, 1:].reshape(-1), ignore_index=IGNORE_INDEX), "logits": logits}

    owner, attr = (CausalLM, "forward") if causal else (MLMHead, "loss")
    fused_loss = getattr(owner, attr)
    variants = {True: fused_loss}
    if args.unfused:
        variants[False] = unfused_causal if causal else (lambda self, hidden, targets: F.cross_entropy(self(hidden).float(), targets))
    rows, peaks = [], {}
    for precision in args.precision:
        for micro in args.microbatch:
            with tempfile.TemporaryDirectory() as tmp:
                step, fpt, params = train_step.ours(arch, args.vocab, micro, Path(tmp), False, torch.device("cpu"), precision)
                chosen = step.precision.precision
                if chosen not in peaks:
                    peaks[chosen] = gemm_peak(PRECISION_DTYPES[chosen])
                seconds = {fused: [] for fused in variants}
                for i in range(2 + args.steps):  # the variants' steps interleaved (the model trains on through both)
                    for fused, loss in variants.items():
                        setattr(owner, attr, loss)
                        start = time.process_time()
                        step()
                        if i >= 2:
                            seconds[fused].append(time.process_time() - start)
                setattr(owner, attr, fused_loss)
            for fused in variants:
                cpu = statistics.median(seconds[fused])
                tps = micro * train_step.SEQ / cpu
                rows.append({"arch": args.arch, "precision": chosen, "microbatch": micro, "fused_loss": fused,
                             "parameters": params, "cpu_seconds_per_step": round(cpu, 4), "tokens_per_cpu_second": round(tps, 1),
                             "flops_per_token": fpt, "peak_flops_per_cpu_second": peaks[chosen],
                             "mfu": round(tps * fpt / peaks[chosen], 4),
                             "mfu_vs_fp32_peak": round(tps * fpt / peaks.setdefault("fp32", gemm_peak(None)), 4)})
                print(json.dumps(rows[-1]), flush=True)
    print("| arch | precision | microbatch | fused loss | tokens per CPU-second | MFU (its precision's peak) | MFU (fp32 peak) |")
    print("|---|---|---:|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['arch']} | {r['precision']} | {r['microbatch']} | {r['fused_loss']} | {r['tokens_per_cpu_second']:,.0f} | "
              f"{100 * r['mfu']:.1f}% | {100 * r['mfu_vs_fp32_peak']:.1f}% |")
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
