"""Counted FLOPs per second of recipe contenders, their training steps interleaved (A B A B ...) in
one process on one machine: the wall-clock side of a compute multiplier.

A compute multiplier m (benchmarks/recipe_ablation.py) says the baseline needs m times the
candidate's FLOPs, both counted the way the budget counts them (the model's FLOPs per token x tokens
+ the optimizer's FLOPs per step: Muon's Newton-Schulz). At rates r (counted FLOPs per second) the
baseline then needs m x r_candidate / r_baseline times the candidate's seconds: that ratio is the
wall-clock multiplier. Runs of an ablation measure their seconds too, but a run beside other work
measures that work (the same run took 445 to 762 s on this VM); steps interleaved in one process
see the same load, so their ratio holds on a busy machine. Each contender is the run's own model,
collator and optimizer (``cramlm.pipeline.plan.step_trainer``), its whole batch as one microbatch,
on random tokens at a small lr (time does not depend on the text).

    python benchmarks/contender_steps.py --recipe cpu-1h-mlm --size 384x6 --threads 1 \\
        --contender adamw train.optim.type=adamw \\
        --contender muon-full train.optim.type=muon arch.qk_norm=true arch.zero_init_out=true train.optim.split_fused=true \\
        --ablation outputs/r25-384x6/ablation.json      # + the wall-clock multiplier of its candidates
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path


def build(recipe: str, overrides: list[str], root: Path, steps: int):
    from cramlm.pipeline.plan import step_trainer
    from cramlm.pipeline.recipe import resolve_recipe

    cfg = resolve_recipe(recipe, overrides)
    trainer = step_trainer(cfg, cfg.arch.model_dump(), cfg.data.tokenizer.vocab_size, cfg.train.batch_size,
                           steps, root)  # on the CPU
    costs = trainer.meter.costs
    per_step = costs.flops_per_token * cfg.train.batch_size * cfg.data.seq_length + costs.optimizer_flops_per_step
    return trainer, per_step, costs.optimizer_flops_per_step / per_step


def main(argv: list[str]) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="cpu-1h-mlm")
    ap.add_argument("--size", help="HIDDENxLAYERS for every contender")
    ap.add_argument("--overrides", nargs="*", default=[], help="cramlm overrides shared by every contender")
    ap.add_argument("--contender", nargs="+", action="append", required=True, metavar=("NAME", "OVERRIDE"),
                    help="a contender's name and overrides; the first is the one the ratios are taken against")
    ap.add_argument("--threads", type=int, default=1, help="impl.threads of every contender (one pinned core: 1)")
    ap.add_argument("--steps", type=int, default=12, help="timed steps per contender")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--ablation", type=Path, help="an ablation.json: its candidates' compute multipliers times the ratios")
    ap.add_argument("--out", type=Path, help="JSON file to write")
    args = ap.parse_args(argv)

    import torch

    from cramlm.pipeline.scaling import size_overrides
    from cramlm.train.flops import time_interleaved

    shared = [*(size_overrides(args.size) if args.size else []), *args.overrides, f"impl.threads={args.threads}",
              "impl.progress=false"]
    torch.set_num_threads(args.threads)
    steps, counted, ns_share = {}, {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, *extra in args.contender:
            trainer, counted[name], ns_share[name] = build(args.recipe, [*shared, *extra], Path(tmp) / name, args.warmup + args.steps)

            def step(trainer=trainer):
                for group in trainer.optimizer.param_groups:
                    group["lr"] = 1e-4  # random tokens: a small step keeps the weights finite
                trainer.train_step(1)

            steps[name] = step
        times = time_interleaved(steps, args.warmup, args.steps, torch.device("cpu"))
    first = args.contender[0][0]
    rows = {}
    for name in steps:
        rate = [counted[name] / t for t in times[name]]
        pairs = [counted[name] / t / (counted[first] / t0) for t, t0 in zip(times[name], times[first])]  # round by round
        rows[name] = {"seconds_per_step": statistics.median(times[name]), "counted_flops_per_step": counted[name],
                      "optimizer_share_of_flops": ns_share[name], "counted_flops_per_second": statistics.median(rate),
                      "rate_vs_first": {"median": statistics.median(pairs), "min": min(pairs), "max": max(pairs)}}
    result = {"recipe": args.recipe, "size": args.size, "threads": args.threads, "torch": torch.__version__,
              "steps": args.steps, "contenders": {n: e for n, *e in args.contender}, "rows": rows}
    lines = ["| contender | s/step | counted GFLOP/step | optimizer share | counted GFLOP/s | rate vs " + first
             + " (median, min-max over rounds) |", "|---|---:|---:|---:|---:|---:|"]
    for name, r in rows.items():
        v = r["rate_vs_first"]
        lines.append(f"| {name} | {r['seconds_per_step']:.3f} | {r['counted_flops_per_step'] / 1e9:.1f} | "
                     f"{r['optimizer_share_of_flops']:.1%} | {r['counted_flops_per_second'] / 1e9:.1f} | "
                     f"{v['median']:.3f} ({v['min']:.3f}-{v['max']:.3f}) |")
    if args.ablation:
        ablation = json.loads(args.ablation.read_text())
        result["wall_clock_multiplier"] = {}
        for name, e in ablation["contenders"].items():
            m = e.get("multiplier_flops")
            if name in rows and m and name != first:
                bound = {"lower": ">=", "upper": "<="}.get((m["bounds"] or [None])[0], "")
                per_seed = {s: v["multiplier"] * rows[name]["rate_vs_first"]["median"] for s, v in m["per_seed"].items()}
                result["wall_clock_multiplier"][name] = {"median": statistics.median(per_seed.values()), "per_seed": per_seed,
                                                         "bound": bound or None, "compute_multiplier": m["median"]}
                lines.append(f"\n{name}: compute multiplier {bound}{m['median']:.2f}x x rate {rows[name]['rate_vs_first']['median']:.3f}"
                             f" = wall-clock multiplier {bound}{statistics.median(per_seed.values()):.2f}x (per seed: "
                             + ", ".join(f"s{s} {v:.2f}" for s, v in per_seed.items()) + ")")
    print("\n".join(lines))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
