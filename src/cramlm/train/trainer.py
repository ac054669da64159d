"""The training loop. It never knows which model it trains: it calls ``model(**batch)["loss"]``.

One optimizer step, on any number of processes:

1. progress ``t`` (budget.py) gives the lr (schedules.py) and the number of microbatches (the batch
   ramp, capped so the budget allows ``min_updates`` steps);
2. each process draws and collates only its own microbatches of the step's global batch (every
   ``world``-th, masks keyed by stream position: batches.py) and runs them, accumulating
   gradients without communication until the last one; the result is the same as one process
   running all microbatches;
3. one reduction over processes agrees on the clock, the non-finite flag and a stop request, so
   every process takes the same decision (step, skip, roll back, validate, checkpoint, stop) at
   the same step; then the optimizer step (step.py).

Around the step, ``fit`` reads top to bottom: the budget meter (budget.py) says when the run is
done, small ``Due`` policies say when to log, validate and checkpoint, ``NonFinite`` handles
NaN/inf steps in one place, and ``StopRequest`` (preemption.py) turns SIGINT/SIGTERM/SIGUSR1 into
a checkpoint and exit status 75. The model arrives ready (parallelize.py).

Host synchronisation: losses and gradient norms stay device tensors until a metrics line is
written. With one process, a fused optimizer (AdamW's default) and ``on_nonfinite=skip`` a
non-finite step is dropped on the device and counted at the next metrics line, so a step between
metrics lines never waits for the device; otherwise the non-finite flag is read once per step
(with several processes inside the step's one reduction). Batches go through pinned memory with
non-blocking copies on CUDA, so the next batch is drawn and masked while the device works; with
``impl.prefetch`` a background thread prepares it even across a host synchronisation, and the
host time the loop spends on batches is logged (``host_seconds`` per step).

The whole state (weights, optimizer, scaler, counters, data position, RNG) goes into checkpoints
(checkpoint.py); a run resumed from one continues bit for bit when its budget is not wall-clock.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from tqdm import tqdm

from cramlm.progress import progress_bar
from cramlm.train import checkpoint as ckpt
from cramlm.train import sharded as shards
from cramlm.train.batches import LocalBatches, StepData
from cramlm.train.budget import BatchPlan, Meter
from cramlm.train.config import TrainConfig
from cramlm.train.distributed import (all_reduce, barrier, gather_object, gradient_sync, load_from_rank0, on_main,
                                      sync_replicated_grads)
from cramlm.train.metrics import MetricsLog, wall_clock
from cramlm.train.optim import config_hyperparameters
from cramlm.train.parallelize import Parallel
from cramlm.train.preemption import Interrupted, StopRequest, signal_name
from cramlm.train.hardware import PrecisionChoice, code_version, machine
from cramlm.train.impl import ImplConfig
from cramlm.train.schedules import build_schedule
from cramlm.train.step import OptimizerStep
from cramlm.train.validation import heldout_sums


@dataclass
class Due:
    """When a periodic action is due: every ``steps`` optimizer steps, every ``minutes`` of the
    budget clock since the last time, or each time t passes a multiple of ``fraction`` (whichever
    are set; 0/None: off). ``next_t`` is saved in checkpoints."""

    steps: int = 0
    minutes: float | None = None
    fraction: float = 0.0
    next_t: float = math.inf
    last_seconds: float = 0.0

    def __post_init__(self):
        if self.fraction > 0:
            self.next_t = self.fraction

    def __call__(self, used, t: float) -> bool:
        due = bool(self.steps) and used.steps % self.steps == 0
        due |= bool(self.minutes) and used.seconds - self.last_seconds >= 60 * self.minutes
        due |= t >= self.next_t
        while self.fraction > 0 and self.next_t <= t:
            self.next_t += self.fraction
        if self.fraction <= 0 and t >= self.next_t:  # a resumed run with the fraction now off
            self.next_t = math.inf
        if due:
            self.last_seconds = used.seconds
        return due


@dataclass
class Milestones:
    """Checkpoints kept at fractions of the budget (``train.checkpoint_at``): the call at each step gives
    the fraction t reached there, or None. Which have passed follows from t alone (``start``), so a resumed
    run writes the rest; a step past several gives the last."""

    at: tuple[float, ...] = ()
    passed: int = 0

    def start(self, t: float) -> float | None:
        """Those at or before t passed; the one t stands at exactly, or None (a run resumed there, perhaps
        under a budget that grew: the checkpoint it resumed from is that one's)."""
        self.passed = sum(a <= t for a in self.at)
        return t if t in self.at else None

    def __call__(self, t: float) -> float | None:
        reached = [a for a in self.at[self.passed:] if a <= t]
        self.passed += len(reached)
        return reached[-1] if reached else None


@dataclass
class Step:
    """What one optimizer step left: device tensors until a metrics line reads them."""

    number: int
    loss: torch.Tensor  # this process's sum of microbatch losses
    n_micro: int
    tokens: int
    seconds: float
    norm: torch.Tensor | None
    nonfinite: bool | torch.Tensor  # a device flag until NonFinite reads it
    stop: int  # the signal a process received (agreed over processes), 0: none
    host: float = 0.0  # seconds this process's loop spent getting its batches (batches.LocalBatches)
    parts: dict = field(default_factory=dict)  # sums of the model's named loss parts (RTD: mlm_loss, rtd_loss)


class NonFinite:
    """Non-finite steps, in one place. A step whose loss (on any process) or gradient norm is NaN
    or inf is dropped (its update never applied) and handled per ``train.on_nonfinite``: ``skip``
    counts it, ``rollback`` reloads weights and optimizer from the newest checkpoint (the data
    stream moves on), ``raise`` stops the run; more than ``max_nonfinite`` in a row stop it too.
    Flags still on the device (see ``Trainer.device_skip``) are read by ``flush``, at the next
    metrics line or checkpoint, in step order. ``events``: the counters it keeps (TrainState's);
    ``rollback()``: the name of the checkpoint it rolled back to, None if there is none;
    ``report(name, message, step=...)``: an event line."""

    def __init__(self, cfg: TrainConfig, events: dict, rollback: Callable[[], str | None], report: Callable[..., None]):
        self.cfg, self.events, self.rollback, self.report = cfg, events, rollback, report
        self.pending: list[Step] = []
        self.consecutive = 0

    def observe(self, step: Step) -> None:
        if isinstance(step.nonfinite, torch.Tensor):
            self.pending.append(step)
        else:
            self._handle(step)

    def flush(self) -> None:
        if not self.pending:
            return
        flags = torch.stack([s.nonfinite for s in self.pending]).tolist()  # one host read
        pending, self.pending = self.pending, []
        for step, flag in zip(pending, flags):
            step.nonfinite = bool(flag)
            self._handle(step)

    def _handle(self, step: Step) -> None:
        if not step.nonfinite:
            self.consecutive = 0
            return
        events, action = self.events, self.cfg.on_nonfinite
        events["nonfinite_steps"] += 1
        self.consecutive += 1
        if action == "raise" or self.consecutive > self.cfg.max_nonfinite:
            raise NonFiniteError(f"non-finite loss at step {step.number} (train.on_nonfinite={action}, "
                                 f"{self.consecutive} in a row, train.max_nonfinite={self.cfg.max_nonfinite})")
        folder = self.rollback() if action == "rollback" else None
        if folder is not None:
            events["rollbacks"] += 1
            note = f"rolled back weights and optimizer to {folder}; the data stream moves on"
        else:
            events["skipped_steps"] += 1
            note = "step skipped" + (" (no checkpoint to roll back to)" if action == "rollback" else "")
        self.report("nonfinite", f"non-finite loss at step {step.number}: {note}", step=step.number)


class NonFiniteError(FloatingPointError, ValueError):
    """The run diverged (a ValueError too: the command line reports it as one Error: line)."""


@dataclass
class TrainState:
    """The counters a checkpoint's state.json holds (beside the RNG): what the meter has used,
    when validation is next due, the non-finite events and the run's first loss."""

    meter: Meter
    validation: Due
    events: dict = field(default_factory=lambda: {"nonfinite_steps": 0, "skipped_steps": 0, "rollbacks": 0})
    first_loss: float | None = None  # of the run (restored on resume), not of this session

    def state_dict(self) -> dict:
        next_t = self.validation.next_t
        return {**self.meter.state_dict(), "next_validation": next_t if math.isfinite(next_t) else None,
                "events": dict(self.events), "first_loss": self.first_loss}

    def load_state_dict(self, state: dict) -> None:
        self.meter.load_state_dict(state)
        next_t = state["next_validation"]
        fraction = self.validation.fraction
        if next_t is None and fraction > 0:  # off when the checkpoint was written, on now: the next multiple from here
            next_t = (math.floor(self.meter.t / fraction) + 1) * fraction
        self.validation.next_t = math.inf if next_t is None else next_t
        self.events.update(state["events"])
        self.first_loss = state["first_loss"]


@dataclass
class Window:
    """The steps since the last metrics line."""

    steps: list[Step] = field(default_factory=list)
    waited: float = 0.0  # the host's wait for the device when the window's losses were read back

    def add(self, step: Step) -> None:
        self.steps.append(step)

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.steps)

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.steps) + self.waited

    @property
    def host(self) -> float:
        return sum(s.host for s in self.steps)


class Trainer:
    """Trains a ready model (``parallelize``) on ``data`` under ``meter``'s budget; ``fit()``."""

    def __init__(self, model: Parallel, optimizer: torch.optim.Optimizer, data: StepData, cfg: TrainConfig,
                 impl: ImplConfig, meter: Meter, run_dir: Path, precision: PrecisionChoice, heldout=None,
                 record: dict | None = None):
        self.model, self.module, self.dist, self.device = model.model, model.module, model.dist, model.device
        self.aliases, self.data, self.cfg, self.impl, self.meter = model.aliases, data, cfg, impl, meter
        self.run_dir, self.optimizer = Path(run_dir), optimizer
        self.record = record or {}  # what the run is (config, data identity): in every checkpoint's state.json
        self.config = self.record.get("config", {})  # heads metrics.jsonl
        self.checkpoints = self.run_dir / "checkpoints"
        self.precision = precision  # resolved once, by build_trainer
        self.update = OptimizerStep(self.optimizer, self.module, self.device, self.precision.dtype, cfg.grad_clip)
        self.schedule = build_schedule(cfg.schedule)
        self.plan = BatchPlan(cfg, impl.microbatch_size, self.dist.world, data.seq_len, meter.budget,
                              meter.costs.optimizer_flops_per_step)
        self.batches = LocalBatches(data, impl.microbatch_size, self.dist.rank, self.dist.world, self.device,
                                    prefetch=prefetches(impl, self.device))
        # val_loss: the first train.validate_sequences of the held-out set (data/heldout.py), this process's share
        self.heldout = heldout
        self.val_bpb: float | None = None  # of the last validation
        self.val_batches = heldout.batches(impl.microbatch_size, self.dist.world, self.dist.rank) if heldout is not None and len(heldout) else []
        self.logging_due = Due(steps=cfg.log_every)
        self.validation_due = Due(fraction=cfg.validate_every)
        self.checkpoint_due = Due(steps=cfg.checkpoint_every, minutes=cfg.checkpoint_minutes)
        self.milestones = Milestones(tuple(cfg.checkpoint_at))
        self.checkpoint_format = checkpoint_format(impl, self.dist.strategy)
        self.state = TrainState(meter, self.validation_due)
        self.nonfinite = NonFinite(cfg, self.state.events, self._rollback, self.event)
        # drop non-finite steps on the device, reading the flag only at metrics lines (see the docstring)
        self.device_skip = cfg.on_nonfinite == "skip" and not self.dist.enabled and self.update.skips_on_device
        self.stop = StopRequest()
        self.last_loss: float | None = None
        self.resumed_from: dict | None = None
        self.restarted = False  # started again from step 0 in a folder whose log an earlier start left (no checkpoint): appended
        self.notes: list[dict] = []  # event lines for metrics.jsonl once fit() opens it (e.g. config_changed)
        self.log: MetricsLog | None = None  # opened by fit(): a resumed run appends to metrics.jsonl

    @property
    def events(self) -> dict:
        return self.state.events

    @property
    def first_loss(self) -> float | None:
        return self.state.first_loss

    @first_loss.setter
    def first_loss(self, value: float | None) -> None:
        self.state.first_loss = value

    @property
    def used(self):
        return self.meter.used

    @property
    def budget(self):
        return self.meter.budget

    # ------------------------------------------------------------------ the loop

    def fit(self) -> dict:
        """Train until the budget is spent, validate, write the final checkpoint; the summary.
        A stop signal ends the run after the current step with a checkpoint (``Interrupted``); an
        error leaves a ``failed`` event, so that the run's segments tell it from a cut-off."""
        try:
            return self._fit()
        except Interrupted:
            raise
        except Exception as e:
            if self.log and self.log.file and not self.log.file.closed:
                self.log.write({"kind": "event", "event": "failed", "step": self.used.steps, "wall": wall_clock(),
                                "error": f"{type(e).__name__}: {e}"[:2000]})
                self.log.close()
            raise

    def _fit(self) -> dict:
        meter, used = self.meter, self.meter.used
        self._open_log()
        bar, window = self._progress_bar(), Window()
        self.model.train()
        with self.stop:
            meter.start()
            self.checkpoint_due.last_seconds = used.seconds
            kept = self.milestones.start(meter.t)
            here = self.checkpoints / f"step-{used.steps:08d}"  # (rank 0 decides: every process takes part in a save)
            if kept is not None and used.steps and on_main(lambda: ckpt.kept_at(here), self.dist) != kept:
                self.save_checkpoint(kept_at=kept)
            while not meter.done:
                lr = self._set_lr(meter.t)
                step = self.train_step(self.plan.microbatches(meter.t, used, meter.agreed_tokens_per_second))
                self.nonfinite.observe(step)
                window.add(step)
                t, last = meter.t, meter.done or bool(step.stop)
                kept = self.milestones(t)  # a checkpoint kept at this fraction of the budget
                if last or used.steps == 1 or self.logging_due(used, t):
                    self._log(window, t, lr, bar)
                    window = Window()
                if step.stop and not meter.done:  # (a run that is done anyway just finishes)
                    self._interrupted(step.stop, bar, kept)  # checkpoint, event, exit status 75
                if not last and self.validation_due(used, t):
                    self._validate_now(t)
                if (self.checkpoint_due(used, t) or kept is not None) and not last:
                    self.save_checkpoint(kept_at=kept)
        bar.update(min(100.0, 100 * meter.t) - bar.n)
        bar.close()
        val_loss = self._validate_now(meter.t)
        self._check_trained(val_loss)  # a diverged run fails here, before a NaN model is saved as final
        final = self.save_checkpoint(final=True, kept_at=kept)
        self.batches.close()
        self.log.write({"kind": "finished", "step": used.steps, "wall": wall_clock(), "checkpoint": str(final)})
        self.log.close()
        return self._summary(val_loss, final)

    # ------------------------------------------------------------------ one step

    def train_step(self, n_micro: int) -> Step:
        """Forward and backward over this process's microbatches of the global batch, one
        agreement over processes (clock, non-finite flag, stop request), then the update."""
        start, host = time.perf_counter(), self.batches.host_seconds
        m, n_local = self.impl.microbatch_size, n_micro // self.dist.world
        losses, parts = [], {}
        for i, micro in enumerate(self.batches.step(n_micro)):  # (m, T) each: this process's microbatches
            with gradient_sync(self.model, self.dist, sync=i == n_local - 1), self.update.autocast():
                out = self.model(**micro)
                loss = out["loss"]
                self.update.backward(loss / n_local)
            losses.append(loss.detach().float())
            for name in (k for k in out if k.endswith("_loss") and out[k] is not None):  # logged beside the loss
                parts[name] = parts.get(name, 0.0) + out[name].detach().float()
        sync_replicated_grads(self.module, self.dist)
        norm = self.update.clip()
        loss = torch.stack(losses).sum()
        # fp16: a non-finite gradient with a finite loss is the loss scale's overflow, which the scaler's
        # own step skips and backs off from (routine every ~2,000 steps): not a non-finite step
        if norm is None or self.update.scaler.is_enabled():
            bad = ~torch.isfinite(loss)
        else:
            bad = ~(torch.isfinite(loss) & torch.isfinite(norm))
        clock = self.meter.reading(time.perf_counter() - start)
        if self.dist.enabled:  # the step's one reduction: every process adopts the slowest clock
            clock, stop, flag = all_reduce([clock, float(self.stop.signal), bad], self.dist, "max", self.device)
            stop, bad = int(stop), bool(flag)
        else:
            stop = self.stop.signal
            bad = bad if self.device_skip else bool(bad)
        if self.device_skip:
            self.update.step(skip=bad)
        elif bad:
            self.update.drop()
        else:
            self.update.step()
        tokens = n_micro * m * self.data.seq_len
        seconds = time.perf_counter() - start
        self.meter.record(tokens, seconds, clock)
        return Step(self.used.steps, loss, n_micro, tokens, seconds, norm, bad, stop, self.batches.host_seconds - host, parts)

    def _set_lr(self, t: float) -> float:
        """Every group's peak lr (``peak_lr``: Muon's AdamW groups have their own; else train.optim.lr)
        times the schedule's factor; the lr logged is train.optim.lr's."""
        factor = self.schedule(t)
        for group in self.optimizer.param_groups:
            group["lr"] = group.get("peak_lr", self.cfg.optim.lr) * factor
        return self.cfg.optim.lr * factor

    @torch.no_grad()
    def validate(self) -> float | None:
        """val_loss: nats over scored tokens of this process's share, summed over processes (the
        same number on any process count and microbatch size, up to rounding)."""
        if not self.val_batches:
            return None
        self.model.eval()
        sums = heldout_sums(self.model, self.heldout.objective, self.val_batches, self.device, self.update.autocast)
        self.model.train()
        nats, scored, text = all_reduce([sums[0], sums[1], sums[2]], self.dist, "sum", self.device)
        bpt = self.heldout.bytes_per_token  # bits per byte, when the manifest counts the validation bytes
        self.val_bpb = float(nats) / math.log(2) / (float(text) * bpt) if bpt and float(text) else None
        return float(nats) / float(scored)

    # ------------------------------------------------------------------ what fit() calls

    def _open_log(self) -> None:
        here = gather_object(machine(self.device), self.dist)  # every rank's (a job may span machines), before rank 0 alone can fail
        self.log = MetricsLog(self.run_dir, self.impl, self.config, enabled=self.dist.main, append=bool(self.resumed_from) or self.restarted)
        if self.dist.main:  # which ran where: one line each time the run starts or resumes (report/segments.py)
            line = {"kind": "segment", "step": self.used.steps, "wall": wall_clock(), "pid": os.getpid(),
                    "world_size": self.dist.world, "threads": torch.get_num_threads(),
                    "budget_seconds": round(self.used.seconds, 3), "machine": here[0], "code": code_version()}
            others = [m for m in here if m != here[0]]
            if others:  # the other machines of a multi-node job, each with its ranks
                line["machines"] = [{"ranks": [r for r, m in enumerate(here) if m == other], **other}
                                    for other in [m for i, m in enumerate(others) if m not in others[:i]]]
            self.log.write(line)
        for line in [self.resumed_from] * bool(self.resumed_from) + self.notes:
            self.log.write(line)

    def _progress_bar(self):
        """% of the budget; a resumed run's bar starts where the run is."""
        return progress_bar(total=100, initial=min(100.0, 100 * self.meter.t), unit="%",
                            enabled=self.impl.progress and self.dist.main,
                            bar_format="{l_bar}{bar}| {n:.1f}/100% of budget [{elapsed}{postfix}]")

    def event(self, name: str, message: str, **extra) -> None:
        """An event line in metrics.jsonl, printed too (rank 0)."""
        self.log.write({"kind": "event", "event": name, "step": self.used.steps, "wall": wall_clock(), **extra, "message": message})
        if self.dist.main:
            tqdm.write(f"cramlm: {message}")

    def _log(self, window: Window, t: float, lr: float, bar) -> None:
        """One metrics line (and the progress bar) for the steps since the last one: the only
        place a step's loss and gradient norm are read back to the host."""
        self.nonfinite.flush()
        steps = window.steps
        names = sorted(set.intersection(*(set(s.parts) for s in steps)))  # the loss parts (RTD), as the loss
        values = [s.loss for s in steps] + [s.parts[n] for n in names for s in steps]
        start = time.perf_counter()
        values = self._read_back(values)
        # the read waits for the device to finish the window's last step (its backward and update run
        # after the step's own clock stopped, on an asynchronous device): training time, as the step's
        window.waited = time.perf_counter() - start
        self.meter.waited(window.waited)
        totals = values[: len(steps)]
        finite = [float(total) / s.n_micro for s, total in zip(steps, totals) if not s.nonfinite]
        parts = {n: [float(v) / s.n_micro for s, v in zip(steps, values[(i + 1) * len(steps) : (i + 2) * len(steps)])
                     if not s.nonfinite] for i, n in enumerate(names)}
        if not finite:
            return
        used, last = self.used, steps[-1]
        speed = window.tokens / max(window.seconds, 1e-9)
        mfu = self.meter.mfu(speed, len(steps) / max(window.seconds, 1e-9))
        norm = float(last.norm) if last.norm is not None and not last.nonfinite else None
        norm = norm if norm is None or math.isfinite(norm) else None  # fp16's loss-scale overflow: metrics stay strict JSON
        record = {
            "kind": "train", "step": used.steps, "t": round(t, 6), "elapsed": round(used.seconds, 3),
            "tokens": used.tokens, "loss": round(sum(finite) / len(finite), 6),
            **{n: round(sum(v) / len(v), 6) for n, v in parts.items()}, "lr": lr,
            "batch_size": last.n_micro * self.impl.microbatch_size, "grad_norm": norm,
            "tokens_per_second": round(speed, 1), "mfu": round(mfu, 4) if mfu is not None else None,
            "host_seconds": round(window.host / len(steps), 6),  # per step: rank 0's loop getting its batches
        }
        self.log.write(record)
        self.first_loss = record["loss"] if self.first_loss is None else self.first_loss
        self.last_loss = record["loss"]
        left = used.seconds * (1 - t) / max(t, 1e-9)  # time left in the budget at the current pace
        bar.set_postfix_str(
            f"step {used.steps} loss {record['loss']:.3f} {speed:,.0f} tok/s"
            + (f" MFU {100 * mfu:.1f}%" if mfu is not None else "") + f" left {_duration(left)}",
            refresh=False,
        )
        bar.update(min(100.0, 100 * t) - bar.n)  # redraws at progress_bar's pace (30 s into a log file)

    def _read_back(self, values: list[torch.Tensor]) -> list[float]:
        """The window's losses on the host: the loop's one synchronisation with the device."""
        if self.dist.enabled:  # every process takes part in this collective (metrics lines are agreed)
            return all_reduce(values, self.dist, "sum", self.device)
        return torch.stack(values).double().tolist()

    def _validate_now(self, t: float) -> float | None:
        """The validation loss (val_loss), logged; its time counts against the budget only if count_eval."""
        with self.meter.timed("eval", counts=self.meter.count["eval"]):
            val_loss = self.validate()
        if val_loss is not None:
            self.log.write({"kind": "val", "step": self.used.steps, "t": round(t, 6), "elapsed": round(self.used.seconds, 3),
                            "tokens": self.used.tokens, "val_loss": round(val_loss, 6),
                            **({"val_bpb": round(self.val_bpb, 6)} if self.val_bpb is not None else {})})
        return val_loss

    def _interrupted(self, signum: int, bar, kept_at: float | None) -> None:
        name = signal_name(signum)  # perhaps received by another process
        bar.close()
        self.batches.close()
        folder = self.save_checkpoint(kept_at=kept_at)
        self.event("interrupted", f"{name}: stopped after step {self.used.steps}, checkpoint {folder}; "
                   "resume=auto continues", signal=name, checkpoint=str(folder))
        self.log.close()
        raise Interrupted(name, self.used.steps, folder)

    def _check_trained(self, val_loss: float | None) -> None:
        """Fail a run that diverged: non-finite weights, no step with a finite loss, or a
        non-finite held-out loss at the end."""
        params = [p.to_local() if hasattr(p, "to_local") else p for p in self.module.parameters()]
        finite = bool(torch.stack([torch.isfinite(p).all() for p in params]).all()) if params else True
        (bad,) = all_reduce([0.0 if finite else 1.0], self.dist, "max", self.device)
        n, used = self.events["nonfinite_steps"], self.used.steps
        what = ("the weights are no longer finite" if bad else "no step had a finite loss" if used and n >= used
                else f"the held-out loss is {val_loss}" if val_loss is not None and not math.isfinite(val_loss) else None)
        if what:  # (fit() writes the failed event and closes the log)
            raise NonFiniteError(
                f"training diverged: {what} after step {used} ({n} of {used} steps non-finite); no final "
                "checkpoint or model written. Lower train.optim.lr or set train.grad_clip"
            )

    # ------------------------------------------------------------------ state

    def save_checkpoint(self, final: bool = False, kept_at: float | None = None) -> Path | None:
        """All processes take part (a collective under FSDP). Full format: rank 0 writes; sharded:
        every process writes its shards. A full disk: a warning for a periodic checkpoint (training
        goes on), an error for the final one. ``kept_at``: the fraction of train.checkpoint_at it is
        kept for (state.json's ``kept_at``: never deleted for keep_checkpoints)."""
        self.nonfinite.flush()  # the counters saved include every step so far
        with self.meter.timed("checkpoint"):
            counters = {**self.state.state_dict(), "world_size": self.dist.world, "threads": torch.get_num_threads(),
                        "precision": self.precision.precision, "run": self.record, "batch_plan": list(self.plan.units)}
            if kept_at is None:  # the same step saved again (a finished run resumed) stays kept
                kept_at = ckpt.kept_at(self.checkpoints / f"step-{self.used.steps:08d}")
            if kept_at is not None:
                counters["kept_at"] = kept_at
            try:
                folder = (self._write_sharded if self.checkpoint_format == "sharded" else self._write_full)(counters)
            except ckpt.DiskFullError as e:
                if final:
                    raise
                self.event("disk_full", f"warning: {e}; training goes on")
                folder = None
            barrier(self.dist)
        return folder

    def _write_full(self, counters: dict) -> Path:
        """The full state gathered to rank 0's host memory, which writes it (the others: the folder's name)."""
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model_state = get_model_state_dict(self.module, options=options)
        optim_state = get_optimizer_state_dict(self.module, self.optimizer, options=options)
        if not self.dist.main:
            return self.checkpoints / f"step-{self.used.steps:08d}"
        training, state = ckpt.train_state(optim_state, self.update.state_dict(), self.data.state_dict(), counters)
        return ckpt.write_checkpoint(self.checkpoints, self.used.steps, model_state, self.aliases, training, state,
                                     self.cfg.keep_checkpoints)

    def _write_sharded(self, counters: dict) -> Path:
        """Each process's own shards of the weights and optimizer state (train/sharded.py)."""
        model_state = {k: v for k, v in get_model_state_dict(self.module).items() if k not in self.aliases}
        optim_state = get_optimizer_state_dict(self.module, self.optimizer)
        training, state = ckpt.train_state({}, self.update.state_dict(), self.data.state_dict(), counters)
        return ckpt.write_sharded_checkpoint(self.checkpoints, self.used.steps, model_state, optim_state, training,
                                             state, self.cfg.keep_checkpoints, self.dist)

    def _rollback(self) -> str | None:
        """on_nonfinite=rollback: weights and optimizer from the newest checkpoint whose files verify
        (its name; a damaged one is set aside as ``--resume auto`` does, by rank 0 for all), if any."""
        folder = on_main(lambda: ckpt.resumable_checkpoint(self.checkpoints), self.dist)
        if folder is None:
            return None
        self.load_weights_and_optimizer(folder)
        return folder.name

    def load_weights_and_optimizer(self, folder: Path) -> tuple[dict, dict]:
        """A full checkpoint: under FSDP2 only rank 0 reads the weights and optimizer state and
        broadcasts them tensor by tensor, each process keeping its shard: no process holds the full
        state (DDP's every process needs it whole anyway). A sharded one: ``_load_sharded``."""
        if shards.is_sharded(folder):
            return self._load_sharded(folder)
        sharded = self.dist.sharded
        model_state, training, state = ckpt.read_checkpoint(folder, self.aliases, weights=self.dist.main or not sharded)
        if sharded:
            load_from_rank0(self.module, model_state, self.aliases)
        else:
            set_model_state_dict(self.module, model_state, options=StateDictOptions(full_state_dict=True))
        optim_state = training["optimizer"] if self.dist.main or not sharded else {}
        with config_hyperparameters(self.optimizer):  # (the writer's implementation may not run here: another layout)
            set_optimizer_state_dict(self.module, self.optimizer, optim_state,
                                     options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=sharded))
        self.update.load_state_dict(training.get("scaler"))
        return training, state

    def _load_sharded(self, folder: Path) -> tuple[dict, dict]:
        """Each process reads the chunks of a sharded checkpoint its own tensors overlap (DCP
        resharding: any number of processes, any layout); the optimizer's non-tensor state comes
        from training.pt."""
        _, training, state = ckpt.read_checkpoint(folder, self.aliases, weights=False)
        model_state = {k: v for k, v in get_model_state_dict(self.module).items() if k not in self.aliases}
        # (a fresh optimizer's state is created first, by a step with zero gradients and lr 0: the tensors to fill)
        tensors, _ = shards.split_tensors(get_optimizer_state_dict(self.module, self.optimizer))
        shards.load_shards(folder, model_state, tensors)
        keys = set_model_state_dict(self.module, model_state, options=StateDictOptions(strict=False))
        missing = sorted(set(keys.missing_keys) - set(self.aliases))
        if missing or keys.unexpected_keys:
            raise RuntimeError(f"sharded weights: missing {missing[:5]}, unexpected {sorted(keys.unexpected_keys)[:5]}")
        with config_hyperparameters(self.optimizer):
            set_optimizer_state_dict(self.module, self.optimizer, shards.merge(tensors, training["optimizer"]))
        self.update.load_state_dict(training.get("scaler"))
        return training, state

    def resume(self, folder: Path) -> None:
        """Continue from a checkpoint (written by any number of processes)."""
        training, state = self.load_weights_and_optimizer(folder)
        self.data.load_state_dict(training["data"])
        ckpt.set_rng_state(training, state)
        self.state.load_state_dict(state)
        units = ckpt.plan_units(state)
        if units != self.plan.units and ckpt.follows(units, self.plan.here, self.cfg.full_batch()):  # (else refused, allowed or moot: check_batch_plan)
            p = self.plan
            self.plan = BatchPlan(self.cfg, *p.here, p.seq_len, p.budget, p.optimizer_flops_per_step, units=units)
        self.resumed_from = {"kind": "event", "event": "resumed", "step": self.used.steps, "wall": wall_clock(), "from": str(folder),
                             "world_size": self.dist.world, "checkpoint_world_size": state["world_size"],
                             "data_format": training["data"]["format"]}


    def _summary(self, val_loss: float | None, final: Path) -> dict:
        meter, used, costs = self.meter, self.used, self.meter.costs
        speed = meter.tokens_per_second
        mfu = meter.mfu(speed, meter.steps_per_second)
        return {
            "steps": used.steps,
            "tokens": used.tokens,
            "flops": used.flops,
            "train_seconds": round(used.seconds, 3),
            "t": round(meter.t, 6),
            "budget": meter.budget.describe(),
            "budget_counts": {"compile": meter.count["compile"], "eval": meter.count["eval"],
                              "setup": False, "checkpoints": True},
            **{k: round(v, 3) for k, v in meter.times.items()},
            **self.events,
            "tokens_per_second": round(speed, 1) if speed else None,
            "flops_per_token": costs.flops_per_token,
            "flops_source": costs.flops_source,
            "optimizer_flops_per_step": costs.optimizer_flops_per_step,
            "peak_flops": costs.peak,
            "peak_source": costs.peak_source,
            "precision": self.precision.precision,
            "precision_reason": self.precision.reason,
            "mfu": round(mfu, 4) if mfu is not None else None,
            "first_loss": self.first_loss,
            "last_loss": self.last_loss,
            "val_loss": val_loss,
            "val_bpb": self.val_bpb,
            "val_sequences": len(self.heldout) if self.heldout is not None else 0,
            "world_size": self.dist.world,
            "final_checkpoint": str(final),
        }


def checkpoint_format(impl: ImplConfig, strategy: str) -> str:
    """impl.checkpoint_format: auto is sharded under FSDP2 (no process gathers the whole state),
    full otherwise (one file of weights, loadable without torch.distributed)."""
    if impl.checkpoint_format != "auto":
        return impl.checkpoint_format
    return "sharded" if strategy == "fsdp" else "full"


def prefetches(impl: ImplConfig, device: torch.device) -> bool:
    """impl.prefetch: auto is on for CUDA (the host works while the device computes) and off on a
    CPU, where the thread would take cores from the computation it is meant to hide behind."""
    return device.type == "cuda" if impl.prefetch == "auto" else bool(impl.prefetch)


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else f"{seconds // 60}:{seconds % 60:02d}"
