"""``cramlm plan budget=1h``: the model a budget buys on this machine.

1. Measure this machine's training throughput (tokens/s) for a handful of candidate shapes: a few
   real training steps each (Trainer.train_step: masking, forward, backward, clipping, the recipe's
   optimizer) of the smallest batch the planner picks, in the run's microbatches, after warm-up
   steps, on random tokens at the recipe's vocabulary, sequence length and implementation settings
   (impl.precision / impl.threads resolve as in a run). Seconds per shape.
2. Predict each shape's validation MLM loss (the sweep's val_loss) after the budget from the Chinchilla law
   L(N, D) = E + A / N^a + B / D^b (N non-embedding parameters, D = tokens/s x budget), fitted by
   ``cramlm sweep`` to this project's own runs and shipped per optimizer (``LAWS``: the recipe's
   ``train.optim.type`` picks ``recipes/plan/scaling-cpu.yaml`` for Muon, ``scaling-cpu-adamw.yaml``
   for AdamW; each records the command that produced it; ``--law`` takes another, e.g. your own sweep.json).
3. Pick the lowest predicted loss; where several are predicted closer to it than the law's own error
   on its points, the one nearest the fitted runs. Print the table it chose from, why, and the command.

Batch, learning rate and masking rate are not fitted (the sweep held them fixed): the batch is the
largest power of two that still gives about ``MIN_UPDATES`` optimizer steps (cramming's failure on
slow hardware is too few updates); lr and masking rate are those the law's points were trained with
(its ``data`` block: ``optimizer``, ``lr``, ``mlm_probability``; a law without them was fitted with
bert-o4's AdamW at lr 1e-3 and 25% masking) when the recipe trains with the same optimizer; with
another optimizer the recipe keeps its own lr and masking (an lr does not carry from one optimizer
to another) and the plan says so.
"""

from __future__ import annotations

import math
import tempfile
import time
from dataclasses import asdict, dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

from cramlm.pipeline.scaling import chinchilla_law
from cramlm.run.config import format_hours

DEFAULT_SIZES = ["64x2", "96x3", "128x4", "192x4", "256x4", "384x6"]
LAW = "scaling-cpu.yaml"  # the Muon recipes' law (default, cpu-1h, cpu-1h-mlm); also for an optimizer without its own
LAWS = {"muon": LAW, "adamw": "scaling-cpu-adamw.yaml"}  # the shipped law fitted with each optimizer
MIN_UPDATES = 1000  # optimizer steps the batch rule aims for
LR, MASKING, OPTIMIZER = 1e-3, 0.25, "adamw"  # bert-o4's: what a law with no optimizer/lr/masking was fitted with
EXTRAPOLATION = 4.0  # a prediction further than this factor outside the fitted N or D range is flagged


@dataclass
class Candidate:
    size: str
    parameters: int
    non_embedding: int
    tokens_per_second: float
    tokens: float = 0.0  # trained in the budget
    predicted_loss: float = math.nan
    extrapolated: bool = False
    outside: float = 0.0  # how far N and D lie outside the fitted runs (sum of log-distances; 0 inside)


def default_law(optimizer: str | None = None) -> str | None:
    """The shipped law fitted with ``optimizer`` (a file name under recipes/plan/), or None for the
    base one (``LAW``): what a plan's key records, so that the base law's plans keep their keys."""
    name = LAWS.get(optimizer or "", LAW)
    return None if name == LAW else name


def load_law(path: str | Path | None = None, optimizer: str | None = None) -> dict[str, Any]:
    """The fitted L(N, D) constants: the shipped file fitted with ``optimizer`` (the recipe's
    ``train.optim.type``; ``LAWS``), another YAML of the same form, or a ``sweep.json`` written by
    ``cramlm sweep`` (its ``fit_nd``)."""
    import json

    from cramlm.config.loader import safe_load_text

    if path is None:
        name = default_law(optimizer) or LAW
        source = f"cramlm/recipes/plan/{name}"
        data = safe_load_text((files("cramlm") / "recipes" / "plan" / name).read_text(encoding="utf-8"), source)
    else:
        text = Path(path).read_text(encoding="utf-8")
        source = str(path)
        data = json.loads(text) if source.endswith(".json") else safe_load_text(text, source)
    fit = data.get("fit_nd") or data.get("law")
    if not isinstance(fit, dict) or not all(k in fit for k in ("E", "A", "a", "B", "b")):
        raise ValueError(f"{source}: no fitted L(N, D) constants (E, A, a, B, b); run `cramlm sweep` with 2+ sizes and 2+ token budgets")
    points = data.get("points") or []
    ranges = {}
    if points:
        for key, field in (("N", "non_embedding_parameters"), ("D", "tokens")):
            values = [p[field] for p in points if field in p]
            if values:
                ranges[key] = (min(values), max(values))
    residual = None  # the law's RMS relative error on its own points: differences below it are noise
    usable = [p for p in points if all(k in p for k in ("non_embedding_parameters", "tokens", "loss"))]
    if len(usable) >= 2:
        errors = [(p["loss"] - float(chinchilla_law(fit, p["non_embedding_parameters"], p["tokens"]))) / p["loss"] for p in usable]
        residual = math.sqrt(sum(e * e for e in errors) / len(errors))
    return {**fit, "source": source, "ranges": ranges, "data": data.get("data"), "command": data.get("command"),
            "residual": residual}


def law_hyperparameters(law: dict[str, Any]) -> dict[str, Any]:
    """The optimizer, lr, masking rate and objective the law's runs were trained with (its ``data`` block)."""
    data = law.get("data") if isinstance(law.get("data"), dict) else {}
    return {"optimizer": str(data.get("optimizer", OPTIMIZER)), "lr": float(data.get("lr", LR)),
            "mlm_probability": float(data.get("mlm_probability", MASKING)), "objective": str(data.get("objective", "mlm"))}


def planned_hyperparameters(cfg, law: dict[str, Any]) -> dict[str, Any]:
    """lr and masking for the plan: the law's runs' where the recipe has their optimizer, else the
    recipe's own (``same_optimizer`` says which)."""
    hp = law_hyperparameters(law)
    if hp["optimizer"] == cfg.train.optim.type:
        return {**hp, "same_optimizer": True}
    return {"optimizer": cfg.train.optim.type, "lr": float(cfg.train.optim.lr),
            "mlm_probability": float(cfg.train.mlm_probability), "same_optimizer": False, "law_optimizer": hp["optimizer"]}


def shape(spec: str) -> tuple[int, int]:
    from cramlm.pipeline.scaling import size_overrides

    size_overrides(spec)  # validates
    hidden, layers = spec.split("x")
    return int(hidden), int(layers)


BATCH_RANGE = (32, 8192)  # sequences: the smallest and largest batch the planner picks


def batch_for(tokens: float, seq_len: int, min_updates: int = MIN_UPDATES, lo: int = BATCH_RANGE[0],
              hi: int = BATCH_RANGE[1]) -> int:
    """The largest power-of-two batch (sequences) that still gives ``min_updates`` steps, in [lo, hi]."""
    per_step = tokens / (min_updates * seq_len)
    batch = 2 ** int(math.floor(math.log2(per_step))) if per_step >= 1 else 1
    return int(min(hi, max(lo, batch)))


def microbatch_for(batch: int, micro: int) -> int:
    """The largest microbatch <= ``micro`` that divides ``batch`` (halving)."""
    micro = min(batch, micro)
    while batch % micro:
        micro //= 2
    return micro


def batch_reason(batch: int, steps: float) -> str:
    """Why the batch is what it is, with the optimizer steps it gives at this budget."""
    if batch == BATCH_RANGE[0] and steps < MIN_UPDATES:
        return (f"batch {batch} sequences, the smallest the planner picks: {steps:,.0f} optimizer steps, "
                f"fewer than the {MIN_UPDATES:,} it aims for")
    if batch == BATCH_RANGE[1]:
        return f"batch {batch} sequences, the largest the planner picks: {steps:,.0f} optimizer steps"
    return f"batch {batch} sequences: the largest power of two giving at least {MIN_UPDATES:,} optimizer steps ({steps:,.0f})"


def rank(candidates: list[Candidate], law: dict[str, Any], seconds: float) -> list[Candidate]:
    """Fill in tokens and predicted loss for a budget of ``seconds``; best first."""
    ranges = law.get("ranges", {})
    for c in candidates:
        c.tokens = c.tokens_per_second * seconds
        c.predicted_loss = float(chinchilla_law(law, c.non_embedding, c.tokens))
        c.extrapolated = any(
            key in ranges and not (ranges[key][0] / EXTRAPOLATION <= value <= ranges[key][1] * EXTRAPOLATION)
            for key, value in (("N", c.non_embedding), ("D", c.tokens))
        )
        c.outside = sum(max(0.0, math.log(ranges[key][0] / value), math.log(value / ranges[key][1]))
                        for key, value in (("N", c.non_embedding), ("D", c.tokens)) if key in ranges and value > 0)
    return sorted(candidates, key=lambda c: c.predicted_loss)


def choose(ranked: list[Candidate], law: dict[str, Any]) -> tuple[Candidate, list[Candidate]]:
    """The pick and the candidates it was picked among. Predictions closer to the best than the
    law's own error on its points (``residual``) cannot be told apart, so among those the shape
    nearest the fitted runs wins (its prediction is interpolated, not extrapolated), then the lower
    prediction. Flagged extrapolations only when nothing else is left."""
    pool = [c for c in ranked if not c.extrapolated] or ranked
    best = pool[0].predicted_loss
    tied = [c for c in pool if c.predicted_loss <= best * (1 + (law.get("residual") or 0.0))]
    return min(tied, key=lambda c: (round(c.outside, 6), c.predicted_loss)), tied


def table(ranked: list[Candidate], chosen: Candidate) -> str:
    header = ["shape", "params", "non-emb", "tokens/s", "tokens in budget", "tokens/param", "predicted loss", "note"]
    rows = [[c.size, f"{c.parameters / 1e6:.2f}M", f"{c.non_embedding / 1e6:.3f}M", f"{c.tokens_per_second:,.0f}",
             f"{c.tokens / 1e6:,.1f}M", f"{c.tokens / max(c.non_embedding, 1):,.0f}", f"{c.predicted_loss:.3f}",
             ("<- chosen" if c is chosen else "") + (" (extrapolated)" if c.extrapolated else "")] for c in ranked]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(v.rjust(w) if 0 < i < 7 else v.ljust(w) for i, (v, w) in enumerate(zip(r, widths))).rstrip()
             for r in [header, *rows]]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def model_parameters(arch: dict, vocab: int) -> tuple[int, int]:
    """(all, non-embedding) parameters of an arch config, counted on the meta device."""
    import torch

    from cramlm.config.registry import config_class
    from cramlm.models.base import build_model
    from cramlm.pipeline.scaling import non_embedding_parameters

    with torch.device("meta"):
        model = build_model(config_class("model", arch["type"]).model_validate(arch), vocab)
    return sum(p.numel() for p in model.parameters()), non_embedding_parameters(model)


def step_trainer(cfg, arch: dict, vocab: int, micro: int, steps: int, run_dir: Path, device=None, batch: int | None = None):
    """A trainer of ``arch`` with the run's own model, collator and optimizer (``cramlm.run.build``'s
    builders: an RTD recipe (train.objective=rtd) gets its generator and detector, a causal arch
    causal batches) fed ``steps`` batches of ``batch`` (default ``micro``) random token blocks in
    microbatches of ``micro``, for timing real training steps (``trainer.train_step(batch // micro)``)."""
    import numpy as np
    import torch

    from cramlm.config.registry import config_class
    from cramlm.data.tokenizer import SPECIAL_TOKENS
    from cramlm.run.build import make_collator, run_model
    from cramlm.train.build import build_trainer
    from cramlm.train.batches import StepData

    seq = cfg.data.seq_length

    class RandomBlocks:
        def __init__(self, n: int, seed: int):
            self.blocks = np.random.default_rng(seed).integers(len(SPECIAL_TOKENS), vocab, size=(n, seq), dtype=np.int64)

        def __len__(self) -> int:
            return len(self.blocks)

        def batch(self, indices) -> torch.Tensor:
            return torch.from_numpy(self.blocks[np.asarray(indices)])

    torch.manual_seed(0)
    device = torch.device(device or "cpu")
    run = cfg.model_copy(update={"arch": config_class("model", arch["type"]).model_validate(arch)})
    model = run_model(run, vocab, device)
    collate = make_collator(run, vocab, 0)
    batch = batch or micro
    data = StepData(RandomBlocks(batch * steps, 0), collate, 0)
    train = cfg.train.model_copy(update={"batch_size": batch, "batch_ramp": 0.0, "min_updates": 0,
                                         "budget": cfg.train.budget.model_copy(update={"steps": 10**9, "tokens": None, "flops": None})})
    impl = cfg.impl.model_copy(update={"microbatch_size": micro, "progress": False, "compile": False})
    sample = {k: v.to(device) for k, v in collate(RandomBlocks(2, 1).batch([0, 1])).items()}
    trainer = build_trainer(model, data, train, impl, run_dir, sample=sample)
    trainer.model.train()
    return trainer


def measure_throughput(cfg, arch: dict, vocab: int, batch: int = BATCH_RANGE[0], micro: int | None = None,
                       warmup: int = 3, steps: int = 5, device=None) -> float:
    """Tokens/s of a few real training steps (median) of ``arch`` on random tokens, on ``device``
    (default: the CPU), the run's own model, batches and optimizer (:func:`step_trainer`). A step is
    the smallest batch the planner picks, in the run's microbatches (``impl.microbatch_size``): a
    step's fixed costs (Muon's Newton-Schulz, the optimizer, clipping) weigh as in the run, not twice
    as much as at a half batch; three warm-up steps (the first ones are slow: lazy state, caches).
    A probe of half a batch with one warm-up step measured 128x4 at 6,205 tokens/s where its
    15-minute run trained at 11,281, and steered the pick off the best shape
    (benchmarks/results/plan_grid_15m_muon.md)."""
    import torch

    device = torch.device(device or "cpu")
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    micro = microbatch_for(batch, micro or cfg.impl.microbatch_size)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = step_trainer(cfg, arch, vocab, micro, warmup + steps, Path(tmp), device, batch=batch)
        seconds = []
        for i in range(warmup + steps):
            sync()
            start = time.perf_counter()
            trainer.train_step(batch // micro)
            sync()
            if i >= warmup:
                seconds.append(time.perf_counter() - start)
    seconds.sort()
    return batch * cfg.data.seq_length / seconds[len(seconds) // 2]


def plan(cfg, recipe: str, sizes: list[str] | None = None, law_path: str | None = None,
         throughput: dict[str, float] | None = None, say=print) -> dict[str, Any]:
    """Measure (unless ``throughput`` is given), rank, print; returns the choice and the table.
    ``cfg`` is the resolved run config (``resolve_recipe``), ``recipe`` its name for the command."""
    from cramlm.pipeline.scaling import size_overrides

    if not cfg.budget:
        raise ValueError("cramlm plan needs a wall-clock budget, e.g. budget=1h or budget=15m")
    seconds = cfg.budget * 3600
    law = load_law(law_path, cfg.train.optim.type)
    sizes = sizes or (list(throughput) if throughput else DEFAULT_SIZES)
    ranked = rank(measure_candidates(cfg, sizes, throughput, say), law, seconds)
    chosen, tied = choose(ranked, law)
    hidden, layers = shape(chosen.size)
    batch = batch_for(chosen.tokens, cfg.data.seq_length)
    micro = microbatch_for(batch, cfg.impl.microbatch_size)
    hp = planned_hyperparameters(cfg, law)
    choice = {"size": chosen.size, "batch_size": batch, "microbatch_size": micro, "optimizer": hp["optimizer"],
              "lr": hp["lr"], "mlm_probability": hp["mlm_probability"]}
    why = reasons(cfg, law, ranked, chosen, tied, batch)
    overrides = [*size_overrides(chosen.size), f"train.batch_size={batch}", f"impl.microbatch_size={micro}",
                 f"train.optim.lr={hp['lr']:g}", f"train.mlm_probability={hp['mlm_probability']:g}"]
    command = f"cramlm run {recipe} budget={format_hours(cfg.budget)} " + " ".join(overrides)
    say(table(ranked, chosen))
    for line in why:
        say("- " + line)
    say(f"run it: {command}")
    return {"choice": choice, "overrides": overrides, "command": command, "why": why, "law": {k: law[k] for k in ("E", "A", "a", "B", "b", "source")},
            "candidates": [asdict(c) for c in ranked], "hidden": hidden, "layers": layers}


def measure_candidates(cfg, sizes: list[str], throughput: dict[str, float] | None, say=print) -> list[Candidate]:
    """Each shape of ``sizes`` as the recipe's crammed-bert at that width and depth: its parameters
    and its training throughput (measured on this machine unless ``throughput`` gives it)."""
    from cramlm.pipeline.scaling import size_overrides

    vocab = cfg.data.tokenizer.vocab_size
    base = cfg.arch.model_dump(mode="json")
    if base.get("type") != "crammed-bert":
        raise ValueError(f"cramlm plan plans masked-LM runs (arch type crammed-bert), not '{base.get('type')}'")
    device = None
    if throughput is None:
        from cramlm.train.impl import setup_device

        device = setup_device(cfg.impl)  # the run's device, and threads as the run will have them
    out = []
    for size in sizes:
        shape(size)
        arch = dict(base)
        for override in size_overrides(size):
            key, value = override.split("=")
            arch[key.split(".", 1)[1]] = int(value)
        total, non_embedding = model_parameters(arch, vocab)
        if throughput is not None:
            if size not in throughput:
                raise ValueError(f"no throughput given for shape {size}")
            tps = throughput[size]
        else:
            say(f"cramlm plan: measuring {size} ...")
            tps = measure_throughput(cfg, arch, vocab, device=device)
        out.append(Candidate(size, total, non_embedding, tps))
    return out


def reasons(cfg, law: dict[str, Any], ranked: list[Candidate], chosen: Candidate, tied: list[Candidate],
            batch: int) -> list[str]:
    """Why this shape and batch, one line each (printed, and kept in plan.json)."""
    vocab = cfg.data.tokenizer.vocab_size
    hp = planned_hyperparameters(cfg, law)
    # lower predictions the planner passed over because they are extrapolated are named as such, not as runners-up
    passed = [c for c in ranked if c.extrapolated and not chosen.extrapolated and c.predicted_loss < chosen.predicted_loss]
    runner_up = next((c for c in ranked if c is not chosen and c not in passed), None)
    why = [
        f"budget {format_hours(cfg.budget)}; vocab {vocab}, sequences of {cfg.data.seq_length} tokens; law {law['source']}: "
        f"L = {law['E']:.3g} + {law['A']:.3g}/N^{law['a']:.3f} + {law['B']:.3g}/D^{law['b']:.3f}"
        + (f" (R^2 {law['r2']:.3f})" if "r2" in law else ""),
        (f"{chosen.size} has the lowest predicted validation MLM loss ({chosen.predicted_loss:.3f})"
         + (" of the shapes inside the fitted range" if passed else "")
         + (f", {runner_up.predicted_loss - chosen.predicted_loss:.3f} below {runner_up.size}" if runner_up else "")
         + (f" (lower but extrapolated: {', '.join(f'{c.size} {c.predicted_loss:.3f}' for c in passed)})" if passed else "")
         if len(tied) == 1 else
         f"{', '.join(c.size for c in tied)} are predicted within the law's error on its own points "
         f"({100 * (law.get('residual') or 0):.1f}% RMS) of the best ({tied[0].predicted_loss:.3f}), so no prediction "
         f"tells them apart; {chosen.size} ({chosen.predicted_loss:.3f}) lies nearest the runs the law was fitted to")
        + f": {chosen.tokens / 1e6:,.1f}M tokens at {chosen.tokens_per_second:,.0f} tokens/s, "
        f"{chosen.tokens / max(chosen.non_embedding, 1):,.0f} per non-embedding parameter",
        batch_reason(batch, chosen.tokens / (batch * cfg.data.seq_length))
        + (f"; {hp['optimizer']} at lr {hp['lr']:g} and masking {hp['mlm_probability']:.0%}: what the law's runs were "
           "trained with (not fitted)" if hp["same_optimizer"] else
           f"; {hp['optimizer']} at lr {hp['lr']:g} and masking {hp['mlm_probability']:.0%}: the recipe's own"),
    ]
    if not hp["same_optimizer"]:
        why.append(f"note: the law was fitted with train.optim.type={hp['law_optimizer']}, the recipe trains with "
                   f"{hp['optimizer']}: its shape ranking is used, its lr is not (an lr does not carry across optimizers)")
    fitted_on = law_hyperparameters(law)["objective"]
    if cfg.train.objective != fitted_on:
        why.append(f"note: the law was fitted on {fitted_on} runs, the recipe trains with train.objective={cfg.train.objective}: "
                   f"each shape is ranked by the {fitted_on} loss its measured tokens would buy (its own step timed), "
                   "a proxy not checked against runs of this objective")
    if any(c.extrapolated for c in ranked):
        why.append(f"(extrapolated): N or D more than {EXTRAPOLATION:g}x outside the fitted runs; chosen only if nothing else is left")
    if law.get("data") and isinstance(law["data"], dict) and law["data"].get("vocab_size") not in (None, vocab):
        why.append(f"note: the law was fitted at vocab {law['data']['vocab_size']}, this plan is for vocab {vocab}")
    return why
