"""Per-process work as the number of processes grows: real ``torchrun`` with gloo on the CPU at 1, 2,
4 and 8 processes, DDP, a fixed per-process batch (so the global batch grows with the processes),
the real Trainer.train_step over a real packed file (``BlockDataset``), crammed-bert-tiny at vocab
32768. Two data paths, the same model and step:

- ``new``: each process draws and masks only its own microbatches (train/batches.py, masks keyed by
  stream position);
- ``old``: every process draws and masks the whole global batch with one generator, then keeps its
  contiguous share: the path before rank-local batches, which cramlm keeps for checkpoints written
  then (``StepData(keyed=False)``, data format 1).

Per step and process it reports: the host time getting the batch (draw + mask + slicing), as CPU
time of the training thread (``time.thread_time``) and wall time; the step's wall time; the bytes
all-reduced (measured by a DDP communication hook that counts each gradient bucket, plus the step's
one small agreement reduction). On a 2-core machine 4 and 8 processes oversubscribe the cores, so
wall times there measure waiting for a core and for the slowest process; the host CPU time is the
figure that shows whether per-process work stays flat, and it is what the table compares. Medians
over the measured steps, then the maximum over processes.

    python benchmarks/scaling.py                          # 1 2 4 8 processes, both paths; JSON + table
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

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

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
    import numpy as np
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
    from cramlm.train.budget import Budget, Meter, measure_costs
    from cramlm.train.distributed import Dist
    from cramlm.train.impl import ImplConfig
    from cramlm.train.parallelize import parallelize
    from cramlm.train.trainer import StepData, TrainConfig, Trainer

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    d = Dist(rank, world, rank, "ddp" if world > 1 else "none")
    arch = config_class("model", "crammed-bert").model_validate(load_preset("arch", args.arch))
    torch.manual_seed(0)
    model = build_model(arch, VOCAB)
    dataset = BlockDataset(read_packed(args.data), SEQ, CLS_ID)
    collate = MLMCollator(VOCAB, MASK_ID, len(SPECIAL_TOKENS), 0.15, 0)
    data = StepData(dataset, collate, 0, keyed=args.path == "new")
    n_micro = args.micro_per_process * world
    impl = ImplConfig(microbatch_size=args.microbatch, progress=False, device="cpu", precision="fp32", threads=1,
                      compile=False, prefetch=False)
    train = TrainConfig(batch_size=n_micro * args.microbatch, batch_ramp=0, min_updates=0,
                        budget={"steps": 10**9}, validate_batches=0)
    costs = measure_costs(model, SEQ, None, torch.device("cpu"))
    meter = Meter(Budget(train.budget, None, costs.flops_per_token), costs, world)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(parallelize(model, impl, d, torch.device("cpu")), data, train, impl, meter, Path(tmp))
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
        Path(args.result).write_text(json.dumps({
            "path": args.path, "processes": world, "sequences_per_process": args.micro_per_process * args.microbatch,
            "global_batch": n_micro * args.microbatch, "host_cpu_ms": round(1e3 * worst[0], 3),
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
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--procs", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--paths", nargs="+", default=["old", "new"], choices=["old", "new"])
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
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "tokens.cramtok"
        make_data(data, 2 * max(args.procs) * args.micro_per_process * args.microbatch * (args.steps + args.warmup))
        for procs in args.procs:
            for path in args.paths:  # the two paths of each size one after the other: the same machine load
                rows.append(launch(args, procs, path, data, Path(tmp)))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    report = {"benchmark": "scaling", "command": " ".join(["python", "benchmarks/scaling.py", *(argv or sys.argv[1:])]),
              "machine": f"{os.cpu_count()} CPUs (processes beyond that oversubscribe: compare host CPU time)",
              "torch_threads_per_process": 1, "seq_len": SEQ, "vocab": VOCAB, "arch": args.arch, "rows": rows}
    print(json.dumps(report, indent=1))
    print(table(rows))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
        Path(args.out).with_suffix(".md").write_text(table(rows) + "\n")


if __name__ == "__main__":
    main()
