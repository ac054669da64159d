"""impl.prefetch on a CPU: the same training step with and without the prefetch thread, steps of the
two interleaved (so the load of a shared machine hits both alike). crammed-bert-tiny at vocab 32768,
sequences of 128 from a real packed file, 2 microbatches of 64 a step, 2 torch threads. Reports the
median step time and the loop's host time per step (batches.LocalBatches.host_seconds) of each.

    python -m benchmarks.prefetch_cpu               # JSON + table (from the repository root)
    python -m benchmarks.prefetch_cpu --steps 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.scaling import SEQ, VOCAB, make_data  # the same packed data
from cramlm.config.loader import load_preset
from cramlm.config.registry import config_class
from cramlm.data.collate import MLMCollator
from cramlm.data.cramtok import read_packed
from cramlm.data.dataset import BlockDataset
from cramlm.models.base import build_model
from cramlm.train.batches import StepData
from cramlm.train.build import build_trainer
from cramlm.train.config import TrainConfig
from cramlm.train.impl import ImplConfig
from cramlm.train.trainer import Trainer


def trainer(dataset, prefetch: bool, run_dir: Path, micro: int) -> Trainer:
    torch.manual_seed(0)
    model = build_model(config_class("model", "crammed-bert").model_validate(load_preset("arch", "crammed-bert-tiny")), VOCAB)
    impl = ImplConfig(microbatch_size=micro, progress=False, device="cpu", precision="fp32", compile=False, prefetch=prefetch)
    train = TrainConfig(batch_size=2 * micro, batch_ramp=0, min_updates=0, budget={"steps": 10**9}, validate_sequences=0)
    data = StepData(dataset, MLMCollator(VOCAB, 4, 5, 0.25, 0), 0)
    t = build_trainer(model, data, train, impl, run_dir)
    t.model.train()
    return t


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--microbatch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        make_data(Path(tmp) / "t.cramtok", 4 * args.microbatch * (args.steps + 1))
        dataset = BlockDataset(read_packed(Path(tmp) / "t.cramtok"), SEQ, 2)
        runs = {p: trainer(dataset, p, Path(tmp), args.microbatch) for p in (False, True)}
        steps, host = {p: [] for p in runs}, {p: [] for p in runs}
        for i in range(1 + args.steps):  # the first step of each is warm-up
            for p, t in runs.items():
                h, start = t.batches.host_seconds, time.perf_counter()
                t.train_step(2)
                if i:
                    steps[p].append(time.perf_counter() - start)
                    host[p].append(t.batches.host_seconds - h)
        runs[True].batches.close()
    rows = [{"prefetch": p, "step_ms": round(1e3 * statistics.median(steps[p]), 1),
             "host_ms": round(1e3 * statistics.median(host[p]), 3)} for p in runs]
    print(json.dumps({"benchmark": "prefetch_cpu", "threads": args.threads, "microbatch": args.microbatch, "rows": rows}, indent=1))
    print("| prefetch | step ms (median) | host ms/step (median) |\n|---|---|---|")
    for r in rows:
        print(f"| {r['prefetch']} | {r['step_ms']} | {r['host_ms']} |")


if __name__ == "__main__":
    main()
