"""Forward + backward tokens/s of crammed-bert against transformers' BertForMaskedLM of the same
width, depth, heads, FFN width and vocabulary, on the same MLM batch, in the same run.

    python benchmarks/model_step.py                       # tiny and base, JSON + table
    python benchmarks/model_step.py --sizes base --steps 5 --batch 8 --profile
    python benchmarks/model_step.py --device cuda --precision bf16 --batch 128   # on a GPU
    python benchmarks/model_step.py --precision bf16 --batch 128 --documents 4    # + packed documents

The device defaults to CUDA when there is one (timed with synchronisation); `--precision bf16|fp16`
runs both under the same autocast (cramming trains in fp16 autocast). MFU is against the measured
dense GEMM rate of the device in that precision (`--peak-flops` to give it instead).
`--documents N` also times crammed-bert on the same batch cut into N documents per row, through
FlexAttention's block mask and through the dense (B, 1, T, T) SDPA mask. On CUDA (eager), crammed-bert
is also timed with its fused MLM loss in the small chunks sized for a CPU (`gpu_vs_cpu_chunks`). Steps of the two models are interleaved (ours, theirs, ours, ...) so that load from other
processes hits both alike; tokens/s come from the best step of each (the least disturbed), the
median is reported beside it. Both run without dropout
(cramming pretrains without it); both get 25% of positions scored (cramming's masking rate), which
crammed-bert's sparse prediction exploits and BERT's dense head cannot.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from cramlm.config.loader import load_preset
from cramlm.models import build_model
from cramlm.models.config import CrammedBertConfig
from cramlm.models.crammed_bert import CrammedBert
from cramlm.train.flops import gemm_peak_flops, profile_steps
from cramlm.train.hardware import PRECISION_DTYPES
from cramlm.train.impl import autocast

VOCAB = 32768


def hf_bert(cfg: CrammedBertConfig):
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(
        vocab_size=VOCAB, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_seq_length, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )
    config._attn_implementation = "sdpa"  # (the default too; stated for the record)
    return BertForMaskedLM(config)


def make_batch(batch: int, seq: int, rate: float, seed: int = 0, documents: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (batch, seq), generator=g)
    labels = torch.where(torch.rand(batch, seq, generator=g) < rate, ids, torch.full_like(ids, -100))
    out = {"input_ids": ids, "labels": labels}
    if documents:  # each row cut into `documents` pieces of random lengths
        cuts = torch.sort(torch.randint(1, seq, (batch, documents - 1), generator=g), dim=1).values
        out["document_ids"] = (torch.arange(seq)[None, None] >= cuts[..., None]).sum(1)  # (B, T)
    return out


class DocumentAttention(torch.nn.Module):
    """crammed-bert on packed documents with the attention path fixed to ``mode`` (flex or dense)."""

    def __init__(self, model, mode: str):
        super().__init__()
        self.model, self.mode = model, mode

    def forward(self, **batch):
        self.model.trunk.document_kernel = self.mode
        return self.model(**batch)


class CpuChunks(torch.nn.Module):
    """crammed-bert with the fused MLM loss in the chunks sized for a CPU's cache (models/model.py
    chunk_rows), on CUDA: what the GPU chunk size buys."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, **batch):
        from cramlm.models.model import chunk_rows

        head = self.model.head
        head.loss_rows = chunk_rows(head.decoder.weight.shape[0], "cpu")
        try:
            return self.model(**batch)
        finally:
            head.loss_rows = None


def count_ops(model, batch, device: torch.device, dtype) -> int:
    """The aten ops one training step issues (forward and backward), counted at the top level (an op
    called from inside another aten op is part of it)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step(model, batch, device, dtype)
    return sum(1 for e in prof.events() if e.name.startswith("aten::")
               and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))


def step(model, batch, device: torch.device, dtype: torch.dtype | None) -> float:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    with autocast(device, dtype):
        loss = model(**batch)
    loss = loss["loss"] if isinstance(loss, dict) else loss.loss
    loss.backward()
    sync()  # CUDA runs asynchronously: time the work, not the launch
    elapsed = time.perf_counter() - start
    for p in model.parameters():
        p.grad = None
    return elapsed


def bench_size(size: str, args) -> dict:
    cfg = CrammedBertConfig.model_validate(load_preset("arch", f"crammed-bert-{size}"))
    torch.manual_seed(0)
    device, dtype = torch.device(args.device), PRECISION_DTYPES[args.precision]
    ours, theirs = build_model(cfg, VOCAB).train().to(device), hf_bert(cfg).train().to(device)
    if args.compile:
        ours, theirs = torch.compile(ours), torch.compile(theirs)
    if args.documents and device.type != "cuda":
        print("--documents: skipped, FlexAttention trains on CUDA only (no CPU backward)")
    full = {k: v.to(device) for k, v in make_batch(args.batch, args.seq, args.mask_rate, documents=args.documents).items()}
    batch = {k: v for k, v in full.items() if k != "document_ids"}
    contenders = {"crammed-bert": (ours, batch), "hf-bert": (theirs, batch)}
    if device.type == "cuda" and not args.compile and cfg.sparse_prediction:  # compiled, the loss takes plain ops
        contenders["crammed-bert-cpu-chunks"] = (CpuChunks(ours), batch)
    if args.documents and device.type == "cuda":  # packed documents: FlexAttention's block mask against the dense mask
        contenders["crammed-bert-docs-flex"] = (DocumentAttention(ours, "flex"), full)
        contenders["crammed-bert-docs-dense"] = (DocumentAttention(ours, "dense"), full)
    for _ in range(args.warmup):
        for m, b in contenders.values():
            step(m, b, device, dtype)
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(args.steps):
        for name, (m, b) in contenders.items():
            times[name].append(step(m, b, device, dtype))
    tokens = args.batch * args.seq
    # best step: the one least disturbed by other processes (timeit's rule); median for the record
    tps = {k: tokens / min(v) for k, v in times.items()}
    tps_median = {k: tokens / statistics.median(v) for k, v in times.items()}
    params = {"crammed-bert": sum(p.numel() for p in ours.parameters()),
              "hf-bert": sum(p.numel() for p in theirs.parameters())}
    model = ours._orig_mod if args.compile else ours
    rate = args.mask_rate if cfg.sparse_prediction else 1.0
    # HF's BertForMaskedLM is exactly our bert-original (tested), so our exact count applies to it
    bert = CrammedBertConfig.model_validate({**load_preset("arch", "bert-original"), **cfg.model_dump(
        include={"hidden_size", "num_layers", "num_heads", "intermediate_size", "max_seq_length"})})
    bert_flops = CrammedBert(bert, VOCAB).flops_per_token(args.seq)
    flops = {name: bert_flops if name == "hf-bert" else model.flops_per_token(args.seq, rate) for name in times}
    result = {
        "size": size, "hidden": cfg.hidden_size, "layers": cfg.num_layers, "heads": cfg.num_heads,
        "intermediate": cfg.intermediate_size, "vocab": VOCAB, "batch": args.batch, "seq": args.seq,
        "steps": args.steps, "compile": args.compile, "threads": torch.get_num_threads(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "precision": args.precision,
        "tokens_per_s": {k: round(v, 1) for k, v in tps.items()},
        "speedup": round(tps["crammed-bert"] / tps["hf-bert"], 3),
        "tokens_per_s_median": {k: round(v, 1) for k, v in tps_median.items()},
        "speedup_median": round(tps_median["crammed-bert"] / tps_median["hf-bert"], 3),
        "params_M": {k: round(v / 1e6, 2) for k, v in params.items()},
        "train_gflop_per_token": {"crammed-bert": round(model.flops_per_token(args.seq, rate) / 1e9, 4),
                                  "hf-bert": round(bert_flops / 1e9, 4)},
        "flop_ratio": round(bert_flops / model.flops_per_token(args.seq, rate), 3),
        "peak_flops": args.peak_flops,
        # model FLOPs utilisation of the best step: counted FLOPs (attention as the full T x T square,
        # also for packed documents) / the measured GEMM peak
        "mfu": {k: round(tps[k] * flops[k] / args.peak_flops, 4) for k in tps},
        "step_seconds": {k: [round(t, 4) for t in v] for k, v in times.items()},
    }
    if "crammed-bert-cpu-chunks" in tps:  # > 1: the GPU chunk size is faster
        result["gpu_vs_cpu_chunks"] = round(tps["crammed-bert"] / tps["crammed-bert-cpu-chunks"], 3)
    if "crammed-bert-docs-flex" in tps:
        result["documents_per_row"] = args.documents
        result["flex_vs_dense"] = round(tps["crammed-bert-docs-flex"] / tps["crammed-bert-docs-dense"], 3)
    if args.count_ops:  # each top-level aten op is about one kernel launch on a GPU: what an eager step pays per launch
        result["ops_per_step"] = {name: count_ops(m, b, device, dtype) for name, (m, b) in contenders.items()}
    if args.profile:
        profile_steps({name: (lambda m=m: step(m, batch, device, dtype)) for name, m in (("crammed-bert", ours), ("hf-bert", theirs))},
                      size, device)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["tiny", "base"])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--mask-rate", type=float, default=0.25)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--precision", choices=sorted(PRECISION_DTYPES), default="fp32", help="autocast dtype for both models")
    parser.add_argument("--compile", action="store_true", help="torch.compile both models (inductor)")
    parser.add_argument("--documents", type=int, default=0, help="also time packed rows of this many documents (flex vs dense mask)")
    parser.add_argument("--peak-flops", type=float, help="the device's peak FLOP/s for MFU (default: measured GEMM rate)")
    parser.add_argument("--profile", action="store_true", help="print a torch.profiler table per model")
    parser.add_argument("--count-ops", action="store_true", help="also count the aten ops of one step per contender "
                        "(about one kernel launch each on a GPU: ops_per_step)")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    if args.peak_flops is None:
        device = torch.device(args.device)
        args.peak_flops = gemm_peak_flops(device, PRECISION_DTYPES[args.precision])
    print(f"peak for MFU: {args.peak_flops / 1e12:.2f} TFLOP/s ({args.precision} GEMM, {args.device})", flush=True)
    results = []
    for size in args.sizes:
        results.append(bench_size(size, args))
        if args.json:  # after each size: a run cut short keeps what it measured
            with open(args.json, "w") as f:
                json.dump(results, f, indent=2)
    print(json.dumps(results, indent=2))
    print("\n| size | hidden x layers | crammed-bert tokens/s | HF BertForMaskedLM tokens/s | speedup (best) | speedup (median) | FLOP ratio | MFU ours / HF |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        t, m = r["tokens_per_s"], r["mfu"]
        print(f"| {r['size']} | {r['hidden']} x {r['layers']} | {t['crammed-bert']:.0f} | {t['hf-bert']:.0f} | {r['speedup']:.2f}x | "
              f"{r['speedup_median']:.2f}x | {r['flop_ratio']:.2f} | {100 * m['crammed-bert']:.1f}% / {100 * m['hf-bert']:.1f}% |")
    for r in results:
        if "ops_per_step" in r:
            print(f"{r['size']}: aten ops per step " + ", ".join(f"{k} {v}" for k, v in r["ops_per_step"].items()))
        if "gpu_vs_cpu_chunks" in r:
            print(f"{r['size']}: fused MLM loss in GPU-sized chunks {r['tokens_per_s']['crammed-bert']:.0f} tokens/s, in CPU-sized "
                  f"chunks {r['tokens_per_s']['crammed-bert-cpu-chunks']:.0f} ({r['gpu_vs_cpu_chunks']:.2f}x)")
        if "flex_vs_dense" in r:
            t = r["tokens_per_s"]
            print(f"{r['size']}, {r['documents_per_row']} documents per row: FlexAttention {t['crammed-bert-docs-flex']:.0f} tokens/s, "
                  f"dense mask {t['crammed-bert-docs-dense']:.0f} tokens/s ({r['flex_vs_dense']:.2f}x)")


if __name__ == "__main__":
    main()
