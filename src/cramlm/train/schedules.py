"""Learning-rate schedules as functions of run progress t in [0, 1] (budget used, or step/total).

Each builder returns ``f(t) -> factor`` applied to the optimizer's peak lr."""

from __future__ import annotations

import math
from typing import Callable, ClassVar, Literal

from cramlm.config.base import ComponentConfig
from cramlm.config.registry import register

Schedule = Callable[[float], float]


class ScheduleConfig(ComponentConfig):
    kind: ClassVar[str] = "schedule"


class BudgetTriangleConfig(ScheduleConfig):
    """cramming's budget-triangle2: min(base + t, (1 - t) / falloff); peak at t = 1 - falloff."""

    type: Literal["budget-triangle2"] = "budget-triangle2"
    base: float = 0.25
    falloff: float = 0.25


@register("schedule", "budget-triangle2", BudgetTriangleConfig)
def budget_triangle(cfg: BudgetTriangleConfig) -> Schedule:
    return lambda t: max(0.0, min(cfg.base + t, (1.0 - t) / cfg.falloff, 1.0))


class ConstantConfig(ScheduleConfig):
    type: Literal["constant"] = "constant"


@register("schedule", "constant", ConstantConfig)
def constant(cfg: ConstantConfig) -> Schedule:
    return lambda t: 1.0


class CosineConfig(ScheduleConfig):
    """Linear warm-up over ``warmup`` of the run, then cosine decay to ``min_factor``."""

    type: Literal["cosine"] = "cosine"
    warmup: float = 0.1
    min_factor: float = 0.0


@register("schedule", "cosine", CosineConfig)
def cosine(cfg: CosineConfig) -> Schedule:
    def f(t: float) -> float:
        if t < cfg.warmup:
            return t / cfg.warmup
        progress = min(1.0, (t - cfg.warmup) / max(1e-12, 1.0 - cfg.warmup))
        return cfg.min_factor + (1 - cfg.min_factor) * 0.5 * (1 + math.cos(math.pi * progress))

    return f


def build_schedule(cfg: ScheduleConfig) -> Schedule:
    from cramlm.config.registry import build

    return build("schedule", cfg)
