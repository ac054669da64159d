"""Muon's optimizer step with the Newton-Schulz iteration in bfloat16 (torch's) against float32
(``train.optim.ns_dtype``), in process CPU time on one thread (a figure other work on a shared machine
hardly moves), on a recipe's real matrices: crammed-bert tiny as cpu-1h trains it (ELECTRA's generator
and discriminator, ``split_fused``; ``--arch`` another size). The two dtypes' steps are interleaved on
the same model and gradients and medians taken; beside them this thread's GEMM rate in each dtype, which
decides the answer: a CPU with AVX512-BF16 / AMX runs bf16 GEMMs at up to 2x fp32, one with AVX2 only
emulates them at a fraction of it.

    python -m benchmarks.muon_ns                         # tiny (cpu-1h's model), JSON + table
    python -m benchmarks.muon_ns --arch crammed-bert --steps 2   # base size: minutes per bf16 step where bf16 is emulated
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from benchmarks.step_cpu_time import gemm_peak
from cramlm.config.loader import load_preset
from cramlm.config.registry import config_class
from cramlm.data.tokenizer import SPECIAL_TOKENS
from cramlm.models.base import build_model
from cramlm.models.objectives.config import RTDConfig
from cramlm.models.objectives.rtd import build_rtd
from cramlm.train.optim import build_optimizer, optimizer_flops_per_step

VOCAB = {"crammed-bert-tiny": 8192}  # cpu-1h's; the rest cramming's 32,768
DTYPES = ("bfloat16", "float32")


def measure(arch_name: str, steps: int) -> list[dict]:
    arch = load_preset("arch", arch_name)
    cfg = config_class("model", arch["type"]).model_validate(arch)
    torch.manual_seed(0)
    model = build_rtd(build_model(cfg, VOCAB.get(arch_name, 32768)), RTDConfig(), len(SPECIAL_TOKENS))
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    muon = config_class("optimizer", "muon")
    optimizers = {d: build_optimizer(muon(type="muon", lr=1.6e-2, momentum=0.85, split_fused=True, ns_dtype=d), model)
                  for d in DTYPES}
    seconds: dict[str, list[float]] = {d: [] for d in DTYPES}
    for i in range(1 + steps):  # one warm-up each, then interleaved
        for d, opt in optimizers.items():
            start = time.process_time()
            opt.step()
            if i:
                seconds[d].append(time.process_time() - start)
    matrices = sum(len(g["params"]) for g in optimizers["float32"].muon.param_groups)
    flops = optimizer_flops_per_step(optimizers["float32"])
    rows = []
    for d in DTYPES:
        cpu = statistics.median(seconds[d])
        rows.append({"arch": arch_name, "ns_dtype": d, "parameters": sum(p.numel() for p in model.parameters()),
                     "muon_matrices": matrices, "ns_flops_per_step": flops, "cpu_seconds_per_step": round(cpu, 4),
                     "ns_flops_per_cpu_second": round(flops / cpu), "steps": steps})
    return rows


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", nargs="+", default=["crammed-bert-tiny"])
    ap.add_argument("--steps", type=int, default=7, help="timed optimizer steps per dtype (after one warm-up)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    gemm = {d: gemm_peak(getattr(torch, d), sizes=(512,)) for d in DTYPES}
    rows = [row for arch in args.arch for row in measure(arch, args.steps)]
    result = {"cpu": cpu_name(), "threads": 1, "gemm_flops_per_cpu_second": {d: round(v) for d, v in gemm.items()},
              "bf16_over_fp32_gemm": round(gemm["bfloat16"] / gemm["float32"], 3), "rows": rows}
    print(json.dumps(result), flush=True)
    print(f"{result['cpu']}, one thread: bf16 GEMMs at {result['bf16_over_fp32_gemm']:.2f}x fp32's")
    print("| arch | Muon matrices | ns_dtype | optimizer CPU-seconds per step | Newton-Schulz GFLOP/s | float32 over bfloat16 |")
    print("|---|---:|---|---:|---:|---:|")
    by = {(r["arch"], r["ns_dtype"]): r for r in rows}
    for r in rows:
        speedup = by[(r["arch"], "bfloat16")]["cpu_seconds_per_step"] / by[(r["arch"], "float32")]["cpu_seconds_per_step"]
        print(f"| {r['arch']} | {r['muon_matrices']} | {r['ns_dtype']} | {r['cpu_seconds_per_step']:.3f} | "
              f"{r['ns_flops_per_cpu_second'] / 1e9:.1f} | {f'{speedup:.2f}x' if r['ns_dtype'] == 'float32' else ''} |")
    return result


def cpu_name() -> str:
    """The CPU's model name, family and what it has for bf16 matmuls (AVX512-BF16, AMX)."""
    info: dict[str, str] = {}
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:
        return "unknown CPU"
    flags = set(info.get("flags", "").split())
    bf16 = [name for flag, name in (("avx512_bf16", "AVX512-BF16"), ("amx_bf16", "AMX-BF16")) if flag in flags]
    vector = "AVX512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return (f"{info.get('model name', 'unknown CPU')} (family {info.get('cpu family', '?')}; {vector}, "
            f"{', '.join(bf16) if bf16 else 'no bf16 matmul instructions'})")


if __name__ == "__main__":
    main(sys.argv[1:])
