"""The loop reads nothing back from the device inside a step (issue 14: host synchronisation only
on metrics lines): with one process, fused AdamW and on_nonfinite=skip a step makes no host read at
all; where a step must be decided on the host (rollback / raise) it makes exactly one.

On CPU the reads are counted with a TorchDispatchMode (``aten._local_scalar_dense`` is what
``.item()``, ``bool()`` and ``float()`` of a tensor run); on CUDA (``-m cuda``) torch's own sync
debug mode turns any synchronisation into an error."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from cramlm.data.collate import causal_collate
from cramlm.train.build import build_trainer
from cramlm.train.impl import ImplConfig
from cramlm.train.config import TrainConfig
from cramlm.train.batches import StepData
from cramlm.train.trainer import Trainer

SYNCING = {"_local_scalar_dense", "nonzero", "masked_select", "_assert_async"}


class HostReads(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in SYNCING:
            self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


class Tiny(nn.Module):
    """An LM with no host reads of its own, so that what is counted is the loop's."""

    def __init__(self, vocab: int = 64, width: int = 16):
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        self.mix = nn.Linear(width, width)
        self.out = nn.Linear(width, vocab)

    def forward(self, input_ids, labels):
        logits = self.out(torch.tanh(self.mix(self.emb(input_ids))))
        return {"loss": F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())}


class Blocks:
    seq_length = 8

    def __init__(self, n: int = 256):
        self.blocks = np.random.default_rng(0).integers(0, 64, size=(n, self.seq_length))

    def __len__(self):
        return len(self.blocks)

    def batch(self, indices):
        return torch.from_numpy(self.blocks[np.asarray(indices)])


def trainer(tmp_path, device: torch.device, **train) -> Trainer:
    torch.manual_seed(0)
    model = Tiny().to(device)
    data = StepData(Blocks(), causal_collate, seed=0)
    impl = ImplConfig(microbatch_size=4, progress=False, device=device.type)
    cfg = TrainConfig(**{"batch_size": 8, "batch_ramp": 0, "min_updates": 0, "budget": {"steps": 100}, "validate_sequences": 0, **train})
    return build_trainer(model, data, cfg, impl, tmp_path)


def reads_per_step(t: Trainer, steps: int = 3) -> list[int]:
    t.train_step(2)  # warm-up: lazy optimizer state
    counts = []
    for _ in range(steps):
        with HostReads() as mode:
            t.train_step(2)
        counts.append(len(mode.ops))
    return counts


def test_a_step_reads_nothing_back_with_device_side_skips(tmp_path):
    t = trainer(tmp_path, torch.device("cpu"))
    assert t.device_skip  # one process, fused AdamW (the default on CPU and CUDA), on_nonfinite=skip
    assert reads_per_step(t) == [0, 0, 0]


def test_host_decided_steps_read_one_flag_each(tmp_path):
    for action in ("raise", "rollback"):
        t = trainer(tmp_path, torch.device("cpu"), on_nonfinite=action)
        assert not t.device_skip and reads_per_step(t) == [1, 1, 1], action
    # an optimizer without a device-side skip (here AdamW's foreach loop) needs the host's decision too
    assert not trainer(tmp_path, torch.device("cpu"), optim={"type": "adamw", "fused": False}).device_skip


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_no_synchronisation_inside_a_cuda_step(tmp_path):
    t = trainer(tmp_path, torch.device("cuda"))
    assert t.device_skip
    t.train_step(2)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any synchronising call raises
    try:
        for _ in range(3):
            t.train_step(2)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()


def test_the_wait_at_a_metrics_line_counts_as_training_time(tmp_path, monkeypatch):
    """On an asynchronous device a step's clock stops before the device has run its backward and update;
    the host waits for them when a metrics line reads the losses back. That wait is training time: the
    line's tokens/s and the run's throughput include it (here a read made to take 0.5 s)."""
    import json
    import time

    def slow_read(self, values):
        time.sleep(0.5)
        return torch.stack(values).double().tolist()

    monkeypatch.setattr(Trainer, "_read_back", slow_read)
    t = trainer(tmp_path, torch.device("cpu"), budget={"steps": 3}, log_every=1)
    summary = t.fit()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in lines if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3]
    assert all(r["tokens_per_second"] <= 64 / 0.5 for r in train)  # 64 tokens a step, each line waited 0.5 s
    assert summary["tokens_per_second"] <= 2 * 64 / (2 * 0.5)  # steps 2 and 3 (the first holds compilation)
