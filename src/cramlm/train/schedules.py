"""Learning-rate schedules as functions of run progress t in [0, 1] (the fraction of the budget
used, whatever the budget is: hours, tokens, FLOPs or steps).

Each builder returns ``f(t) -> factor`` applied to the optimizer's peak lr. Because t is a fraction
of the budget, a schedule means the same at any budget and on any hardware."""

from __future__ import annotations

import math
from typing import Callable, ClassVar, Literal

from pydantic import Field, model_validator

from cramlm.config.base import ComponentConfig, NonNegativeFloat, PositiveFloat, UnitFloat
from cramlm.config.registry import register

Schedule = Callable[[float], float]


class ScheduleConfig(ComponentConfig):
    kind: ClassVar[str] = "schedule"
    type: str = Field(description="the lr schedule: budget-triangle2 (cramming), constant, cosine, one-cycle, "
                      "warmup-stable-decay, polynomial (bert-original), or a plugin's registered name")


def _clip(t: float) -> float:
    return min(1.0, max(0.0, t))


def _warmup_then(warmup: float, floor: float, decay: Callable[[float], float]) -> Schedule:
    """Linear warm-up over ``warmup`` of t, then ``floor + (1 - floor) * decay(p)`` with p going
    0 -> 1 over the rest of the run."""

    def f(t: float) -> float:
        t = _clip(t)
        if t < warmup:
            return t / warmup
        p = min(1.0, (t - warmup) / max(1e-12, 1.0 - warmup))
        return floor + (1 - floor) * decay(p)

    return f


class BudgetTriangleConfig(ScheduleConfig):
    """cramming's budget-triangle2: min(base + t, (1 - t) / falloff); peak at t = 1 - falloff."""

    type: Literal["budget-triangle2"] = "budget-triangle2"
    base: NonNegativeFloat = Field(0.25, description="lr factor at t=0; the rise is base + t (cramming: 0.25)")
    falloff: PositiveFloat = Field(
        0.25, description="fraction of t over which the lr falls linearly from the peak to 0 at t=1 (cramming: 0.25)")


@register("schedule", "budget-triangle2", BudgetTriangleConfig)
def budget_triangle(cfg: BudgetTriangleConfig) -> Schedule:
    return lambda t: max(0.0, min(cfg.base + _clip(t), (1.0 - _clip(t)) / cfg.falloff, 1.0))


class ConstantConfig(ScheduleConfig):
    type: Literal["constant"] = "constant"
    warmup: UnitFloat = Field(0.0, description="linear warm-up from 0 over this fraction of t, then the peak lr (0: none)")


@register("schedule", "constant", ConstantConfig)
def constant(cfg: ConstantConfig) -> Schedule:
    return lambda t: min(1.0, _clip(t) / cfg.warmup) if cfg.warmup > 0 else 1.0


class CosineConfig(ScheduleConfig):
    """Linear warm-up over ``warmup`` of the run, then cosine decay to ``min_factor``."""

    type: Literal["cosine"] = "cosine"
    warmup: UnitFloat = Field(0.1, description="linear warm-up from 0 to the peak lr over this fraction of t")
    min_factor: UnitFloat = Field(0.0, description="lr factor the cosine decays to at t=1 (0.1: a tenth of the peak)")


@register("schedule", "cosine", CosineConfig)
def cosine(cfg: CosineConfig) -> Schedule:
    return _warmup_then(cfg.warmup, cfg.min_factor, lambda p: 0.5 * (1 + math.cos(math.pi * p)))


class OneCycleConfig(ScheduleConfig):
    """Smith's one-cycle (as torch's OneCycleLR, cosine annealing): from ``start_factor`` up to 1 at
    ``peak``, then down to ``end_factor``."""

    type: Literal["one-cycle"] = "one-cycle"
    peak: UnitFloat = Field(0.3, description="fraction of t at which the lr reaches its peak (torch: pct_start)")
    start_factor: UnitFloat = Field(0.04, description="lr factor at t=0 (torch: 1 / div_factor, 1/25)")
    end_factor: UnitFloat = Field(4e-6, description="lr factor at t=1 (torch: start_factor / final_div_factor, 1e4)")


@register("schedule", "one-cycle", OneCycleConfig)
def one_cycle(cfg: OneCycleConfig) -> Schedule:
    def anneal(start: float, end: float, p: float) -> float:
        return end + (start - end) * 0.5 * (1 + math.cos(math.pi * p))

    def f(t: float) -> float:
        t = _clip(t)
        if t < cfg.peak:
            return anneal(cfg.start_factor, 1.0, t / cfg.peak)
        return anneal(1.0, cfg.end_factor, (t - cfg.peak) / max(1e-12, 1.0 - cfg.peak))

    return f


class WarmupStableDecayConfig(ScheduleConfig):
    """Warm-up, a long stable phase at the peak, then a decay over the last ``decay`` of the run
    (WSD / trapezoid; MiniCPM, modded-nanogpt)."""

    type: Literal["warmup-stable-decay"] = "warmup-stable-decay"
    warmup: UnitFloat = Field(0.05, description="linear warm-up from 0 to the peak lr over this fraction of t")
    decay: UnitFloat = Field(0.2, description="fraction of t, at the end, over which the lr decays (warmup + decay <= 1)")
    decay_shape: Literal["linear", "cosine", "sqrt"] = Field(
        "linear", description="shape of the final decay: linear, half-cosine, or 1 - sqrt(p)")
    min_factor: UnitFloat = Field(0.0, description="lr factor at the end of the decay (t=1)")

    @model_validator(mode="after")
    def _phases(self):
        if self.warmup + self.decay > 1:
            raise ValueError(f"warmup ({self.warmup}) + decay ({self.decay}) must not exceed 1 (fractions of the run)")
        return self


@register("schedule", "warmup-stable-decay", WarmupStableDecayConfig)
def warmup_stable_decay(cfg: WarmupStableDecayConfig) -> Schedule:
    def f(t: float) -> float:
        t = _clip(t)
        if t < cfg.warmup:
            return t / cfg.warmup
        if t <= 1.0 - cfg.decay:
            return 1.0
        p = (t - (1.0 - cfg.decay)) / cfg.decay  # 0 -> 1 through the decay phase
        left = {"linear": 1 - p, "cosine": 0.5 * (1 + math.cos(math.pi * p)), "sqrt": 1 - math.sqrt(p)}[cfg.decay_shape]
        return cfg.min_factor + (1 - cfg.min_factor) * left

    return f


class PolynomialConfig(ScheduleConfig):
    """bert-original: linear warm-up, then (1 - progress)^power decay to ``end_factor``
    (BERT: 10k warm-up steps of 1M, power 1)."""

    type: Literal["polynomial"] = "polynomial"
    warmup: UnitFloat = Field(0.01, description="linear warm-up from 0 to the peak lr over this fraction of t (BERT: 1%)")
    power: NonNegativeFloat = Field(1.0, description="exponent of the decay (1 - p)^power; 1: linear (BERT)")
    end_factor: UnitFloat = Field(0.0, description="lr factor the decay ends at (t=1)")


@register("schedule", "polynomial", PolynomialConfig)
def polynomial(cfg: PolynomialConfig) -> Schedule:
    return _warmup_then(cfg.warmup, cfg.end_factor, lambda p: (1 - p) ** cfg.power)


def build_schedule(cfg: ScheduleConfig) -> Schedule:
    from cramlm.config.registry import build

    return build("schedule", cfg)
