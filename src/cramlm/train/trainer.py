"""The training loop. It never knows which model it trains: it calls ``model(**batch)["loss"]``.

One optimizer step, on any number of processes:

1. progress ``t`` (budget.py) gives the lr (schedules.py) and the number of microbatches (the batch
   ramp, capped so the budget allows ``min_updates`` steps);
2. every process draws the same *global* batch from the shuffled stream (same masking RNG) and
   runs its own contiguous slice of microbatches, accumulating gradients without communication
   until the last one; the result is the same as one process running all microbatches;
3. loss, a non-finite flag and the elapsed time are reduced over processes, so every process takes
   the same decision (step, skip, roll back, validate, checkpoint, stop) at the same step.

The whole state (weights, optimizer, scaler, counters, data position, RNG) goes into checkpoints
(checkpoint.py); a run resumed from one continues bit for bit when its budget is not wall-clock.
"""

from __future__ import annotations

import math
import random
import time
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from tqdm import tqdm

from cramlm.config.base import Config, component
from cramlm.data.dataset import ShuffledStream
from cramlm.progress import progress_bar
from cramlm.train import checkpoint as ckpt
from cramlm.train.budget import Budget, BudgetConfig, Usage
from cramlm.train.distributed import Dist, all_reduce, barrier, gradient_sync, sync_replicated_grads, wrap_model
from cramlm.train.monitor import MetricsLog, flops_per_token, peak_flops
from cramlm.train.optim import AdamWConfig, OptimizerConfig, build_optimizer
from cramlm.train.runtime import (
    ImplConfig,
    apply_activation_checkpointing,
    autocast,
    resolve_precision,
    compile_model,
)
from cramlm.train.schedules import BudgetTriangleConfig, ScheduleConfig, build_schedule


class TrainConfig(Config):
    optim: component(OptimizerConfig) = AdamWConfig()
    schedule: component(ScheduleConfig) = BudgetTriangleConfig()
    budget: BudgetConfig = BudgetConfig()  # tokens / FLOPs / steps (hours: the root key `budget`)
    batch_size: int | Literal["auto"] = 8192  # sequences per optimizer step, all processes together
    max_batch_size: int = 8192  # what batch_size=auto aims for (then capped by min_updates)
    batch_ramp: float = 0.6  # grow the batch from one microbatch to batch_size over this fraction of t (0: off)
    min_updates: int = 100  # cap the batch so the budget allows at least this many optimizer steps (0: off)
    grad_clip: float | None = 0.5
    mlm_probability: float = 0.25
    log_every: int = 10  # optimizer steps between metric lines
    validate_every: float = 0.25  # held-out loss every this fraction of t, and at the end (0: only at the end)
    validate_batches: int = 8  # microbatches of the validation set scored each time
    checkpoint_every: int = 0  # optimizer steps between checkpoints (0: by time only)
    checkpoint_minutes: float | None = 30.0  # wall-clock minutes between checkpoints (null: by steps only)
    keep_checkpoints: int = 2  # newest checkpoints kept; the final one is always written
    on_nonfinite: Literal["skip", "rollback", "raise"] = "skip"  # NaN/inf loss: drop the step, reload the last checkpoint, or stop
    max_nonfinite: int = 20  # consecutive non-finite steps before the run gives up


class StepData:
    """Global batches: ``take(n)`` returns the next n sequences, collated (masked), identical on
    every process. Its state is the stream position and the collator's generator."""

    def __init__(self, dataset, collate, seed: int):
        self.dataset = dataset
        self.collate = collate
        self.order = ShuffledStream(len(dataset), seed)

    def take(self, n: int) -> dict[str, torch.Tensor]:
        return self.collate(self.dataset.batch(self.order.take(n)))

    def state_dict(self) -> dict:
        collator = self.collate.state_dict() if hasattr(self.collate, "state_dict") else None
        return {"stream": self.order.state_dict(), "collator": collator}

    def load_state_dict(self, state: dict) -> None:
        self.order.load_state_dict(state["stream"])
        if state.get("collator") is not None:
            self.collate.load_state_dict(state["collator"])


class BatchPlan:
    """Microbatches (global) per optimizer step as a function of t: the ramp, then a cap that
    keeps at least ``min_updates`` steps in the remaining budget, rounded to the process count."""

    def __init__(self, cfg: TrainConfig, micro: int, world: int, seq_len: int, budget: Budget):
        size = cfg.max_batch_size if cfg.batch_size == "auto" else cfg.batch_size
        if size % (micro * world):
            raise ValueError(
                f"train.batch_size={size} must be a multiple of impl.microbatch_size={micro} x {world} processes"
            )
        self.cfg, self.micro, self.world, self.seq_len, self.budget = cfg, micro, world, seq_len, budget
        self.full = size // micro

    def microbatches(self, t: float, used: Usage, tokens_per_second: float | None) -> int:
        n = self.full
        if self.cfg.batch_ramp > 0:
            n = max(1, min(n, math.ceil(self.full * t / self.cfg.batch_ramp)))
        if self.cfg.min_updates > 0:
            if "seconds" in self.budget.limits and not tokens_per_second:
                n = 1  # probe: the throughput, hence the tokens the clock allows, is not measured yet
            else:
                left = self.budget.remaining_tokens(used, tokens_per_second)
                if left is not None:
                    updates_left = max(1, self.cfg.min_updates - used.steps)
                    n = min(n, max(1, int(left // (updates_left * self.micro * self.seq_len))))
        return math.ceil(n / self.world) * self.world


class Trainer:
    def __init__(
        self,
        model: torch.nn.Module,
        data: StepData,
        cfg: TrainConfig,
        impl: ImplConfig,
        dist: Dist,
        device: torch.device,
        budget_hours: float | None,
        run_dir: Path,
        seq_len: int,
        val_batches: list[dict[str, torch.Tensor]] | None = None,
        max_steps: int | None = None,
        config: dict | None = None,
    ):
        self.cfg, self.impl, self.dist, self.device = cfg, impl, dist, device
        self.data, self.seq_len, self.run_dir, self.max_steps = data, seq_len, Path(run_dir), max_steps
        self.checkpoints = self.run_dir / "checkpoints"
        self.module = model  # the plain module (state dicts are taken from it)
        self.aliases = ckpt.tied_aliases(model)
        # a small sample for FLOP counting (its labels also give the scored fraction of MLM positions)
        sample = {k: v[:8].to(device) for k, v in val_batches[0].items()} if val_batches else None
        self.flops_per_token, self.flops_source = flops_per_token(model, seq_len, sample)
        self.budget = Budget(cfg.budget, budget_hours, self.flops_per_token)
        self.plan = BatchPlan(cfg, impl.microbatch_size, dist.world, seq_len, self.budget)
        self.precision = resolve_precision(impl, device, model)  # auto: measured once per machine
        self.peak, self.peak_source = peak_flops(device, self.precision.dtype)  # MFU against the precision in use
        if impl.activation_checkpointing:
            apply_activation_checkpointing(model)
        self.model = wrap_model(model, dist, device)  # DDP wrapper, or the same module sharded by FSDP2
        self.optimizer = build_optimizer(cfg.optim, self.module)
        if impl.compile:
            self.model = compile_model(self.model, impl)
        self.schedule = build_schedule(cfg.schedule)
        self.amp = self.precision.dtype
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.amp is torch.float16)
        self.val_batches = self._shard_val(val_batches or [])
        self.used = Usage()
        self.next_validation = cfg.validate_every if cfg.validate_every > 0 else math.inf
        self.events = {"nonfinite_steps": 0, "skipped_steps": 0, "rollbacks": 0}
        self.times = {"first_step_seconds": 0.0, "eval_seconds": 0.0, "checkpoint_seconds": 0.0}
        self.consecutive_nonfinite = 0
        self.losses: list[float] = []  # one mean loss per logged window (this session)
        self.config = config or {}
        self.resumed_from: dict | None = None
        self.log: MetricsLog | None = None  # opened by fit(): a resumed run appends to metrics.jsonl

    # ------------------------------------------------------------------ state

    def _full_state(self) -> tuple[dict, dict]:
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return (
            get_model_state_dict(self.module, options=options),
            get_optimizer_state_dict(self.module, self.optimizer, options=options),
        )

    def save_checkpoint(self) -> Path:
        start = time.perf_counter()
        model_state, optim_state = self._full_state()  # a collective under FSDP: every rank takes part
        folder = self.checkpoints / f"step-{self.used.steps:08d}"
        if self.dist.main:
            training = {
                "optimizer": optim_state,
                "scaler": self.scaler.state_dict(),
                "data": self.data.state_dict(),
                "torch_rng": torch.get_rng_state(),
                "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            }
            np_state = np.random.get_state(legacy=False)
            np_state["state"]["key"] = np_state["state"]["key"].tolist()
            state = {
                "usage": self.used.state_dict(),
                "next_validation": self.next_validation if math.isfinite(self.next_validation) else None,
                "events": self.events,
                "times": self.times,
                "world_size": self.dist.world,
                "data_position": self.data.order.state_dict(),
                "python_rng": random.getstate(),
                "numpy_rng": np_state,
            }
            folder = ckpt.write_checkpoint(
                self.checkpoints, self.used.steps, model_state, self.aliases, training, state, self.cfg.keep_checkpoints
            )
        barrier(self.dist)
        self.times["checkpoint_seconds"] += time.perf_counter() - start
        return folder

    def _load_weights_and_optimizer(self, folder: Path) -> tuple[dict, dict]:
        model_state, training, state = ckpt.read_checkpoint(folder, self.aliases)
        options = StateDictOptions(full_state_dict=True)
        set_model_state_dict(self.module, model_state, options=options)
        set_optimizer_state_dict(self.module, self.optimizer, training["optimizer"], options=options)
        if training.get("scaler"):
            self.scaler.load_state_dict(training["scaler"])
        return training, state

    def resume(self, folder: Path) -> None:
        """Continue from a checkpoint (written by any number of processes)."""
        training, state = self._load_weights_and_optimizer(folder)
        self.data.load_state_dict(training["data"])
        torch.set_rng_state(training["torch_rng"])
        if training.get("cuda_rng") and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(training["cuda_rng"])
        np_state = state["numpy_rng"]
        np_state["state"]["key"] = np.asarray(np_state["state"]["key"], dtype=np.uint32)
        np.random.set_state(np_state)
        version, internal, gauss = state["python_rng"]
        random.setstate((version, tuple(internal), gauss))
        self.used = Usage(**state["usage"])
        nv = state.get("next_validation")
        self.next_validation = math.inf if nv is None else nv
        self.events.update(state.get("events", {}))
        self.times.update(state.get("times", {}))
        self.resumed_from = {"kind": "event", "event": "resumed", "step": self.used.steps, "from": str(folder),
                             "world_size": self.dist.world, "checkpoint_world_size": state.get("world_size")}

    # ------------------------------------------------------------------ one step

    def _local_slice(self, n_micro: int) -> range:
        n_local = n_micro // self.dist.world
        return range(self.dist.rank * n_local, (self.dist.rank + 1) * n_local)

    def train_step(self, n_micro: int) -> tuple[float, bool, float | None]:
        """(mean loss over all microbatches, whether it was finite everywhere, grad norm)."""
        m = self.impl.microbatch_size
        batch = self.data.take(n_micro * m)  # (n_micro * m, T) each, the same on every process
        mine = self._local_slice(n_micro)
        losses = []
        for i, j in enumerate(mine):
            micro = {k: v[j * m : (j + 1) * m].to(self.device, non_blocking=True) for k, v in batch.items()}
            last = i == len(mine) - 1
            with gradient_sync(self.model, self.dist, sync=last), autocast(self.device, self.amp):
                loss = self.model(**micro)["loss"]
                self.scaler.scale(loss / len(mine)).backward()
            losses.append(loss.detach().float())
        sync_replicated_grads(self.module, self.dist)
        local = torch.stack(losses).sum().item()
        total, bad = all_reduce([local, 0.0 if math.isfinite(local) else 1.0], self.dist, "sum", self.device)
        if bad:
            self.optimizer.zero_grad(set_to_none=True)
            return math.nan, False, None
        norm = None
        if self.cfg.grad_clip:
            self.scaler.unscale_(self.optimizer)
            norm = torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.cfg.grad_clip)
            norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return total / n_micro, True, norm

    @torch.no_grad()
    def validate(self) -> float | None:
        if not self.val_batches:
            return None
        self.model.eval()
        total = 0.0
        for batch in self.val_batches:
            with autocast(self.device, self.amp):
                total += self.model(**{k: v.to(self.device) for k, v in batch.items()})["loss"].float().item()
        self.model.train()
        total, count = all_reduce([total, float(len(self.val_batches))], self.dist, "sum", self.device)
        return total / count

    def _shard_val(self, batches: list[dict]) -> list[dict]:
        """Each process scores an equal share (FSDP needs every process in every forward)."""
        usable = len(batches) // self.dist.world * self.dist.world
        return batches[:usable][self.dist.rank :: self.dist.world]

    # ------------------------------------------------------------------ the loop

    def _handle_nonfinite(self) -> None:
        self.events["nonfinite_steps"] += 1
        self.consecutive_nonfinite += 1
        action = self.cfg.on_nonfinite
        folder = ckpt.latest_checkpoint(self.checkpoints)
        if action == "raise" or self.consecutive_nonfinite > self.cfg.max_nonfinite:
            raise FloatingPointError(f"non-finite loss at step {self.used.steps} (train.on_nonfinite={action})")
        if action == "rollback" and folder is not None:
            self._load_weights_and_optimizer(folder)
            self.events["rollbacks"] += 1
            note = f"rolled back weights and optimizer to {folder.name}; the data stream moves on"
        else:
            self.events["skipped_steps"] += 1
            note = "step skipped" + (" (no checkpoint to roll back to)" if action == "rollback" else "")
        message = f"non-finite loss at step {self.used.steps}: {note}"
        self.log.write({"kind": "event", "event": "nonfinite", "step": self.used.steps, "message": message})
        if self.dist.main:
            tqdm.write(f"cramlm: {message}")

    def fit(self) -> dict:
        cfg, used = self.cfg, self.used
        self.log = MetricsLog(self.run_dir, self.impl, self.config, enabled=self.dist.main, append=bool(self.resumed_from))
        if self.resumed_from:
            self.log.write(self.resumed_from)
        bar = progress_bar(total=100, unit="%", enabled=self.impl.progress and self.dist.main,
                   bar_format="{l_bar}{bar}| {n:.1f}/100% of budget [{elapsed}{postfix}]")
        self.model.train()
        clock, base_seconds, not_counted = time.perf_counter(), used.seconds, 0.0
        last_checkpoint_seconds = used.seconds
        rate_tokens, rate_seconds = 0, 0.0  # throughput after the first step (which includes compile)
        window = {"loss": 0.0, "steps": 0, "tokens": 0, "seconds": 0.0}
        first_step = True
        while True:
            t = self.budget.progress(used)
            if t >= 1.0 or (self.max_steps is not None and used.steps >= self.max_steps):
                break
            lr = cfg.optim.lr * self.schedule(t)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            tps = rate_tokens / rate_seconds if rate_seconds > 0 else None
            n_micro = self.plan.microbatches(t, used, tps)
            step_start = time.perf_counter()
            loss, finite, norm = self.train_step(n_micro)
            step_seconds = time.perf_counter() - step_start
            if first_step:
                self.times["first_step_seconds"] += step_seconds
                if not cfg.budget.count_compile:
                    not_counted += step_seconds
            else:
                rate_tokens += n_micro * self.impl.microbatch_size * self.seq_len
                rate_seconds += step_seconds
            first_step = False
            # every process adopts the slowest clock: t, the lr and the stop decision agree everywhere
            (elapsed,) = all_reduce([time.perf_counter() - clock - not_counted], self.dist, "max", self.device)
            used.seconds = base_seconds + elapsed
            tokens = n_micro * self.impl.microbatch_size * self.seq_len
            used.steps += 1
            used.tokens += tokens
            used.flops = used.tokens * self.flops_per_token
            if not finite:
                self._handle_nonfinite()
            else:
                self.consecutive_nonfinite = 0
                window["loss"] += loss
                window["steps"] += 1
            window["tokens"] += tokens
            window["seconds"] += step_seconds
            t = self.budget.progress(used)
            done = t >= 1.0 or (self.max_steps is not None and used.steps >= self.max_steps)
            if window["steps"] and (used.steps % cfg.log_every == 0 or used.steps == 1 or done):
                self._log_window(window, t, lr, n_micro, norm, bar)
                window = {"loss": 0.0, "steps": 0, "tokens": 0, "seconds": 0.0}
            if t >= self.next_validation and not done:
                _, seconds = self._validate_now(t)
                if not cfg.budget.count_eval:
                    not_counted += seconds
                while self.next_validation <= t:
                    self.next_validation += cfg.validate_every
            due_by_steps = cfg.checkpoint_every and used.steps % cfg.checkpoint_every == 0
            due_by_time = cfg.checkpoint_minutes and used.seconds - last_checkpoint_seconds >= 60 * cfg.checkpoint_minutes
            if (due_by_steps or due_by_time) and not done:
                self.save_checkpoint()
                last_checkpoint_seconds = used.seconds
        bar.update(min(100.0, 100 * self.budget.progress(used)) - bar.n)
        bar.close()
        val_loss, _ = self._validate_now(self.budget.progress(used))
        final = self.save_checkpoint()
        self.log.close()
        return self._summary(val_loss, final, rate_tokens / rate_seconds if rate_seconds else None)

    def _log_window(self, window: dict, t: float, lr: float, n_micro: int, norm: float | None, bar) -> None:
        """One metrics line (and the progress bar) for the steps since the last one."""
        used = self.used
        speed = window["tokens"] / max(window["seconds"], 1e-9)
        mfu = speed * self.flops_per_token / (self.peak * self.dist.world) if self.peak else None
        record = {
            "kind": "train", "step": used.steps, "t": round(t, 6), "elapsed": round(used.seconds, 3),
            "tokens": used.tokens, "loss": round(window["loss"] / window["steps"], 6), "lr": lr,
            "batch_size": n_micro * self.impl.microbatch_size, "grad_norm": norm,
            "tokens_per_second": round(speed, 1), "mfu": round(mfu, 4) if mfu is not None else None,
        }
        self.log.write(record)
        self.losses.append(record["loss"])
        left = used.seconds * (1 - t) / max(t, 1e-9)  # time left in the budget at the current pace
        bar.set_postfix_str(
            f"step {used.steps} loss {record['loss']:.3f} {speed:,.0f} tok/s"
            + (f" MFU {100 * mfu:.1f}%" if mfu is not None else "") + f" left {_duration(left)}",
            refresh=False,
        )
        bar.update(min(100.0, 100 * t) - bar.n)  # redraws at progress_bar's pace (30 s into a log file)

    def _summary(self, val_loss: float | None, final: Path, tokens_per_second: float | None) -> dict:
        used = self.used
        mfu = tokens_per_second * self.flops_per_token / (self.peak * self.dist.world) if tokens_per_second and self.peak else None
        return {
            "steps": used.steps,
            "tokens": used.tokens,
            "flops": used.flops,
            "train_seconds": round(used.seconds, 3),
            "t": round(self.budget.progress(used), 6),
            "budget": self.budget.describe(),
            "budget_counts": {"compile": self.cfg.budget.count_compile, "eval": self.cfg.budget.count_eval,
                              "setup": False, "checkpoints": True},
            **{k: round(v, 3) for k, v in self.times.items()},
            **self.events,
            "tokens_per_second": round(tokens_per_second, 1) if tokens_per_second else None,
            "flops_per_token": self.flops_per_token,
            "flops_source": self.flops_source,
            "peak_flops": self.peak,
            "peak_source": self.peak_source,
            "precision": self.precision.precision,
            "precision_reason": self.precision.reason,
            "mfu": round(mfu, 4) if mfu is not None else None,
            "first_loss": self.losses[0] if self.losses else None,
            "last_loss": self.losses[-1] if self.losses else None,
            "val_loss": val_loss,
            "world_size": self.dist.world,
            "final_checkpoint": str(final),
        }

    def _validate_now(self, t: float) -> tuple[float | None, float]:
        """(held-out loss, seconds it took)."""
        start = time.perf_counter()
        val_loss = self.validate()
        seconds = time.perf_counter() - start
        self.times["eval_seconds"] += seconds
        if val_loss is not None:
            self.log.write({"kind": "val", "step": self.used.steps, "t": round(t, 6), "elapsed": round(self.used.seconds, 3),
                            "tokens": self.used.tokens, "val_loss": round(val_loss, 6)})
        return val_loss, seconds


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else f"{seconds // 60}:{seconds % 60:02d}"
