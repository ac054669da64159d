"""The training loop. It never knows which model it trains: it calls ``model(**batch)["loss"]``.

Progress ``t`` is the fraction of the wall-clock budget used; the clock starts after set-up (data
preparation and model construction do not count, as in cramming). The lr schedule and the batch
ramp are functions of ``t``. The budget is checked after every micro-step; a partially accumulated
step at the deadline is dropped, and the caller writes the final checkpoint.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import torch
from tqdm import tqdm

from cramlm.config.base import Config, component
from cramlm.train.optim import AdamWConfig, OptimizerConfig, build_optimizer
from cramlm.train.runtime import ImplConfig, autocast, autocast_dtype
from cramlm.train.schedules import BudgetTriangleConfig, ScheduleConfig, build_schedule


class TrainConfig(Config):
    optim: component(OptimizerConfig) = AdamWConfig()
    schedule: component(ScheduleConfig) = BudgetTriangleConfig()
    batch_size: int = 8192  # sequences per optimizer step (a multiple of impl.microbatch_size)
    batch_ramp: float = 0.6  # grow the batch from one microbatch to batch_size over this fraction of t (0: off)
    grad_clip: float | None = 0.5
    mlm_probability: float = 0.25
    log_every: int = 10  # optimizer steps between metric lines


@dataclass
class TrainResult:
    steps: int = 0
    microsteps: int = 0
    tokens: int = 0
    seconds: float = 0.0
    losses: list[float] = field(default_factory=list)  # one mean loss per logged window

    def summary(self) -> dict:
        return {
            "steps": self.steps,
            "microsteps": self.microsteps,
            "tokens": self.tokens,
            "train_seconds": round(self.seconds, 3),
            "tokens_per_second": round(self.tokens / max(self.seconds, 1e-9), 1),
            "first_loss": self.losses[0] if self.losses else None,
            "last_loss": self.losses[-1] if self.losses else None,
        }


def accumulation_steps(cfg: TrainConfig, microbatch: int, t: float) -> int:
    """Microbatches in the step taken at progress t (the batch ramp)."""
    full = cfg.batch_size // microbatch
    if cfg.batch_ramp <= 0:
        return full
    return max(1, min(full, math.ceil(full * t / cfg.batch_ramp)))


def check_batch(cfg: TrainConfig, impl: ImplConfig) -> None:
    if cfg.batch_size % impl.microbatch_size:
        raise ValueError(
            f"train.batch_size={cfg.batch_size} must be a multiple of impl.microbatch_size={impl.microbatch_size}"
        )


def train(
    model: torch.nn.Module,
    batches: Iterator[dict[str, torch.Tensor]],
    cfg: TrainConfig,
    impl: ImplConfig,
    device: torch.device,
    budget_seconds: float,
    metrics_path: Path,
    max_steps: int | None = None,
    on_step: Callable[[int], None] | None = None,
) -> TrainResult:
    check_batch(cfg, impl)
    model.train()
    optimizer = build_optimizer(cfg.optim, model)
    schedule = build_schedule(cfg.schedule)
    amp = autocast_dtype(impl, device)
    scaler = torch.amp.GradScaler(device.type, enabled=amp is torch.float16)
    result = TrainResult()
    window_loss, window_micro, window_tokens, window_start = 0.0, 0, 0, time.perf_counter()
    bar = tqdm(total=100, unit="%", disable=not impl.progress, dynamic_ncols=True,
               bar_format="{l_bar}{bar}| {n:.0f}/100% of budget [{elapsed}<{remaining}{postfix}]")
    log = open(metrics_path, "a", encoding="utf-8")
    start = time.perf_counter()
    elapsed = 0.0
    done = False
    while not done:
        t = elapsed / budget_seconds
        lr = cfg.optim.lr * schedule(t)
        for group in optimizer.param_groups:
            group["lr"] = lr
        n_micro = accumulation_steps(cfg, impl.microbatch_size, t)
        step_loss, step_tokens = 0.0, 0
        for _ in range(n_micro):
            batch = {k: v.to(device, non_blocking=True) for k, v in next(batches).items()}
            with autocast(device, amp):
                loss = model(**batch)["loss"]
            scaler.scale(loss / n_micro).backward()
            step_loss += loss.item() / n_micro
            step_tokens += batch["input_ids"].numel()
            result.microsteps += 1
            elapsed = time.perf_counter() - start
            if elapsed >= budget_seconds:
                done = True
                break
        if done and result.steps > 0:
            optimizer.zero_grad(set_to_none=True)  # drop the partial step at the deadline
            if window_micro:  # log the last (short) window so the summary's last loss is current
                result.losses.append(round(window_loss / window_micro, 5))
                log.write(json.dumps({"step": result.steps, "t": 1.0, "elapsed": round(elapsed, 3),
                                      "tokens": result.tokens, "loss": result.losses[-1], "lr": lr}) + "\n")
            break
        # (a run whose budget ends inside its very first step still takes that step)
        if cfg.grad_clip:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        result.steps += 1
        result.tokens += step_tokens
        window_loss += step_loss
        window_micro += 1
        window_tokens += step_tokens
        elapsed = time.perf_counter() - start
        if max_steps is not None and result.steps >= max_steps:
            done = True
        if result.steps % cfg.log_every == 0 or done or result.steps == 1:
            now = time.perf_counter()
            mean_loss = window_loss / window_micro
            speed = window_tokens / max(now - window_start, 1e-9)
            result.losses.append(round(mean_loss, 5))
            record = {
                "step": result.steps, "t": round(elapsed / budget_seconds, 5), "elapsed": round(elapsed, 3),
                "tokens": result.tokens, "loss": round(mean_loss, 5), "lr": lr,
                "batch_size": n_micro * impl.microbatch_size, "tokens_per_second": round(speed, 1),
            }
            log.write(json.dumps(record) + "\n")
            log.flush()
            bar.n = min(100.0, 100 * elapsed / budget_seconds)
            bar.set_postfix(step=result.steps, loss=f"{mean_loss:.3f}", tok_s=f"{speed:,.0f}")
            window_loss, window_micro, window_tokens, window_start = 0.0, 0, 0, now
        if on_step:
            on_step(result.steps)
    result.seconds = time.perf_counter() - start
    bar.n = min(100.0, 100 * result.seconds / budget_seconds)
    bar.close()
    log.close()
    return result
