"""Budgets: how much a run may spend, and the run's progress t in [0, 1] through it.

A run has up to four budgets: wall-clock hours (the root key ``budget``, as in cramming:
``budget=24``) and, in ``train.budget``, tokens, FLOPs and optimizer steps. ``t`` is the largest
fraction used of any budget that is set, so the run ends when the first one is spent; the lr
schedule and the batch ramp are functions of ``t``. Token, FLOP and step budgets mean the same on
any hardware (and make a resumed run bitwise reproducible); set ``budget=null`` to drop the clock.

What the clock counts: it starts after set-up (data preparation, model construction, checkpoint
loading: not counted, as in cramming); compilation happens in the first steps and counts unless
``count_compile=false``; held-out validation does not count unless ``count_eval=true``. All of
them are recorded separately in summary.json.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from cramlm.config.base import Config


class BudgetConfig(Config):
    tokens: float | None = None  # input tokens trained on, all processes together
    flops: float | None = None  # training FLOPs = tokens * the model's FLOPs per token
    steps: int | None = None  # optimizer steps
    count_compile: bool = True  # the first step (where torch.compile and warm-up happen) counts against the hours
    count_eval: bool = False  # held-out validation time counts against the hours


@dataclass
class Usage:
    """What a run has spent so far (saved in checkpoints)."""

    steps: int = 0
    tokens: int = 0
    flops: float = 0.0
    seconds: float = 0.0  # wall-clock seconds that count against the hours budget

    def state_dict(self) -> dict:
        return asdict(self)


class Budget:
    def __init__(self, cfg: BudgetConfig, hours: float | None, flops_per_token: float):
        self.cfg = cfg
        self.flops_per_token = flops_per_token
        self.limits = {
            "seconds": hours * 3600 if hours else None,
            "tokens": cfg.tokens,
            "flops": cfg.flops,
            "steps": cfg.steps,
        }
        self.limits = {k: float(v) for k, v in self.limits.items() if v is not None}
        if not self.limits:
            raise ValueError("no budget: set budget (hours) or one of train.budget.tokens/flops/steps")
        for key, value in self.limits.items():
            if value <= 0:
                raise ValueError(f"budget {key} must be positive, got {value}")

    @property
    def deterministic(self) -> bool:
        """True when t does not depend on the clock (resumed runs are then bitwise reproducible)."""
        return "seconds" not in self.limits

    def progress(self, used: Usage) -> float:
        """t = the largest fraction used of any budget (may exceed 1 on the last step)."""
        return max(getattr(used, key) / limit for key, limit in self.limits.items())

    def remaining_tokens(self, used: Usage, tokens_per_second: float | None) -> float | None:
        """Tokens the rest of the run may train on, where the budget determines it (the hours need a
        measured throughput). None when only a step budget is set."""
        left = []
        if "tokens" in self.limits:
            left.append(self.limits["tokens"] - used.tokens)
        if "flops" in self.limits:
            left.append((self.limits["flops"] - used.flops) / self.flops_per_token)
        if "seconds" in self.limits and tokens_per_second:
            left.append((self.limits["seconds"] - used.seconds) * tokens_per_second)
        return max(0.0, min(left)) if left else None

    def describe(self) -> str:
        units = {"seconds": "s", "tokens": " tokens", "flops": " FLOPs", "steps": " steps"}
        return " or ".join(f"{v:.4g}{units[k]}" for k, v in self.limits.items())
