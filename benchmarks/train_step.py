"""Training throughput on this machine: cramlm's engine (Trainer.train_step: batch draw,
MLM masking, forward, backward, clipping, AdamW) on crammed-bert tiny and base, and a small GPT when
one is registered, against Hugging Face ``BertForMaskedLM`` trained with a plain PyTorch loop.

Steps of the two contenders and a GEMM probe are interleaved (A B G A B G ...) and medians taken, so
the load of a shared machine hits all alike; the ratio is the figure to read. MFU = tokens/s x
FLOPs/token (counted by torch's FlopCounterMode on a real step) / peak, the peak being the higher of
the GEMM rate measured before the run and the median measured between its steps, in the precision
the row trained in (bf16 GEMMs run up to 2x fp32 where the CPU has AVX512-BF16; on a GPU bf16 by
default). ``--precision`` takes one or more of auto (impl.precision=auto: the probe's choice, shown
with its measured ratio), fp32, bf16, fp16; each is its own interleaved contender, and the HF loop
runs under the first one's autocast.

    python benchmarks/train_step.py                      # tiny and base, JSON + table
    python benchmarks/train_step.py --sizes base --steps 5 --microbatch 16 --out results.json
    python benchmarks/train_step.py --sizes base --precision fp32 auto   # auto's speed-up over fp32
    python benchmarks/train_step.py --sizes base --precision fp32 auto --microbatch 16 --accumulate 4  # as a run: batch 64
    python benchmarks/train_step.py --device cuda --microbatch 128 128   # on a GPU (the default there)
    python benchmarks/train_step.py --sizes tiny gpt-tiny --microbatch 64 --no-hf   # causal against MLM, same shape
    python benchmarks/train_step.py --sizes tiny --microbatch 64 --no-hf --objective rtd   # ELECTRA's step
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from cramlm.config.loader import load_preset
from cramlm.config.registry import config_class, names
from cramlm.data.collate import MLMCollator, causal_collate
from cramlm.data.tokenizer import MASK_ID, SPECIAL_TOKENS
from cramlm.models.base import build_model
from cramlm.train.build import build_trainer
from cramlm.train.flops import cpu_peak_flops, gemm_peak_flops, measure_flops_per_token, profile_steps, time_interleaved
from cramlm.train.hardware import PRECISION_DTYPES
from cramlm.train.impl import ImplConfig, autocast
from cramlm.train.config import TrainConfig
from cramlm.train.batches import StepData

SEQ = 128


class RandomBlocks:
    """Uniform random token blocks (throughput does not depend on the text)."""

    def __init__(self, vocab: int, seq: int, n: int = 4096, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.blocks = rng.integers(len(SPECIAL_TOKENS), vocab, size=(n, seq), dtype=np.int64)

    def __len__(self) -> int:
        return len(self.blocks)

    def batch(self, indices) -> torch.Tensor:
        return torch.from_numpy(self.blocks[np.asarray(indices)])


def ours(arch: dict, vocab: int, micro: int, run_dir: Path, compile_: bool, device: torch.device, precision: str,
         accumulate: int = 1, objective: str = "mlm") -> tuple:
    cfg = config_class("model", arch["type"]).model_validate(arch)
    torch.manual_seed(0)
    model = build_model(cfg, vocab)
    rtd = objective == "rtd" and cfg.objective == "mlm"
    if rtd:  # train.objective=rtd: the generator and detector around the encoder, as a run builds them
        from cramlm.models.objectives.rtd import build_rtd
        from cramlm.models.objectives.config import RTDConfig

        model = build_rtd(model, RTDConfig(), len(SPECIAL_TOKENS))
    model = model.to(device)
    collate = MLMCollator(vocab, MASK_ID, len(SPECIAL_TOKENS), 0.25, 0, sample_noise=rtd)
    data = StepData(RandomBlocks(vocab, SEQ), collate if cfg.objective == "mlm" else causal_collate, 0)
    impl = ImplConfig(microbatch_size=micro, progress=False, compile=compile_, device=device.type, precision=precision)
    train = TrainConfig(batch_size=micro * accumulate, batch_ramp=0, min_updates=0, budget={"steps": 10**9}, validate_sequences=0)
    sample = data.collate(RandomBlocks(vocab, SEQ, 2, seed=1).batch([0, 1]))
    trainer = build_trainer(model, data, train, impl, run_dir, sample=sample)
    trainer.model.train()
    params = sum(p.numel() for p in model.parameters())

    def step():
        for group in trainer.optimizer.param_groups:
            group["lr"] = 1e-4
        trainer.train_step(accumulate)
        trainer.batches.wait_prefetch()  # the next batch's preparation (prefetch on CUDA) is this contender's
        # work: done in its own timed step, not the next one's

    step.precision = trainer.precision  # what impl.precision resolved to, and why
    return step, trainer.meter.costs.flops_per_token, params


def hf_bert(arch: dict, vocab: int, micro: int, device: torch.device, precision: str, accumulate: int = 1) -> tuple:
    from transformers import BertConfig, BertForMaskedLM

    size = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
    if arch["hidden_size"] < 768:  # the tiny comparison: BERT with crammed-bert-tiny's widths
        size = dict(hidden_size=arch["hidden_size"], num_hidden_layers=arch["num_layers"],
                    num_attention_heads=arch["num_heads"], intermediate_size=arch["intermediate_size"])
    config = BertConfig(vocab_size=vocab, max_position_embeddings=SEQ, **size)  # HF defaults otherwise (dropout 0.1)
    torch.manual_seed(0)
    model = BertForMaskedLM(config).to(device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    dtype = PRECISION_DTYPES[precision]
    collate = MLMCollator(vocab, MASK_ID, len(SPECIAL_TOKENS), 0.25, 0)
    blocks = RandomBlocks(vocab, SEQ)
    position = [0]

    def step():  # the plain loop people write around HF models
        for _ in range(accumulate):
            idx = np.arange(position[0], position[0] + micro) % len(blocks)
            position[0] += micro
            batch = {k: v.to(device) for k, v in collate(blocks.batch(idx)).items()}
            with autocast(device, dtype):
                loss = model(input_ids=batch["input_ids"], labels=batch["labels"]).loss
            (loss / accumulate).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    sample = collate(RandomBlocks(vocab, SEQ, 2, seed=1).batch([0, 1]))

    class Wrapped(torch.nn.Module):  # FlopCounterMode wants model(**batch)["loss"]
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, **b):
            return {"loss": self.m(**b).loss}

    fpt = measure_flops_per_token(Wrapped(), {k: v.to(device) for k, v in sample.items()})
    return step, fpt, sum(p.numel() for p in model.parameters())


def write(out: str, peaks: dict[str, float], rows: list[dict]) -> None:
    result = {"peak_gemm_flops": peaks, "threads": torch.get_num_threads(), "torch": torch.__version__, "rows": rows}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=2) + "\n")


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["tiny", "base", "gpt"])
    ap.add_argument("--steps", type=int, default=5, help="timed steps per contender")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--microbatch", type=int, nargs="+", default=[64, 16, 16], help="per size, in order")
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--no-hf", action="store_true", help="leave out the Hugging Face contender (precision ratios only)")
    ap.add_argument("--accumulate", type=int, default=1,
                    help="microbatches per optimizer step (a real base run has many: its optimizer step, the same in "
                         "every precision, is then paid once per batch rather than per microbatch)")
    ap.add_argument("--objective", choices=["mlm", "rtd"], default="mlm",
                    help="rtd: the masked-LM sizes trained as ELECTRA (train.objective=rtd: generator + detector)")
    ap.add_argument("--compile", action="store_true", help="torch.compile cramlm's model (impl.compile=true)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--precision", nargs="+", choices=["auto", *sorted(PRECISION_DTYPES)],
                    help="cramlm's impl.precision; several: one interleaved contender each (default: bf16 on a GPU, auto on a CPU)")
    ap.add_argument("--peak-flops", type=float, help="peak FLOP/s for MFU (default: the GEMM rate measured here)")
    ap.add_argument("--out", default="benchmarks/results/train_step.json")
    ap.add_argument("--profile", action="store_true", help="also print a torch.profiler table of one step per contender")
    args = ap.parse_args(argv)
    if args.accumulate < 1:
        ap.error("--accumulate must be >= 1")
    device = torch.device(args.device)
    settings = args.precision or (["bf16"] if device.type == "cuda" else ["auto"])
    n = 4096 if device.type == "cuda" else 1024  # GPU: large enough to fill the chip

    def measure_peak(p: str) -> float:
        if args.peak_flops:
            return args.peak_flops
        dtype = PRECISION_DTYPES[p]
        if device.type == "cuda":
            return gemm_peak_flops(device, dtype)
        return max(cpu_peak_flops(1024, 2.0, dtype), cpu_peak_flops(2048, 2.0, dtype))

    what = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu, {torch.get_num_threads()} threads"
    peaks: dict[str, float] = {}  # by precision, measured when a row first trains in it
    rows = []
    # base: cramming's crammed-bert (16 layers) against BERT-base (12); base12: the same depth
    # gpt-tiny: GPT-2's choices at crammed-bert-tiny's width, depth and sequence (the causal path's speed)
    presets = {"tiny": "crammed-bert-tiny", "base": "crammed-bert", "base12": "crammed-bert-base", "gpt": "gpt2-small",
               "gpt-tiny": "gpt2-tiny"}
    for size, micro in zip(args.sizes, args.microbatch + [args.microbatch[-1]] * len(args.sizes)):
        causal = size.startswith("gpt")
        if causal and "gpt2" not in names("model"):
            print("gpt: skipped, no 'gpt2' model registered in this branch (the models stage brings it)")
            rows.append({"size": "gpt", "skipped": "no gpt2 model registered in this branch"})
            continue
        arch = load_preset("arch", presets[size]) if size != "gpt" else {"type": "gpt2"}
        with tempfile.TemporaryDirectory() as tmp:
            contenders, fpts, params, chosen = {}, {}, {}, {}
            for p in settings:
                name = "cramlm" if len(settings) == 1 else f"cramlm-{p}"
                contenders[name], fpts[name], params[name] = ours(arch, args.vocab, micro, Path(tmp) / p, args.compile, device, p,
                                                                    args.accumulate, args.objective)
                chosen[name] = contenders[name].precision
            first = next(iter(chosen.values())).precision
            if not causal and not args.no_hf:  # the plain HF loop under the same autocast as the first contender
                contenders["hf"], fpts["hf"], params["hf"] = hf_bert(arch, args.vocab, micro, device, first, args.accumulate)
                chosen["hf"] = None
            in_use = sorted({c.precision for c in chosen.values() if c} | {first})
            for p in in_use:  # the peak of each precision in use: before the run, and between steps
                if p not in peaks:
                    peaks[p] = measure_peak(p)
                    print(f"{p} GEMM peak ({what}): {peaks[p] / 1e12:.3f} TFLOP/s", flush=True)
                a, b = (torch.randn(n, n, device=device, dtype=PRECISION_DTYPES[p] or torch.float32) for _ in range(2))
                contenders[f"gemm-{p}"] = lambda a=a, b=b: [torch.mm(a, b) for _ in range(16)]
            times = time_interleaved(contenders, args.warmup, args.steps, device)
            # the higher of before-the-run and in-run: MFU is never flattered by a busy moment
            peak_of = {p: args.peak_flops or max(peaks[p], 16 * 2 * n**3 / statistics.median(times.pop(f"gemm-{p}"))) for p in in_use}
            for p in in_use:
                contenders.pop(f"gemm-{p}")
                times.pop(f"gemm-{p}", None)
            if args.profile:
                profile_steps(contenders, size, device)
        tokens = micro * args.accumulate * SEQ
        for name in contenders:
            seconds = statistics.median(times[name])
            tps = tokens / seconds
            p = chosen[name].precision if chosen[name] else first
            rows.append({
                "size": size, "engine": name, "parameters": params[name], "microbatch": micro, "accumulate": args.accumulate, "seq": SEQ,
                "device": what, "precision": p,
                "precision_reason": chosen[name].reason if chosen[name] else f"plain loop, same autocast as {next(iter(chosen))}",
                "vocab": args.vocab, "step_seconds": round(seconds, 4), "tokens_per_second": round(tps, 1),
                "flops_per_token": fpts[name], "gemm_peak_flops": peak_of[p],
                "mfu_vs_gemm_peak": round(tps * fpts[name] / peak_of[p], 4),
                "all_step_seconds": [round(t, 4) for t in times[name]], "compile": args.compile and name != "hf",
            })
        if "hf" in contenders:
            for row in rows[-len(contenders):-1]:
                row["speedup_vs_hf"] = round(row["tokens_per_second"] / rows[-1]["tokens_per_second"], 3)
        fp32 = next((r for r in rows[-len(contenders):] if r["engine"] == "cramlm-fp32"), None)
        if fp32:  # the same run, interleaved: the ratio the load does not bend
            for row in rows[-len(contenders):]:
                if row["engine"].startswith("cramlm-") and row is not fp32:
                    row["speedup_vs_fp32"] = round(row["tokens_per_second"] / fp32["tokens_per_second"], 3)
        print(json.dumps(rows[-len(contenders):]), flush=True)
        write(args.out, peaks, rows)  # after each size: a run cut short keeps what it measured
    write(args.out, peaks, rows)
    print(f"\nGEMM peaks ({what}) before the run: " + ", ".join(f"{p} {v / 1e9:.1f} GFLOP/s" for p, v in peaks.items())
          + f" (per row: the higher of it and the in-run median); seq {SEQ}, vocab {args.vocab}; medians of {args.steps} interleaved steps")
    print("| size | engine | precision | params | microbatch | tokens/s | GFLOP/token | MFU (of its precision's GEMM peak) | vs HF |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if "skipped" in r:
            print(f"| {r['size']} | - | - | - | - | - | - | - | skipped: {r['skipped']} |")
            continue
        print(f"| {r['size']} | {r['engine']} | {r['precision']} | {r['parameters'] / 1e6:.1f}M | {r['microbatch']}{'' if r.get('accumulate', 1) == 1 else ' x' + str(r['accumulate'])} | {r['tokens_per_second']:,.0f} | "
              f"{r['flops_per_token'] / 1e9:.3f} | {100 * r['mfu_vs_gemm_peak']:.1f}% | {r.get('speedup_vs_hf', '')} |")
    for r in rows:
        if "speedup_vs_fp32" in r:
            print(f"{r['size']} {r['engine']} ({r['precision']}): {r['speedup_vs_fp32']:.2f}x the fp32 contender's tokens/s, same run")
    for r in rows:
        if r.get("precision_reason", "").startswith("measured"):
            print(f"{r['size']} {r['engine']}: precision auto -> {r['precision']}: {r['precision_reason']}")
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
