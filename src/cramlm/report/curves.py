"""The planned learning rate and batch size of a run over its budget, computed from the run's
resolved config with the functions training uses (``train.schedules`` and the trainer's
``BatchPlan``), on a dense grid of t. Plotting these instead of joining the few logged points keeps
a schedule's shape (budget-triangle2 peaks at t = 0.75, not at the nearest logged step)."""

from __future__ import annotations

from typing import Any

import numpy as np

GRID = np.linspace(0.0, 1.0, 1001)  # t in steps of 0.001: every breakpoint at a multiple of it is on the grid


def lr_curve(config: dict[str, Any], grid: np.ndarray = GRID) -> tuple[np.ndarray, np.ndarray] | None:
    """(t, learning rate) as the trainer sets it: ``train.optim.lr * schedule(t)``; None when the
    config does not describe a schedule this installation knows (an older or foreign run)."""
    import cramlm.train.schedules  # noqa: F401  (registers the built-in schedules; imports no torch)
    from cramlm.config.registry import build, config_class

    train = config.get("train") or {}
    spec, peak = train.get("schedule"), (train.get("optim") or {}).get("lr")
    if not isinstance(spec, dict) or not isinstance(peak, (int, float)):
        return None
    try:
        schedule = build("schedule", config_class("schedule", spec.get("type")).model_validate(spec))
    except ValueError:  # unknown type or fields (a plugin's schedule, a renamed field)
        return None
    return grid, np.array([peak * schedule(float(t)) for t in grid])


def batch_curve(config: dict[str, Any], world: int = 1, grid: np.ndarray = GRID) -> tuple[np.ndarray, np.ndarray] | None:
    """(t, sequences per optimizer step) of the batch ramp, from the trainer's ``BatchPlan``.

    The plan's other part, the cap that keeps ``train.min_updates`` steps in the remaining budget,
    depends on the throughput measured while training, so it is not part of this curve: the logged
    batch sizes show where it applied. None when the config cannot be read."""
    from cramlm.train.budget import BatchPlan  # torch-free, like the config
    from cramlm.train.config import TrainConfig

    train, impl = config.get("train") or {}, config.get("impl") or {}
    micro = impl.get("microbatch_size")
    if not isinstance(micro, int) or micro < 1:
        return None
    try:
        cfg = TrainConfig.model_validate(train).model_copy(update={"min_updates": 0})
        plan = BatchPlan(cfg, micro, max(1, int(world)), int((config.get("data") or {}).get("seq_length") or 1), budget=None)
    except ValueError:
        return None
    return grid, np.array([plan.microbatches(float(t), None, None) * micro for t in grid])
