"""Budgets: how much a run may spend, and the run's progress t in [0, 1] through it.

A run has up to four budgets: wall-clock hours (the root key ``budget``, as in cramming:
``budget=24``, with the root keys ``count_compile`` and ``count_eval`` saying what counts against
them) and, in ``train.budget``, tokens, FLOPs and optimizer steps. ``t`` is the largest
fraction used of any budget that is set, so the run ends when the first one is spent; the lr
schedule and the batch ramp are functions of ``t``. Token, FLOP and step budgets mean the same on
any hardware (and make a resumed run bitwise reproducible); set ``budget=null`` to drop the clock.

What the clock counts: it starts after set-up (data preparation, model construction, checkpoint
loading: not counted, as in cramming); compilation happens in the first steps and counts unless
``count_compile=false``; held-out validation does not count unless ``count_eval=true``. All of
them are recorded separately in summary.json. ``Meter`` keeps that clock and the run's usage;
``BatchPlan`` turns t into the number of microbatches of the next step.
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace

from pydantic import Field, PositiveFloat, PositiveInt

from cramlm.config.base import RESUME_GROW, Config


class BudgetConfig(Config):
    """The budgets that mean the same on any hardware (``train.budget``). The hours and what counts
    against them are root keys: ``budget``, ``count_compile``, ``count_eval`` (run/config.py)."""

    tokens: PositiveFloat | None = Field(
        None, description="input tokens to train on, all processes together (2e9 or 2.0e+9); null: no token budget", json_schema_extra=RESUME_GROW)
    flops: PositiveFloat | None = Field(
        None, description="training FLOPs, counted as tokens x the model's forward+backward FLOPs per token, plus "
        "steps x the optimizer's own FLOPs per step (Muon's Newton-Schulz); null: none", json_schema_extra=RESUME_GROW)
    steps: PositiveInt | None = Field(None, description="optimizer steps; null: no step budget", json_schema_extra=RESUME_GROW)


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
            if value <= 0:  # the config refuses these already; a Budget built in code says the same
                path = "budget (hours)" if key == "seconds" else f"train.budget.{key}"
                shown = value / 3600 if key == "seconds" else value
                raise ValueError(f"{path} must be positive, got {int(shown) if float(shown).is_integer() else shown:g}")

    def progress(self, used: Usage) -> float:
        """t = the largest fraction used of any budget (may exceed 1 on the last step)."""
        return max(getattr(used, key) / limit for key, limit in self.limits.items())

    def remaining_tokens(self, used: Usage, tokens_per_second: float | None, steps: int = 1,
                         optimizer_flops_per_step: float = 0.0) -> float | None:
        """Tokens the rest of the run may train on, where the budget determines it (the hours need a
        measured throughput), in ``steps`` more optimizer steps (a FLOP budget pays each step's
        ``optimizer_flops_per_step`` too). None when only a step budget is set."""
        left = []
        if "tokens" in self.limits:
            left.append(self.limits["tokens"] - used.tokens)
        if "flops" in self.limits:
            left.append((self.limits["flops"] - used.flops - steps * optimizer_flops_per_step) / self.flops_per_token)
        if "seconds" in self.limits and tokens_per_second:
            left.append((self.limits["seconds"] - used.seconds) * tokens_per_second)
        return max(0.0, min(left)) if left else None

    def describe(self) -> str:
        units = {"seconds": "s", "tokens": " tokens", "flops": " FLOPs", "steps": " steps"}
        return " or ".join(f"{v:.4g}{units[k]}" for k, v in self.limits.items())


class BatchPlan:
    """Microbatches (global) per optimizer step as a function of t: the ramp, then a cap that
    keeps at least ``min_updates`` steps in the remaining budget, rounded to the process count.
    ``cfg`` is the ``train`` group (batch_size, max_batch_size, batch_ramp, min_updates).

    The ramp and the cap count in the microbatches and processes the run started with (``units``:
    (microbatch size, processes); default this run's): a run resumed with another microbatch size or
    process count that divides them takes the same batch at every step (``microbatches`` converts),
    so it is the same run (train/checkpoint.py ``check_batch_plan`` refuses one that cannot)."""

    def __init__(self, cfg, micro: int, world: int, seq_len: int, budget: Budget, optimizer_flops_per_step: float = 0.0,
                 units: tuple[int, int] | None = None):
        cfg.check_microbatches(micro, world)
        self.cfg, self.seq_len, self.budget = cfg, seq_len, budget
        self.here = (micro, world)  # the microbatches this process trains
        self.micro, self.world = units or self.here  # the microbatches the plan counts in
        self.full = cfg.full_batch() // self.micro
        self.optimizer_flops_per_step = optimizer_flops_per_step  # Muon's Newton-Schulz; 0 for AdamW

    @property
    def units(self) -> tuple[int, int]:
        return self.micro, self.world

    def microbatches(self, t: float, used: Usage, tokens_per_second: float | None) -> int:
        """This step's microbatches of this run's size, over all processes."""
        n = self.planned(t, used, tokens_per_second)
        return n * self.micro // self.here[0]

    def planned(self, t: float, used: Usage, tokens_per_second: float | None) -> int:
        """This step's microbatches in the plan's units (``units``)."""
        n = self.full
        if self.cfg.batch_ramp > 0:
            n = max(1, min(n, math.ceil(self.full * t / self.cfg.batch_ramp)))
        if self.cfg.min_updates > 0:
            if "seconds" in self.budget.limits and not tokens_per_second:
                n = 1  # probe: the throughput, hence the tokens the clock allows, is not measured yet
            else:
                updates_left = max(1, self.cfg.min_updates - used.steps)
                left = self.budget.remaining_tokens(used, tokens_per_second, updates_left, self.optimizer_flops_per_step)
                if left is not None:
                    n = min(n, max(1, int(left // (updates_left * self.micro * self.seq_len))))
        return math.ceil(n / self.world) * self.world


def planned_tokens(train, micro: int, seq_len: int, world: int = 1, flops_per_token: float = 1.0,
                   hours: float | None = None, max_steps: int = 1_000_000) -> int | None:
    """The tokens a run trains on under a token, FLOP or step budget: the batch plan stepped until
    the budget is spent, as the Trainer does (at least one step of at least one microbatch, so a
    budget below that trains that much). ``train`` is the ``train`` group; None under a wall-clock
    budget (its tokens depend on the machine) or past ``max_steps``."""
    if hours or not any(v is not None for v in (train.budget.tokens, train.budget.flops, train.budget.steps)):
        return None
    budget = Budget(train.budget, None, flops_per_token)
    plan = BatchPlan(train, micro, world, seq_len, budget)
    used = Usage()
    while budget.progress(used) < 1.0:
        if used.steps >= max_steps:
            return None
        used.tokens += plan.microbatches(budget.progress(used), used, None) * micro * seq_len
        used.flops = used.tokens * flops_per_token
        used.steps += 1
    return used.tokens


@dataclass
class Costs:
    """What a token costs and what the hardware can do: the FLOP and peak figures of MFU."""

    flops_per_token: float
    flops_source: str
    peak: float | None  # FLOP/s of one process's device
    peak_source: str
    # matmul FLOPs of one optimizer step (Muon's Newton-Schulz; 0 for AdamW), the algorithm's count,
    # once per step (DDP repeats it on every process; like recomputation, such repeats are left out)
    optimizer_flops_per_step: float = 0.0


@dataclass(frozen=True)
class Clock:
    """The wall clock a run is held to and what counts against it: ``hours`` (the root key ``budget``;
    None: no clock), ``count_compile`` and ``count_eval`` (the root keys of the same names), and
    ``step_limit``: stop after that many steps whatever the budget (dry runs; None: no limit)."""

    hours: float | None = None
    count_compile: bool = True
    count_eval: bool = False
    step_limit: int | None = None


def measure_costs(model, seq_len: int, sample: dict | None, device, dtype=None) -> Costs:
    """FLOPs per token (the model's own count, else counted on ``sample``) and the device's peak for
    the precision in use (``dtype``: the autocast dtype, None: fp32; a table on GPU, a short GEMM
    probe on CPU). Run on the plain model, before it is wrapped; the optimizer's own FLOPs are
    added once it is built (build.py)."""
    from cramlm.train.flops import flops_per_token, peak_flops

    if sample is not None:  # a small slice: its labels also give the scored fraction of MLM positions
        at = next(model.parameters()).device  # where the model is now (the host, before FSDP2 moves it;
        sample = {k: v[:8] if at.type == "meta" else v[:8].to(at) for k, v in sample.items()}  # meta: FSDP2's rank > 0)
    flops, flops_source = flops_per_token(model, seq_len, sample)
    peak, peak_source = peak_flops(device, dtype)
    return Costs(flops, flops_source, peak, peak_source)


class Meter:
    """What the run has spent, as the budget counts it, and how fast it goes.

    The clock starts with ``start()`` (after set-up) and leaves out what the budget does not count:
    the first step (compilation, warm-up) unless ``clock.count_compile``, validation unless ``clock.count_eval``
    (``timed``). Each step, every process reads its clock (``reading``), the slowest reading is
    adopted everywhere (the caller reduces it with the step's other flags) and ``record`` books the
    step, so t, the lr and the stop decision agree on every process. The throughput is measured
    from the second step on (the first one includes compilation)."""

    def __init__(self, budget: Budget, costs: Costs, world: int = 1, clock: Clock = Clock()):
        self.budget, self.costs, self.world, self.step_limit = budget, costs, world, clock.step_limit
        self.count = {"compile": clock.count_compile, "eval": clock.count_eval}
        self.used = Usage()
        self.times = {"first_step_seconds": 0.0, "eval_seconds": 0.0, "checkpoint_seconds": 0.0}
        self.rate_tokens, self.rate_seconds, self.rate_steps = 0, 0.0, 0
        self._clock: float | None = None
        self._base = self._excluded = 0.0
        self._first = True
        self._origin: tuple[int, float] | None = None  # (tokens, seconds) booked after the first step
        self.booked_rate: float | None = None  # FLOPs per token the resumed checkpoint recorded

    def start(self) -> None:
        self._clock, self._base, self._excluded, self._first = time.perf_counter(), self.used.seconds, 0.0, True
        self._origin = None

    @property
    def t(self) -> float:
        return self.budget.progress(self.used)

    @property
    def done(self) -> bool:
        return self.t >= 1.0 or (self.step_limit is not None and self.used.steps >= self.step_limit)

    def reading(self, step_seconds: float) -> float:
        """This process's counted seconds since ``start``, for a step that has run ``step_seconds``."""
        if self._clock is None:
            self.start()
        if self._first:
            self.times["first_step_seconds"] += step_seconds
            if not self.count["compile"]:
                self._excluded += step_seconds
        return time.perf_counter() - self._clock - self._excluded

    def record(self, tokens: int, step_seconds: float, agreed_seconds: float) -> None:
        """Book one optimizer step: its tokens (all processes), its duration here, the agreed clock."""
        if not self._first:
            self.rate_tokens += tokens
            self.rate_seconds += step_seconds
            self.rate_steps += 1
        used = self.used
        used.seconds = self._base + agreed_seconds
        used.steps += 1
        used.tokens += tokens
        used.flops = used.tokens * self.costs.flops_per_token + used.steps * self.costs.optimizer_flops_per_step
        if self._first:
            self._origin = (used.tokens, used.seconds)
        self._first = False

    def waited(self, seconds: float) -> None:
        """Book the host's wait for the device at a metrics line into the throughput (the budget's
        clock is wall time and holds it already); not after the first step alone, which the rate leaves out."""
        if self.rate_steps:
            self.rate_seconds += seconds

    @contextmanager
    def timed(self, key: str, counts: bool = True):
        """Time a pause of training (``eval`` or ``checkpoint``); left off the clock unless it counts."""
        start = time.perf_counter()
        try:
            yield
        finally:
            seconds = time.perf_counter() - start
            self.times[f"{key}_seconds"] += seconds
            if not counts:
                self._excluded += seconds

    @property
    def tokens_per_second(self) -> float | None:
        return self.rate_tokens / self.rate_seconds if self.rate_seconds > 0 else None

    @property
    def agreed_tokens_per_second(self) -> float | None:
        """Tokens per counted second since the first step, by the agreed clock: the same on every
        process, so the batch plan, which reads it, sizes every process's step alike (each process's
        own ``tokens_per_second`` differs a little, and microbatch counts that differ would hang the
        step's collectives)."""
        if self._origin is None:
            return None
        tokens, seconds = self.used.tokens - self._origin[0], self.used.seconds - self._origin[1]
        return tokens / seconds if tokens > 0 and seconds > 0 else None

    @property
    def steps_per_second(self) -> float | None:
        return self.rate_steps / self.rate_seconds if self.rate_seconds > 0 else None

    def mfu(self, tokens_per_second: float | None, steps_per_second: float | None = None) -> float | None:
        """Model (and optimizer) FLOPs per second over the peak of all processes."""
        if not tokens_per_second or not self.costs.peak:
            return None
        flops = tokens_per_second * self.costs.flops_per_token + (steps_per_second or 0.0) * self.costs.optimizer_flops_per_step
        return flops / (self.costs.peak * self.world)

    def state_dict(self) -> dict:
        return {"usage": self.used.state_dict(), "times": dict(self.times), "flops_per_token": self.costs.flops_per_token}

    def load_state_dict(self, state: dict) -> None:
        self.used = Usage(**state["usage"])
        self.times.update(state["times"])
        self.booked_rate = state.get("flops_per_token")  # absent: worked out from usage (keep_booked_costs)

    def keep_booked_costs(self) -> tuple[float, float] | None:
        """A resumed run goes on at the FLOPs per token its steps were booked at (``used.flops`` =
        tokens x flops_per_token + steps x the optimizer's FLOPs) where this cramlm counts the model
        otherwise (another FLOPs formula, another sample's share of predicted positions): t, the lr and
        the last step stay the run's. (counted now, kept) when they differ, else None."""
        used, costs = self.used, self.costs
        if not used.tokens:
            return None
        kept = self.booked_rate or (used.flops - used.steps * costs.optimizer_flops_per_step) / used.tokens
        if abs(kept - costs.flops_per_token) <= 1e-9 * costs.flops_per_token:  # the same count, up to rounding
            return None
        self.costs = replace(costs, flops_per_token=kept, flops_source=f"{costs.flops_source}, as the run booked it")
        self.budget.flops_per_token = kept
        return costs.flops_per_token, kept
