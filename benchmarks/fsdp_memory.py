"""FSDP2 memory per process, measured: a llama built on the meta device, sharded by cramlm's own
``wrap_model`` (``impl.distributed=fsdp``: ``fully_shard`` per block, then the root), materialised
with ``to_empty`` (so each process allocates only its shards), then gradients and one AdamW step
(cramlm's ``build_optimizer``) so that the optimizer state exists. Real ``torchrun`` with gloo on
the CPU at 1, 2 and 4 processes.

Per process it reports the bytes of the tensors it holds (parameter shards, gradient shards, AdamW
moments: counted from the tensors themselves) and the growth of its resident memory (VmRSS) from
before the model to after the step, beside the estimate 16 bytes x parameters / processes (fp32
weights, gradients and two moments). Activations are left out: this is the state FSDP2 shards.

The default width is smaller than a 1B llama (this machine has 24 GiB shared by several people;
a 1B model's 17.7 GB of state at one process would not fit safely), the same shape otherwise
(Llama-3.2-1B's ratios: head width 64, 4 query heads per kv head, SwiGLU 4x): the measured bytes
per parameter per process are what carries over to 1B (docs/training.md, "Scaling").

    python benchmarks/fsdp_memory.py                              # 1 2 4 processes, hidden 1024 x 8 layers
    python benchmarks/fsdp_memory.py --hidden 768 --layers 4 --procs 1 2
    python benchmarks/fsdp_memory.py --out benchmarks/results/fsdp_memory.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from cramlm.io import write_result

VOCAB = 32768


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def arch(hidden: int, layers: int) -> dict:
    from cramlm.config.loader import load_preset

    heads = hidden // 64
    return {**load_preset("arch", "llama-small"), "hidden_size": hidden, "num_layers": layers, "num_heads": heads,
            "num_kv_heads": max(1, heads // 4), "intermediate_size": 8 * hidden}  # gate + up: 2 x 4 x hidden


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    from cramlm.config.registry import config_class
    from cramlm.models.base import build_model
    from cramlm.train.distributed import Dist, wrap_model
    from cramlm.train.optim import AdamWConfig, build_optimizer

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    before = rss_bytes()
    cfg = config_class("model", "llama").model_validate(arch(args.hidden, args.layers))
    with torch.device("meta"):
        model = build_model(cfg, VOCAB)
    params = sum(p.numel() for p in model.parameters())
    wrap_model(model, Dist(rank, world, rank, "fsdp"), torch.device("cpu"), from_rank0=False)  # initialised here
    model.to_empty(device="cpu")  # each process allocates its shards only
    local = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]
    for t in local:
        t.data.normal_(0, 0.02)
    for p in model.parameters():  # gradients as a backward leaves them (sharded like the parameters)
        p.grad = torch.zeros_like(p)
    optimizer = build_optimizer(AdamWConfig(lr=1e-4), model)
    optimizer.step()  # allocates AdamW's moments
    nbytes = lambda ts: sum(t.numel() * t.element_size() for t in ts)  # noqa: E731
    held = {
        "parameters": nbytes(local),
        "gradients": nbytes(p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad for p in model.parameters()),
        "optimizer": nbytes(v.to_local() if hasattr(v, "to_local") else v for s in optimizer.state.values()
                            for v in s.values() if torch.is_tensor(v) and v.ndim > 0),
    }
    mine = {"rank": rank, **held, "total": sum(held.values()), "rss_growth": rss_bytes() - before}
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    if rank == 0:
        Path(args.result).write_text(json.dumps({
            "processes": world, "parameters": params, "hidden": args.hidden, "layers": args.layers,
            "estimate_bytes_per_process": 16 * params / world,
            "held_bytes_per_process": max(r["total"] for r in everyone),
            "rss_growth_bytes_per_process": max(r["rss_growth"] for r in everyone),
            "held_bytes_per_parameter": round(max(r["total"] for r in everyone) / params, 3),
            "per_process": everyone,
        }))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--procs", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--out")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.procs:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
            result = Path(tmp) / f"{n}.json"
            cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={n}", f"--master_port={port}",
                   "--master_addr=127.0.0.1", str(Path(__file__).resolve()), "--worker", "--result", str(result),
                   "--hidden", str(args.hidden), "--layers", str(args.layers)]
            env = dict(os.environ, OMP_NUM_THREADS="1")
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
            if proc.returncode:
                raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
            rows.append(json.loads(result.read_text()))
    report = {"benchmark": "fsdp_memory", "command": " ".join(["python", "benchmarks/fsdp_memory.py", *(argv or sys.argv[1:])]),
              "rows": rows}
    lines = ["| processes | parameters | held MB/process (params + grads + AdamW) | estimate 16 B x P / N MB | "
             "RSS growth MB/process | held B/param/process |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['processes']} | {r['parameters'] / 1e6:.1f}M | {r['held_bytes_per_process'] / 1e6:.0f} | "
                     f"{r['estimate_bytes_per_process'] / 1e6:.0f} | {r['rss_growth_bytes_per_process'] / 1e6:.0f} | "
                     f"{r['held_bytes_per_parameter']} |")
    print(json.dumps(report, indent=1))
    print("\n".join(lines))
    if args.out:
        write_result(args.out, report, "\n".join(lines))


if __name__ == "__main__":
    main()
