"""A Trainer, assembled in one place (torchtitan's ``config.build()``): what every caller of the
training loop used to write out itself (``cramlm pretrain``, the planner's throughput probe,
benchmarks/train_step.py, the tests).

    precision   impl.precision resolved once for this device and model (auto: measured, cached)
    costs       FLOPs per token (on the plain model), the optimizer's per step, the device's peak (MFU)
    parallel    activation checkpointing, DDP/FSDP2, torch.compile (parallelize.py)
    optimizer   train.optim on the wrapped module (optim.py)
    meter       the budget (train.budget + the clock: hours and what counts against them)
    Trainer     schedule, batch plan, checkpoints (trainer.py)
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from cramlm.train.budget import Budget, Clock, Meter, measure_costs
from cramlm.train.config import TrainConfig
from cramlm.train.distributed import Dist
from cramlm.train.impl import ImplConfig, resolve_precision
from cramlm.train.optim import build_optimizer, optimizer_flops_per_step, resolve_optimizer
from cramlm.train.parallelize import parallelize
from cramlm.train.batches import StepData
from cramlm.train.trainer import Trainer


def build_trainer(model: torch.nn.Module, data: StepData, train: TrainConfig, impl: ImplConfig, run_dir: str | Path, *,
                  dist: Dist | None = None, clock: Clock = Clock(), heldout=None, sample: dict | None = None,
                  record: dict | None = None, device: torch.device | None = None) -> Trainer:
    """A Trainer for ``model`` (plain, on ``device``, default the one it is on; under FSDP2 it may
    still be on the host: sharding moves it block by block) on ``data`` under ``train``'s budget
    and ``clock``. ``heldout``: what val_loss scores (data/heldout.py's HeldOut; None: no validation);
    ``sample``: a batch at training's masking rate that the FLOPs are counted on when the model has
    no count of its own; ``record``: what the run is (``{"config": ..., "data": ...}``): the config
    heads metrics.jsonl and the whole record goes into every checkpoint's state.json."""
    dist = dist or Dist()
    device = torch.device(device) if device is not None else next(model.parameters()).device
    precision = resolve_precision(impl, device, model)  # MFU against the peak of the precision in use
    costs = measure_costs(model, data.seq_len, sample, device, precision.dtype)  # on the plain model
    parallel = parallelize(model, impl, dist, device)
    # on the wrapped module (FSDP2: its shards); Muon's ns_dtype=auto follows the precision
    optimizer = build_optimizer(resolve_optimizer(train.optim, precision.precision), parallel.module)
    costs = replace(costs, optimizer_flops_per_step=optimizer_flops_per_step(optimizer))  # Muon's Newton-Schulz
    meter = Meter(Budget(train.budget, clock.hours, costs.flops_per_token), costs, dist.world, clock)
    return Trainer(parallel, optimizer, data, train, impl, meter, run_dir, precision, heldout=heldout, record=record)


def dryrun_config(train: TrainConfig, impl: ImplConfig, world: int) -> TrainConfig:
    """dryrun=true: impl.dryrun_steps steps of one microbatch per process, validated once at the
    end, under a step budget instead of the clock (a dry run shows that everything runs; it takes
    seconds, whatever the budget)."""
    steps_only = train.budget.model_copy(update={"tokens": None, "flops": None, "steps": impl.dryrun_steps})
    return train.model_copy(update={
        "budget": steps_only, "batch_size": impl.microbatch_size * world, "batch_ramp": 0.0, "min_updates": 0,
        "validate_every": 0.0, "checkpoint_every": 0, "checkpoint_minutes": None,
    })
