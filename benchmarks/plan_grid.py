"""The planner's pick against a grid: `cramlm plan` chooses a shape for a wall-clock budget, then
every shape of the grid trains for that budget on this machine and the held-out losses say whether
the pick was the best (the target: within 2% of the grid's best held-out loss).

Phases, each pinned (``taskset``, one thread per run, two runs side by side, so that every run and
the planner's measurement see one busy neighbour core, the condition the recipe's hour has):

1. the data once (``cramlm run RECIPE stages=[data]``), so that two runs do not build it at once;
2. ``cramlm plan`` (its own throughput measurement) on core 0 while the grid's first point trains on core 1;
3. the rest of the grid, two at a time: each point is exactly the run ``cramlm sweep RECIPE --sizes S
   --budgets B --name grid`` would make (``OUT/grid/<size>-<budget>``), so that
4. ``cramlm sweep`` then collects them (finished points are not trained again) into ``grid/sweep.json``
   (each point's distance to the best);
5. the plan again, in-process, with the grid's own measured tokens/s (no measurement): the law's
   pick given the throughputs the runs really had, apart from the planner's throughput probe.

Writes OUT/plan_grid.json and prints a table. Shared overrides after ``--`` go to every run and to the
planner (e.g. ``impl.data_cache=...``); batch 32 (the law's runs' batch) unless overridden.

    CRAMLM_DATA_DIR=../shared/data python benchmarks/plan_grid.py --out outputs/plan-grid \\
        -- impl.data_cache=outputs/plan-grid/data
    python benchmarks/plan_grid.py --summarize outputs/plan-grid     # the table again
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

from cramlm.pipeline.pinned import run_pinned  # two runs side by side, one core each
from cramlm.pipeline.scaling import size_overrides
from cramlm.pipeline.sweep import budget_overrides

SIZES = "128x4,192x4,256x4,320x4,256x6,384x6"
TARGET = 0.02  # the pick's held-out loss within 2% of the grid's best


def point_command(args, size: str) -> list[str]:
    """The `cramlm run` of one grid point, as `cramlm sweep` resolves it (sweep.point_config)."""
    return ["cramlm", "run", args.recipe, *args.overrides, *size_overrides(size), *budget_overrides(args.budget)[0],
            f"base_dir={args.out / 'grid'}", f"name={size}-{args.budget}", "stages=[data,pretrain]"]


def shared(args) -> list[str]:
    return ["train.batch_size=32", "impl.microbatch_size=32", "impl.threads=1", "impl.progress=false", *args.extra]


def run_grid(args, sizes: list[str]) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "settings.json").write_text(json.dumps({k: getattr(args, k) for k in ("recipe", "budget", "law", "overrides")}
                                                       | {"sizes": sizes}, indent=1) + "\n")
    first = point_command(args, sizes[0])
    subprocess.run([c if not c.startswith("stages=") else "stages=[data]" for c in first], check=True)
    plan_txt, running, rest = args.out / "plan.txt", {}, sizes
    if not plan_txt.is_file():  # the planner measures with one busy neighbour, as the runs train
        print("+", shlex.join(["taskset", "-c", "1", *first]), flush=True)
        running, rest = {1: subprocess.Popen(["taskset", "-c", "1", *first])}, sizes[1:]
        plan = ["taskset", "-c", "0", "cramlm", "plan", args.recipe, f"budget={args.budget}", *args.overrides,
                "--sizes", ",".join(sizes), *(["--law", args.law] if args.law else [])]
        print("+", shlex.join(plan), flush=True)
        text = subprocess.run(plan, check=True, capture_output=True, text=True).stdout
        plan_txt.write_text(text)
        print(text, flush=True)
    # the rest on core 0 as soon as the plan is done, beside the first point (finished points return at once)
    run_pinned([point_command(args, s) for s in rest], running)
    subprocess.run(["cramlm", "sweep", args.recipe, "--sizes", ",".join(sizes), "--budgets", args.budget,
                    "--name", "grid", "--no-report", f"base_dir={args.out}", *args.overrides], check=True)


def chosen_size(plan_text: str) -> str | None:
    """The shape `cramlm plan` marked '<- chosen' in its table."""
    for line in plan_text.splitlines():
        if "<- chosen" in line:  # '<- chosen' or '<- chosen (extrapolated)'
            return line.split()[0]
    return None


def summarize(args, sizes: list[str]) -> dict:
    from cramlm.pipeline.plan import plan
    from cramlm.pipeline.recipe import resolve_recipe

    grid = json.loads((args.out / "grid" / "sweep.json").read_text())
    points = {p["size"]: p for p in grid["points"]}
    best = min(points.values(), key=lambda p: p["loss"])
    measured = {s: p["tokens"] / json.loads((Path(p["run"]) / "summary.json").read_text())["train_seconds"]
                for s, p in points.items()}
    cfg = resolve_recipe(args.recipe, [f"budget={args.budget}", *args.overrides])
    replan = plan(cfg, args.recipe, list(points), args.law, measured, say=lambda *_: None)
    plan_text = (args.out / "plan.txt").read_text() if (args.out / "plan.txt").is_file() else ""
    picks = {"planner (its own throughput probe)": chosen_size(plan_text),
             "law with the grid's throughputs": replan["choice"]["size"]}
    predicted = {c["size"]: c["predicted_loss"] for c in replan["candidates"]}
    result = {"recipe": args.recipe, "budget": args.budget, "overrides": args.overrides, "best": best["size"],
              "target": TARGET, "law": replan["law"], "points": [], "picks": {}}
    for size in sizes:
        p = points.get(size)
        if p:
            result["points"].append({"size": size, "tokens": p["tokens"], "tokens_per_second": round(measured[size], 1),
                                     "loss": p["loss"], "vs_best": round(p["loss"] / best["loss"] - 1, 4),
                                     "predicted_loss": predicted.get(size)})
    for how, size in picks.items():
        gap = points[size]["loss"] / best["loss"] - 1 if size in points else None
        result["picks"][how] = {"size": size, "vs_best": None if gap is None else round(gap, 4),
                                "within_target": None if gap is None else gap <= TARGET}
    (args.out / "plan_grid.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def table(result: dict) -> str:
    lines = ["| shape | tokens | tokens/s | held-out loss | vs best | law's prediction |", "|---|---:|---:|---:|---:|---:|"]
    for p in result["points"]:
        pred = "-" if p["predicted_loss"] is None else f"{p['predicted_loss']:.3f}"
        lines.append(f"| {p['size']}{' (best)' if p['size'] == result['best'] else ''} | {p['tokens'] / 1e6:.2f}M | "
                     f"{p['tokens_per_second']:,.0f} | {p['loss']:.3f} | {100 * p['vs_best']:+.1f}% | {pred} |")
    for how, pick in result["picks"].items():
        verdict = "-" if pick["vs_best"] is None else (f"{100 * pick['vs_best']:+.1f}% of the best: "
                                                       + ("within" if pick["within_target"] else "outside") + " the 2% target")
        lines.append(f"\npick, {how}: {pick['size']} ({verdict})")
    return "\n".join(lines)


def main(argv: list[str]) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="cpu-1h-mlm")
    ap.add_argument("--budget", default="15m", help="the wall-clock budget of the plan and of every grid run")
    ap.add_argument("--sizes", default=SIZES, help="the grid's shapes HIDDENxLAYERS, comma-separated (six or more: the target is judged against a grid)")
    ap.add_argument("--law", help="the planner's law (default: the shipped one)")
    ap.add_argument("--out", type=Path, default=Path("outputs/plan-grid"))
    ap.add_argument("--summarize", type=Path, metavar="DIR", help="only the table, from the finished grid in DIR")
    ap.add_argument("extra", nargs="*", help="overrides for every run and the planner (after --)")
    args = ap.parse_args(argv)
    sizes = [s for s in args.sizes.split(",") if s]
    args.overrides = shared(args)
    if args.summarize:
        args.out = args.summarize
        if (args.out / "settings.json").is_file():  # what the grid ran with
            settings = json.loads((args.out / "settings.json").read_text())
            args.recipe, args.budget, args.law, args.overrides = (settings[k] for k in ("recipe", "budget", "law", "overrides"))
            sizes = settings["sizes"]
    args.out = args.out.resolve()
    if not args.summarize:
        run_grid(args, sizes)
    result = summarize(args, sizes)
    print(table(result))
    print(f"written: {args.out / 'plan_grid.json'}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
