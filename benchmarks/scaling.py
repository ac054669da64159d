"""Per-process work as the number of processes grows: real ``torchrun`` with gloo on the CPU at 1, 2,
4 and 8 processes, DDP, a fixed per-process batch (so the global batch grows with the processes),
the real Trainer.train_step over a real packed file (``BlockDataset``), crammed-bert-tiny at vocab
32768. Each process draws and masks only its own microbatches (train/batches.py, masks keyed by
stream position: the ``new`` rows). The committed results also hold ``old`` rows, measured when
cramlm still had the path before rank-local batches (every process drew and masked the whole global
batch with one generator, then kept its contiguous share; data format 1, since removed): ``--paper``
fits the host cost per sequence on them.

Per step and process it reports: the host time getting the batch (draw + mask + slicing), as CPU
time of the training thread (``time.thread_time``) and wall time; the step's wall time; the bytes
all-reduced (measured by a DDP communication hook that counts each gradient bucket, plus the step's
one small agreement reduction). On a 2-core machine 4 and 8 processes oversubscribe the cores, so
wall times there measure waiting for a core and for the slowest process; the host CPU time is the
figure that shows whether per-process work stays flat, and it is what the table compares. Medians
over the measured steps; then for host CPU time the median over processes (``host_cpu_ms``; the
maximum and every process's value are in the JSON), for the rest the maximum over processes.

    python benchmarks/scaling.py                          # 1 2 4 8 processes; JSON + table
    python benchmarks/scaling.py --procs 1 2 --steps 4    # quicker
    python benchmarks/scaling.py --out benchmarks/results/scaling.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cramlm.io import write_result

SEQ, VOCAB = 128, 32768


def make_data(path: Path, sequences: int) -> None:
    import numpy as np

    from cramlm.data.cramtok import PackedWriter
    from cramlm.data.tokenizer import SPECIAL_TOKENS

    rng = np.random.default_rng(0)
    with PackedWriter(path, VOCAB) as w:
        for _ in range(sequences // 2):  # documents of ~2 blocks
            w.add(rng.integers(len(SPECIAL_TOKENS), VOCAB, int(rng.integers(SEQ, 3 * SEQ))))


def worker(args) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    from cramlm.config.loader import load_preset
    from cramlm.config.registry import config_class
    from cramlm.data.collate import MLMCollator
    from cramlm.data.cramtok import read_packed
    from cramlm.data.dataset import BlockDataset
    from cramlm.data.tokenizer import CLS_ID, MASK_ID, SPECIAL_TOKENS
    from cramlm.models.base import build_model
    from cramlm.train.batches import StepData
    from cramlm.train.build import build_trainer
    from cramlm.train.config import TrainConfig
    from cramlm.train.distributed import Dist
    from cramlm.train.impl import ImplConfig

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    d = Dist(rank, world, rank, "ddp" if world > 1 else "none")
    arch = config_class("model", "crammed-bert").model_validate(load_preset("arch", args.arch))
    torch.manual_seed(0)
    model = build_model(arch, VOCAB)
    dataset = BlockDataset(read_packed(args.data), SEQ, CLS_ID)
    collate = MLMCollator(VOCAB, MASK_ID, len(SPECIAL_TOKENS), 0.15, 0)
    data = StepData(dataset, collate, 0)
    n_micro = args.micro_per_process * world
    impl = ImplConfig(microbatch_size=args.microbatch, progress=False, device="cpu", precision="fp32", threads=1,
                      compile=False, prefetch=False)
    train = TrainConfig(batch_size=n_micro * args.microbatch, batch_ramp=0, min_updates=0,
                        budget={"steps": 10**9}, validate_sequences=0)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = build_trainer(model, data, train, impl, Path(tmp), dist=d)
    reduced = [0]
    if world > 1:
        def counting(state, bucket):
            reduced[0] += bucket.buffer().numel() * bucket.buffer().element_size()
            return allreduce_hook(state, bucket)

        trainer.model.register_comm_hook(None, counting)
    trainer.model.train()
    rows = []
    for i in range(args.warmup + args.steps):
        host, cpu, before = trainer.batches.host_seconds, trainer.batches.host_cpu_seconds, reduced[0]
        start = time.perf_counter()
        trainer.train_step(n_micro)
        seconds = time.perf_counter() - start
        if i >= args.warmup:
            agreement = 3 * 8 if world > 1 else 0  # clock, stop, non-finite flag as float64 (trainer.train_step)
            rows.append([trainer.batches.host_cpu_seconds - cpu, trainer.batches.host_seconds - host, seconds,
                         reduced[0] - before + agreement])
    mine = [statistics.median(column) for column in zip(*rows)]
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    if rank == 0:
        worst = [max(r[k] for r in everyone) for k in range(4)]
        typical = statistics.median(r[0] for r in everyone)
        Path(args.result).write_text(json.dumps({
            "path": args.path, "processes": world, "sequences_per_process": args.micro_per_process * args.microbatch,
            "global_batch": n_micro * args.microbatch, "host_cpu_ms": round(1e3 * typical, 3),
            "host_cpu_ms_max": round(1e3 * worst[0], 3),
            "host_wall_ms": round(1e3 * worst[1], 3), "step_ms": round(1e3 * worst[2], 1),
            "bytes_reduced": int(worst[3]), "parameters": sum(p.numel() for p in model.parameters()),
            "host_cpu_ms_per_process": [round(1e3 * r[0], 3) for r in everyone],
        }))
    dist.destroy_process_group()


def launch(args, procs: int, path: str, data: Path, tmp: Path) -> dict:
    result = tmp / f"{path}-{procs}.json"
    with socket.socket() as sock:  # a free port for this launch's rendezvous
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={procs}", f"--master_port={port}",
           "--master_addr=127.0.0.1", str(Path(__file__).resolve()), "--worker", "--path", path, "--data", str(data),
           "--result", str(result), "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--microbatch", str(args.microbatch), "--micro-per-process", str(args.micro_per_process), "--arch", args.arch]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(result.read_text())


def table(rows: list[dict]) -> str:
    lines = ["| processes | global batch | host CPU ms/step/process old | new | host wall ms old | new | "
             "step ms old | new | MB all-reduced/step |", "|---|---|---|---|---|---|---|---|---|"]
    by = {(r["path"], r["processes"]): r for r in rows}
    for n in sorted({r["processes"] for r in rows}):
        old, new = by.get(("old", n), {}), by.get(("new", n), {})
        lines.append(f"| {n} | {new.get('global_batch', old.get('global_batch'))} | {old.get('host_cpu_ms', '-')} | "
                     f"{new.get('host_cpu_ms', '-')} | {old.get('host_wall_ms', '-')} | {new.get('host_wall_ms', '-')} | "
                     f"{old.get('step_ms', '-')} | {new.get('step_ms', '-')} | {new.get('bytes_reduced', 0) / 1e6:.2f} |")
    return "\n".join(lines)


# ------------------------------------------------------------------ the estimate on paper

PEAK = 989e12  # H200 dense bf16 FLOP/s (train/flops.py PEAK_TFLOPS; NVIDIA's datasheet, without sparsity)
MFU = 0.40  # assumed: REFERENCE.md's realistic target for BERT-base in bf16 on an H100/H200 (35-45%)
NVLINK, IB = 900e9, 50e9  # bytes/s per GPU: NVLink 4 (H200 SXM, as NVIDIA quotes it), one 400 Gb/s NIC per GPU
HBM = 141e9  # bytes per H200
GPUS = (1, 8, 64, 512)
MODELS = {  # the model, its sequences per optimizer step and length, as the presets train them
    "crammed-bert base": ("crammed-bert-base", {}, 8192, 128, {"predicted_fraction": 0.25}),  # bert-o4: 8192 x 128, 25% masked
    "llama 1B": ("llama-small", {"hidden_size": 2048, "num_layers": 16, "num_heads": 32, "num_kv_heads": 8,
                                 "intermediate_size": 16384}, 512, 2048, {}),  # Llama-3.2-1B widths, 1M tokens a step
}


def host_model(rows: list[dict]) -> tuple[float, float]:
    """(ms per step, ms per sequence of 128 tokens) of drawing + masking: a least-squares line
    through the old path's rows (each process collated the global batch: 16 to 128 sequences)."""
    import numpy as np

    old = [r for r in rows if r["path"] == "old"]
    x = np.array([r["global_batch"] for r in old], float)
    y = np.array([r["host_cpu_ms"] for r in old], float)
    slope, intercept = np.polyfit(x, y, 1)
    return float(intercept), float(slope)


def ring_seconds(nbytes: float, n: int, bandwidth: float) -> float:
    return 2 * (n - 1) / n * nbytes / bandwidth if n > 1 else 0.0


def paper(measured: dict) -> list[dict]:
    import torch

    from cramlm.config.loader import load_preset
    from cramlm.config.registry import config_class
    from cramlm.models.base import build_model

    fixed_ms, per_seq_ms = host_model(measured["rows"])
    out = []
    for label, (preset, widths, sequences, seq_len, kwargs) in MODELS.items():
        arch = {**load_preset("arch", preset), **widths}
        with torch.device("meta"):
            model = build_model(config_class("model", arch["type"]).model_validate(arch), VOCAB)
        params = sum(p.numel() for p in model.parameters())
        block = max(sum(p.numel() for p in m.parameters()) for m in model.modules() if isinstance(m, torch.nn.ModuleList)
                    for m in m)  # one transformer block
        flops = model.flops_per_token(seq_len, **kwargs) * sequences * seq_len
        host_seq_ms = per_seq_ms * seq_len / SEQ  # per sequence, scaled by its tokens (masking included: an upper bound for a causal LM)
        for n in GPUS:
            compute = flops / (n * PEAK * MFU)
            grads = {"fp32": 4 * params, "bf16": 2 * params}
            link = NVLINK if n <= 8 else IB  # beyond one node of 8 the ring crosses InfiniBand
            reduce_fp32 = ring_seconds(grads["fp32"], n, link)
            host_old = (fixed_ms + host_seq_ms * sequences) / 1e3
            host_new = (fixed_ms + host_seq_ms * sequences / n) / 1e3
            ddp_memory = 16 * params  # fp32 weights + grads + AdamW's two moments
            fsdp_memory = 16 * params / n + 2 * 4 * block  # the shards, plus one block gathered (weights + grads)
            exposed = max(0.0, reduce_fp32 - compute * 2 / 3)  # DDP overlaps buckets with the backward (~2/3 of a step)

            def bound(host: float) -> str:  # what sets the step time (prefetched host work hides behind compute)
                return "host" if host > compute else "network" if exposed > 0.1 * compute else "compute"
            out.append({
                "model": label, "gpus": n, "parameters": params, "tokens_per_step": sequences * seq_len,
                "step_flops": flops, "compute_ms": round(1e3 * compute, 2),
                "grad_mb_fp32": round(grads["fp32"] / 1e6), "grad_mb_bf16": round(grads["bf16"] / 1e6),
                "allreduce_ms_nvlink": round(1e3 * ring_seconds(grads["fp32"], n, NVLINK), 2),
                "allreduce_ms_ib": round(1e3 * ring_seconds(grads["fp32"], n, IB), 2),
                "allreduce_ms": round(1e3 * reduce_fp32, 2), "link": "-" if n == 1 else "NVLink" if n <= 8 else "IB",
                "host_ms_old": round(1e3 * host_old, 2), "host_ms_new": round(1e3 * host_new, 2),
                "host_bound_old": host_old > compute, "bound_old": bound(host_old), "bound_new": bound(host_new),
                "ddp_state_gb": round(ddp_memory / 1e9, 1), "fsdp_state_gb": round(fsdp_memory / 1e9, 2),
                "sequences_per_gpu": sequences // n,
            })
    return out


def paper_table(rows: list[dict]) -> str:
    lines = ["| model | GPUs | seq/GPU | compute ms/step | grad MB fp32 | all-reduce ms NVLink / IB | host ms/step/process old / new | "
             "bound old / new path | DDP / FSDP2 state GB/GPU |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        old = f"**{r['host_ms_old']}**" if r["host_bound_old"] else f"{r['host_ms_old']}"
        lines.append(f"| {r['model']} | {r['gpus']} | {r['sequences_per_gpu']} | {r['compute_ms']} | {r['grad_mb_fp32']} | "
                     f"{r['allreduce_ms_nvlink']} / {r['allreduce_ms_ib']} | {old} / {r['host_ms_new']} | {r['bound_old']} / {r['bound_new']} | "
                     f"{r['ddp_state_gb']} / {r['fsdp_state_gb']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--procs", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--steps", type=int, default=8, help="measured steps (medians)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--microbatch", type=int, default=8)
    ap.add_argument("--micro-per-process", type=int, default=2, help="microbatches per process per step")
    ap.add_argument("--arch", default="crammed-bert-tiny")
    ap.add_argument("--out", help="also write the JSON here (and the table next to it, .md)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--path", default="new", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--paper", metavar="RESULTS_JSON",
                    help="no runs: the estimate for H200 GPUs from a measured RESULTS_JSON (host cost per sequence)")
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)
    if args.paper:
        measured = json.loads(Path(args.paper).read_text())
        fixed, per_seq = host_model(measured["rows"])
        rows = paper(measured)
        report = {"benchmark": "scaling-paper", "measured": args.paper, "host_fixed_ms": round(fixed, 4),
                  "host_ms_per_sequence_128": round(per_seq, 5), "peak_flops": PEAK, "mfu_assumed": MFU,
                  "nvlink_bytes_per_s": NVLINK, "ib_bytes_per_s": IB, "rows": rows}
        print(json.dumps(report, indent=1))
        print(paper_table(rows))
        if args.out:
            write_result(args.out, report, paper_table(rows))
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "tokens.cramtok"
        make_data(data, 2 * max(args.procs) * args.micro_per_process * args.microbatch * (args.steps + args.warmup))
        for procs in args.procs:
            rows.append(launch(args, procs, "new", data, Path(tmp)))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    report = {"benchmark": "scaling", "command": " ".join(["python", "benchmarks/scaling.py", *(argv or sys.argv[1:])]),
              "machine": f"{os.cpu_count()} CPUs (processes beyond that oversubscribe: compare host CPU time)",
              "torch_threads_per_process": 1, "seq_len": SEQ, "vocab": VOCAB, "arch": args.arch, "rows": rows}
    print(json.dumps(report, indent=1))
    print(table(rows))
    if args.out:
        write_result(args.out, report, table(rows))


if __name__ == "__main__":
    main()
