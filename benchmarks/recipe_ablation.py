"""Recipe ablation: a baseline and candidates (each a list of cramlm overrides) trained on the same
data, tokenizer and model shape at equal FLOPs (the optimizer's FLOPs counted: Muon's Newton-Schulz
is in each run's ``flops``) or at equal wall-clock, with an lr sweep and seeds per contender; loss
against FLOPs curves (PNG + JSON) and the **compute multiplier** of each candidate
(cramlm.pipeline.scaling.compute_multiplier, on the baseline's curve or its frontier).

The multiplier of a candidate = FLOPs the baseline needs to reach the candidate's final held-out
loss, read off the baseline's own validation curve (linear in log-FLOPs between its two points
around that loss), divided by the candidate's FLOPs. A candidate that ends below the baseline's
last point needs the curve extended: with ``--extrapolate`` its last segment is continued in
log-FLOPs and the number is flagged ``extrapolated``; without, the multiplier is given as a lower
bound (``>=``, the baseline's final FLOPs over the candidate's). The same is computed on seconds
(the wall-clock multiplier; meaningful when the runs shared the machine alike: ``--parallel``).
A single run's curve flatters a candidate (its middle is not annealed: the schedule decays only at
the end of its own budget), so ``--baseline-budgets 2 4`` also trains the baseline, at the best lr
of its sweep, with its own full schedule at 2x and 4x the budget (``<name>-lr<LR>-s<S>-x2``): the
multiplier is then read off that frontier of final losses (``source: "frontier"``) and the
single-curve figure is kept beside it (``multiplier_flops_curve``). The sweep's best lr is the
best at 1x, not at 4x (a longer run takes a larger lr: at 128x4 and 120 steps AdamW's 4x run
ended 0.2 nats lower at twice its 1x-best lr), so ``--baseline-budget-lr-factors 1 2`` trains
each larger budget at the best lr and at twice it, and each budget's frontier point is the lower.
Each contender is judged at the lr of its own sweep with the lowest mean final loss over seeds; a
multiplier is per seed (baseline seed s against candidate seed s), summarised by the median. A
candidate of another objective than the baseline's (``train.objective=rtd``: its held-out loss is
its generator's MLM loss) gets no multiplier and stays off the plot: judge it downstream.

Every run is ``cramlm run RECIPE stages=[data,pretrain]`` with the shared overrides, the size,
the budget, the contender's overrides, ``train.optim.lr=LR`` and ``seed=S``, in
``OUT/<contender>-lr<LR>-s<S>``; finished runs (summary.json present) are not run again and a
stopped one continues from its last checkpoint (``--resume auto``), so an interrupted ablation resumes. ``--parallel``: two runs at a time, each pinned to one core
(taskset) with impl.threads=1 (cramlm.pipeline.pinned.run_pinned).

    python benchmarks/recipe_ablation.py --smoke --parallel            # about a minute (mostly set-up): the machinery
    CRAMLM_DATA_DIR=../shared/data python benchmarks/recipe_ablation.py --recipe cpu-1h-mlm --size 128x4 \\
        --flops 2e13 --lrs 1e-3 3e-3 1e-2 --seeds 0 1 --parallel --out outputs/ablation-muon \\
        --baseline adamw --candidate muon train.optim.type=muon --lrs-for muon 3e-3 1e-2 3e-2
    python benchmarks/recipe_ablation.py --summarize outputs/ablation-muon   # curves and table again
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

from cramlm.io import write_result
from cramlm.pipeline.pinned import run_pinned  # two runs side by side, one core each
from cramlm.pipeline.scaling import best_lr_frontier, compute_multiplier, size_overrides

# the smoke mode: a tiny model on a slice of the shipped corpus, a few optimizer steps per run
SMOKE = ["data.max_entries_in_raw_dataset=40", "data.tokenizer.vocab_size=512", "data.seq_length=32",
         "arch.max_seq_length=32", "train.batch_size=8", "impl.microbatch_size=8", "train.min_updates=0",
         "train.validate_sequences=16", "train.log_every=1", "impl.precision=fp32", "train.checkpoint_minutes=null"]


# ---- runs ----------------------------------------------------------------------------------------

def run_name(contender: str, lr: float, seed: int, times: float = 1) -> str:
    return f"{contender}-lr{lr:g}-s{seed}" + (f"-x{times:g}" if times != 1 else "")


def budget_args(args, times: float = 1) -> list[str]:
    """The budget overrides of a run at ``times`` the ablation's budget (FLOPs, or the wall clock)."""
    if args.flops:
        return ["budget=null", f"train.budget.flops={args.flops * times:g}"]
    return [f"budget={args.clock}"] if args.clock else []


def plan(args) -> list[dict]:
    """One entry per run: its contender, lr, seed, folder and command."""
    shared = [f"base_dir={args.out}", f"impl.data_cache={args.out / 'data'}", "impl.progress=false",
              "stages=[data,pretrain]", f"train.validate_every={args.validate_every}", *args.overrides]
    if args.smoke:
        shared += SMOKE
    if args.size:
        shared += size_overrides(args.size)
    if args.parallel:
        shared.append("impl.threads=1")

    runs = []
    for name, extra in args.contenders.items():
        if name == args.baseline[0] and getattr(args, "stored_baseline", None):
            continue  # measured before (--baseline-from): its runs are not trained again
        for key in (o.split("=", 1)[0] for o in extra):
            if key.startswith("data") or key in {f"arch.{k}" for k in ("hidden_size", "num_layers", "num_heads", "intermediate_size")}:
                raise SystemExit(f"Error: contender {name}: '{key}' would change the data or the model shape; "
                                 "contenders share both (set them for all with --overrides or --size)")
        for lr in args.lrs_of.get(name, args.lrs):
            for seed in args.seeds:
                if seed in args.only_best_for_seeds and lr != getattr(args, "best_lrs", {}).get(name):
                    continue  # this seed confirms the sweep's best lr only (known after the sweep)
                folder = args.out / run_name(name, lr, seed)
                cmd = ["cramlm", "run", args.recipe, *shared, *budget_args(args), *extra, f"train.optim.lr={lr:g}",
                       f"seed={seed}", f"name={folder.name}", "--resume", "auto"]
                runs.append({"contender": name, "lr": lr, "seed": seed, "folder": folder, "cmd": cmd, "times": 1})
    base_lr = getattr(args, "baseline_lr", None)
    if base_lr is not None and not getattr(args, "stored_baseline", None):  # the baseline at larger budgets, its own full schedule each
        name, extra = args.baseline[0], args.contenders[args.baseline[0]]
        for times in args.baseline_budgets:
            for factor in getattr(args, "baseline_budget_lr_factors", None) or [1.0]:  # its best lr, and more where asked
                lr = float(f"{base_lr * factor:g}")
                for seed in args.baseline_budget_seeds or args.seeds:
                    folder = args.out / run_name(name, lr, seed, times)
                    cmd = ["cramlm", "run", args.recipe, *shared, *budget_args(args, times), *extra, f"train.optim.lr={lr:g}",
                           f"seed={seed}", f"name={folder.name}", "--resume", "auto"]
                    runs.append({"contender": name, "lr": lr, "seed": seed, "folder": folder, "cmd": cmd, "times": times})
    return runs


def run_all(args, runs: list[dict]) -> None:
    # the longest runs first, so that two lanes end together (a 2x run last would leave one idle)
    todo = [r["cmd"] for r in sorted(runs, key=lambda r: -r.get("times", 1)) if not (r["folder"] / "summary.json").is_file()
            and (not args.only or r["folder"].name in args.only)]
    if not todo:
        return
    data = [c for c in todo[0] if not c.startswith(("stages=", "name="))] + ["stages=[data]", "name=data"]
    print("+", shlex.join(data), flush=True)
    subprocess.run(data, check=True)  # the data once, before two processes want it
    if args.parallel:
        run_pinned(todo)
    else:
        for cmd in todo:
            print("+", shlex.join(cmd), flush=True)
            subprocess.run(cmd, check=True)


# ---- curves and the summary ----------------------------------------------------------------------

def curve(folder: Path) -> dict:
    """A run's held-out curve: FLOPs (tokens x FLOPs per token + steps x the optimizer's FLOPs per
    step, as the budget counts them), counted seconds, tokens and val_loss at each validation."""
    from cramlm.report.rundata import is_number, load_run_data

    run = load_run_data(folder)
    s = run.summary
    fpt, opt = float(s["flops_per_token"]), float(s.get("optimizer_flops_per_step") or 0.0)
    points = [m for m in run.metrics if m.get("kind") == "val" and is_number(m.get("val_loss"))]
    return {"objective": run.objective,  # rtd (ELECTRA): val_loss is its generator's MLM loss
            "flops": [m["tokens"] * fpt + m["step"] * opt for m in points], "seconds": [m.get("elapsed") for m in points],
            "tokens": [m["tokens"] for m in points], "val_loss": [m["val_loss"] for m in points],
            "final": {"flops": s["flops"], "seconds": s["train_seconds"], "tokens": s["tokens"], "val_loss": s.get("val_loss"),
                      "steps": s["steps"], "tokens_per_second": s.get("tokens_per_second"), "mfu": s.get("mfu"),
                      "optimizer_flops_per_step": opt, "flops_per_token": fpt}}


NOT_TRAINING = {"lr", "log_every", "validate_every", "checkpoint_every", "checkpoint_minutes", "keep_checkpoints"}


def trained(args, name: str) -> dict:
    """What a contender trains: the ``arch`` and ``train`` sections of its resolved config (the swept
    lr and the logging, validation and checkpoint cadence aside), flattened to dotted keys. Overrides
    are text: the same ``train.optim.type=adamw`` means another model once the recipe's defaults
    change (cpu-1h took qk_norm), so a stored baseline is checked on this, not on its overrides alone."""
    from cramlm.pipeline.recipe import resolve_recipe
    from cramlm.train.checkpoint import flat

    cfg = resolve_recipe(args.recipe, [*args.overrides, *(SMOKE if getattr(args, "smoke", False) else []),
                                       *(size_overrides(args.size) if args.size else []), *budget_args(args), *args.contenders[name]])
    tree = flat({"arch": cfg.arch.model_dump(mode="json"), "train": cfg.train.model_dump(mode="json")})
    return {key: value for key, value in tree.items() if key.rsplit(".", 1)[-1] not in NOT_TRAINING}


# (stored name, today's name) of a recipe whose stored ablations name it otherwise: the committed
# MLM ablations say cpu-1h for today's cpu-1h-mlm (cpu-1h trains ELECTRA's objective; docs/results.md)
RENAMED = {("cpu-1h", "cpu-1h-mlm")}


def stored_baseline(path: Path, args) -> dict:
    """The baseline of a finished ablation (its ablation.json, or a copy under benchmarks/results):
    its runs' curves and its frontier, checked to be the same recipe, size, budget, overrides and
    baseline contender as this ablation's, so that only the candidates need training."""
    try:
        stored = json.loads(path.read_text())
        st, name = stored["settings"], stored["baseline"]
        entry = stored["contenders"][name]
    except (OSError, ValueError, KeyError) as e:
        raise SystemExit(f"Error: --baseline-from {path}: not a finished ablation's JSON ({e})") from None
    mine = {"recipe": args.recipe, "size": args.size, "flops": args.flops, "clock": args.clock,
            "overrides": args.overrides, "baseline overrides": args.contenders.get(name)}
    theirs = {**{k: st.get(k) for k in ("recipe", "size", "flops", "clock", "overrides")},
              "baseline overrides": st["contenders"].get(name)}
    if name != args.baseline[0]:
        raise SystemExit(f"Error: --baseline-from {path}: its baseline is '{name}', this ablation's is '{args.baseline[0]}'")
    stored_trained = (st.get("trained") or {}).get(name)
    if mine["recipe"] != theirs["recipe"] and (stored_trained or (theirs["recipe"], mine["recipe"]) in RENAMED):
        mine["recipe"] = theirs["recipe"]  # a recipe's name is a label: what it trained is compared below (or renamed)
    if diff := [k for k in mine if k != "overrides" and mine[k] != theirs[k]]:
        raise SystemExit(f"Error: --baseline-from {path}: {', '.join(f'{k} {theirs[k]!r} there, {mine[k]!r} here' for k in diff)}")
    # the shared overrides may differ in where the data cache lives, threads, progress and the logging,
    # validation and checkpoint cadence (NOT_TRAINING), never in what is trained
    where = ("impl.data_cache=", "impl.threads=", "impl.progress=", *(f"train.{k}=" for k in sorted(NOT_TRAINING - {"lr"})))
    if [o for o in mine["overrides"] if not o.startswith(where)] != [o for o in (theirs["overrides"] or []) if not o.startswith(where)]:
        raise SystemExit(f"Error: --baseline-from {path}: shared overrides {theirs['overrides']} there, {mine['overrides']} here")
    if stored_trained:  # the same words may mean another model today
        now = (getattr(args, "settings_trained", None) or {}).get(name) or trained(args, name)
        if diff := sorted(k for k in stored_trained.keys() | now.keys() if stored_trained.get(k) != now.get(k)):
            raise SystemExit(f"Error: --baseline-from {path}: its baseline trained another config than '{name}' resolves to "
                             f"now: {', '.join(f'{k} {stored_trained.get(k)!r} there, {now.get(k)!r} here' for k in diff[:4])}"
                             + (f" (and {len(diff) - 4} more)" if len(diff) > 4 else ""))
    else:
        print(f"note: --baseline-from {path} records no resolved config (written before they were): its baseline's "
              "overrides are compared as text only; check that the recipe's defaults have not changed since", file=sys.stderr)
    return {"path": str(path), "entry": entry, "frontier": stored.get("baseline_frontier") or {}, "trained": stored_trained or None}


def summarize(out: Path, runs: list[dict], baseline: str, extrapolate: bool, sweep_seeds=None, stored=None) -> dict:
    curves, larger = {}, {}  # larger: the baseline's runs at multiples of the budget, (lr, seed) -> [final]
    if stored:  # the baseline measured before (--baseline-from): its curves and its frontier's larger budgets
        entry = stored["entry"]
        curves[baseline] = {float(lr): {int(s): c for s, c in seeds.items()} for lr, seeds in entry["runs"].items()}
        for seed, finals in stored["frontier"].items():
            larger.setdefault(int(seed), []).extend({"lr": entry["best_lr"], **f} for f in finals[1:])
    for r in runs:
        if (r["folder"] / "summary.json").is_file():
            if r.get("times", 1) != 1:  # the baseline at a larger budget, at some lr
                larger.setdefault(r["seed"], []).append({**curve(r["folder"])["final"], "lr": r["lr"], "times": r["times"]})
                continue
            curves.setdefault(r["contender"], {}).setdefault(r["lr"], {})[r["seed"]] = curve(r["folder"])
    if baseline not in curves:
        raise SystemExit(f"Error: no finished run of the baseline '{baseline}' in {out}")
    result = {"baseline": baseline, "extrapolate": extrapolate, "contenders": {}}
    if stored:
        result["baseline_from"] = stored["path"]
    best = {}
    for name, by_lr in curves.items():
        def mean_loss(seeds: dict, only=None) -> float | None:
            losses = [c["final"]["val_loss"] for s, c in seeds.items() if only is None or s in only]
            return statistics.mean(losses) if losses and None not in losses else None

        # the best lr by the seeds every lr has (sweep_seeds: the others confirm the best lr only)
        sweep = {lr: mean_loss(seeds, sweep_seeds) for lr, seeds in by_lr.items()}
        sweep = {lr: v for lr, v in sweep.items() if v is not None}
        best[name] = min(sweep, key=sweep.get)
        result["contenders"][name] = {"lr_sweep": {f"{lr:g}": round(v, 5) for lr, v in sorted(sweep.items())},
                                      "best_lr": best[name], "final_val_loss": mean_loss(by_lr[best[name]]),
                                      "seeds_at_best_lr": sorted(by_lr[best[name]])}
    base = curves[baseline][best[baseline]]
    frontier = {}  # seed -> the baseline's final points at its budgets (1x and the larger ones), best lr at each
    for seed, c in base.items():
        if larger.get(seed):
            frontier[seed] = best_lr_frontier({**c["final"], "lr": best[baseline]}, larger[seed])
    if frontier:
        result["baseline_frontier"] = {str(s): [{k: f.get(k) for k in ("flops", "seconds", "tokens", "val_loss", "lr")} for f in fs]
                                       for s, fs in frontier.items()}
    for name in curves:
        entry = result["contenders"][name]
        entry["runs"] = {f"{lr:g}": {str(s): c for s, c in seeds.items()} for lr, seeds in curves[name].items()}
        objectives = {c["objective"] for seeds in curves[name].values() for c in seeds.values()}
        if objectives != {c["objective"] for c in base.values()}:  # losses of different tasks: no multiplier
            entry["multiplier_flops"] = entry["multiplier_seconds"] = None
            entry["note"] = (f"objective {'/'.join(sorted(objectives))}: its held-out loss does not compare with the "
                             "baseline's (rtd: the generator's MLM loss), so no multiplier; judge it downstream")
            continue
        for axis in ("flops", "seconds"):
            if axis == "seconds" and stored and name != baseline:
                # the baseline's seconds were measured in another session, under another load: no
                # wall-clock comparison (measure it side by side: both contenders in one --parallel run)
                entry["multiplier_seconds"] = None
                entry["note_seconds"] = "baseline from another session (--baseline-from): seconds not side by side"
                continue
            for source in ("curve", "frontier"):
                if source == "frontier" and not frontier:
                    continue
                per_seed = {}
                for seed, c in curves[name][best[name]].items():
                    if source == "curve":
                        b = base.get(seed) or next(iter(base.values()))
                        xs, ys = b[axis], b["val_loss"]
                    else:  # the baseline's own seed where it has a frontier, else the first seed's
                        fs = frontier.get(seed) or next(iter(frontier.values()))
                        xs, ys = [f[axis] for f in fs], [f["val_loss"] for f in fs]
                    per_seed[seed] = compute_multiplier(xs, ys, c["final"][axis], c["final"]["val_loss"], extrapolate)
                ms = [m["multiplier"] for m in per_seed.values()]
                entry[f"multiplier_{axis}_{source}"] = {
                    "median": statistics.median(ms), "per_seed": per_seed, "source": source,
                    "bounds": sorted({m["bound"] for m in per_seed.values() if m["bound"]}),
                    "extrapolated": any(m["extrapolated"] for m in per_seed.values())}
            entry[f"multiplier_{axis}"] = entry.get(f"multiplier_{axis}_frontier") or entry[f"multiplier_{axis}_curve"]
    return result


def plot(result: dict, path: Path) -> Path:
    from cramlm.report.plots import colors, plt, save

    fig, ax = plt.subplots(figsize=(7, 4.5))
    names = list(result["contenders"])
    for name, color in zip(names, colors(len(names))):
        entry = result["contenders"][name]
        if entry.get("note"):  # another objective's loss (rtd): not on the baseline's axis
            continue
        for lr, seeds in entry["runs"].items():
            at_best = float(lr) == entry["best_lr"]
            for i, c in enumerate(seeds.values()):
                label = f"{name} (lr {lr})" if at_best and i == 0 else None
                ax.plot(c["flops"], c["val_loss"], "o-" if at_best else "-", color=color, alpha=1.0 if at_best else 0.25,
                        lw=1.5 if at_best else 0.8, ms=3, label=label)
    for i, finals in enumerate(result.get("baseline_frontier", {}).values()):
        ax.plot([f["flops"] for f in finals], [f["val_loss"] for f in finals], "s--", color="black", ms=5, lw=1,
                label=f"{result['baseline']}: final loss at 1x and larger budgets" if i == 0 else None)
    ax.set_xscale("log")
    ax.set_xlabel("training FLOPs (model + optimizer)")
    ax.set_ylabel("validation loss (val_loss: the same heldout-v1 sequences for every run)")
    ax.set_title("loss against compute; faint: other lrs of each sweep")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return save(fig, path)


def fmt(m: dict | None, none: str = "n/a (other objective)") -> str:
    if m is None:
        return none
    sign = {"lower": ">=", "upper": "<="}.get(m["bounds"][0], "") if m["bounds"] else ""
    return (f"{sign}{m['median']:.2f}x" + (" (extrapolated)" if m["extrapolated"] else "")
            + (" (one curve)" if m.get("source") == "curve" else ""))


def table(result: dict) -> str:
    lines = ["| contender | best lr | lr sweep (final held-out loss) | final loss | FLOPs | compute multiplier | wall-clock multiplier |",
             "|---|---:|---|---:|---:|---:|---:|"]
    for name, e in result["contenders"].items():
        finals = [c["final"] for c in e["runs"][f"{e['best_lr']:g}"].values()]
        sweep = ", ".join(f"{lr}: {v:.3f}" for lr, v in e["lr_sweep"].items())
        lines.append(f"| {name}{' (baseline)' if name == result['baseline'] else ''} | {e['best_lr']:g} | {sweep} | "
                     f"{e['final_val_loss']:.4f} | {statistics.mean(f['flops'] for f in finals):.3g} | "
                     + ("1x (itself) | 1x (itself) |" if name == result["baseline"] else
                        f"{fmt(e['multiplier_flops'])} | {fmt(e['multiplier_seconds'], e.get('note_seconds', 'n/a'))} |"))
    return "\n".join(lines)


def collect(dirs: list[Path], out: Path) -> dict:
    """Several ablations (one per model size) side by side: per size the best-lr losses of each
    contender (seeds), the baseline's frontier, the multipliers; one plot of loss against FLOPs with
    every size's best-lr curves (``out``.png) and the table (``out``.md, ``out``.json)."""
    from cramlm.report.plots import colors, plt, save

    rows, results = [], {}
    for d in dirs:
        r = json.loads((d / "ablation.json").read_text())
        results[str(d)] = r
        st, base = r["settings"], r["baseline"]
        for name, e in r["contenders"].items():
            finals = {s: c["final"] for s, c in e["runs"][f"{e['best_lr']:g}"].items()}
            rows.append({"size": " ".join(filter(None, (st["recipe"], st.get("size")))), "recipe": st["recipe"], "budget_flops": st.get("flops"),
                         "contender": name, "baseline": name == base, "best_lr": e["best_lr"], "lr_sweep": e["lr_sweep"],
                         "loss_per_seed": {s: round(f["val_loss"], 4) for s, f in finals.items()},
                         "seconds_per_seed": {s: f["seconds"] for s, f in finals.items()},
                         "frontier": r.get("baseline_frontier") if name == base else None,
                         "multiplier_flops": None if name == base else e.get("multiplier_flops"),
                         "multiplier_seconds": None if name == base else e.get("multiplier_seconds")})
    lines = ["| size | budget FLOPs | contender | best lr (sweep) | held-out loss per seed | baseline at 2x, per seed | "
             "compute multiplier (per seed) | wall-clock multiplier (per seed) |", "|---|---:|---|---|---|---|---:|---:|"]
    for row in rows:
        sweep = ", ".join(f"{lr}: {v:.3f}" for lr, v in row["lr_sweep"].items())
        losses = ", ".join(f"s{s} {v:.3f}" for s, v in row["loss_per_seed"].items())
        front = ", ".join(f"s{s} " + " / ".join(f"{f['val_loss']:.3f}" for f in fs[1:]) for s, fs in (row["frontier"] or {}).items())

        def mult(m):
            if not m:
                return "-"
            each = ", ".join(f"{v['multiplier']:.2f}{'+' if v['bound'] == 'lower' else ''}" for v in m["per_seed"].values())
            return f"{fmt(m)} ({each})"
        lines.append(f"| {row['size']} | {row['budget_flops']:.0e} | {row['contender']}{' (baseline)' if row['baseline'] else ''} | "
                     f"{row['best_lr']:g} ({sweep}) | {losses} | {front or '-'} | {mult(row['multiplier_flops'])} | "
                     f"{mult(row['multiplier_seconds'])} |")
    fig, ax = plt.subplots(figsize=(8, 5))
    styles = {}
    for (d, r), color in zip(results.items(), colors(len(results))):
        size = " ".join(filter(None, (r["settings"]["recipe"], r["settings"].get("size"))))
        for name, e in r["contenders"].items():
            if e.get("note"):
                continue
            style = styles.setdefault(name, ["-", "--", ":", "-."][len(styles) % 4])
            for i, c in enumerate(e["runs"][f"{e['best_lr']:g}"].values()):
                ax.plot(c["flops"], c["val_loss"], style, color=color, lw=1.4, label=f"{size} {name} (lr {e['best_lr']:g})" if i == 0 else None)
        for finals in r.get("baseline_frontier", {}).values():
            ax.plot([f["flops"] for f in finals], [f["val_loss"] for f in finals], "s:", color=color, ms=6, mfc="none", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("training FLOPs (model + optimizer)")
    ax.set_ylabel("validation loss (heldout-v1, the same sequences for every run)")
    ax.set_title("each size at the best lr of each sweep\nsquares: the baseline's own full runs at 1x and 2x the budget", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, ncol=2)
    save(fig, out.with_suffix(".png"))
    collected = {"ablations": [str(d) for d in dirs], "rows": rows}
    write_result(out.with_suffix(".json"), collected, "\n".join(lines), default=str)
    print("\n".join(lines))
    return collected


def main(argv: list[str]) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="default", help="the cramlm run recipe every contender starts from")
    ap.add_argument("--baseline", nargs="+", metavar=("NAME", "OVERRIDE"), default=["baseline"],
                    help="the baseline's name and its overrides")
    ap.add_argument("--candidate", nargs="+", action="append", metavar=("NAME", "OVERRIDE"), default=[],
                    help="a candidate's name and its overrides (repeat for several)")
    ap.add_argument("--overrides", nargs="*", default=[], help="overrides shared by every run")
    ap.add_argument("--size", help="HIDDENxLAYERS for every run (e.g. 128x4)")
    budget = ap.add_mutually_exclusive_group()
    budget.add_argument("--flops", type=float, help="equal FLOPs: train.budget.flops for every run (no clock)")
    budget.add_argument("--clock", help="equal wall clock: budget= for every run (e.g. 10m); with --parallel")
    ap.add_argument("--lrs", type=float, nargs="+", default=[1e-3], help="train.optim.lr values swept per contender")
    ap.add_argument("--lrs-for", nargs="+", action="append", default=[], metavar=("NAME", "LR"),
                    help="a contender's own lr sweep instead of --lrs (repeat per contender)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--validate-every", type=float, default=0.1, help="train.validate_every: points of each curve")
    ap.add_argument("--only-best-for-seeds", type=int, nargs="*", default=[], metavar="SEED",
                    help="seeds (of --seeds) run at each contender's best lr only, after the other seeds' sweep chose it")
    ap.add_argument("--baseline-budgets", type=float, nargs="*", default=[], metavar="TIMES",
                    help="also train the baseline at these multiples of the budget (its best lr, full schedule each): "
                         "the multiplier is read off that frontier")
    ap.add_argument("--baseline-budget-lr-factors", type=float, nargs="+", default=[1.0], metavar="F",
                    help="train those larger budgets at the best lr times each F (e.g. 1 2): each budget's frontier point "
                         "is the lowest loss of its lrs (a longer run takes a larger lr; the 1x-best alone flatters a candidate)")
    ap.add_argument("--baseline-budget-seeds", type=int, nargs="*", default=[], metavar="SEED",
                    help="the seeds of those larger baseline runs (default: all); a seed without them is judged "
                         "on the first seed's frontier")
    ap.add_argument("--baseline-from", type=Path, metavar="JSON",
                    help="the baseline's runs and frontier from a finished ablation of the same recipe, size, budget and "
                         "baseline (its ablation.json): only the candidates are trained; no wall-clock multiplier")
    ap.add_argument("--extrapolate", action="store_true", help="continue the baseline's curve past its last point (flagged)")
    ap.add_argument("--parallel", action="store_true", help="two runs at a time, one pinned core and thread each")
    ap.add_argument("--smoke", action="store_true", help="tiny model, data and budgets: checks the machinery in < 1 minute")
    ap.add_argument("--out", type=Path, default=Path("outputs/recipe-ablation"))
    ap.add_argument("--summarize", type=Path, metavar="DIR", help="only the curves and table, from the runs in DIR")
    ap.add_argument("--only", nargs="+", metavar="RUN", default=[],
                    help="run only these runs of the plan (folder names, e.g. muon-lr0.008-s0): one more lr of a sweep")
    ap.add_argument("--collect", type=Path, nargs="+", metavar="DIR",
                    help="only the cross-size table and plot of these finished ablations (written to --out .md/.json/.png)")
    args = ap.parse_args(argv)
    if args.collect:
        return collect(args.collect, args.out)
    if args.smoke:
        args.size = args.size or "32x2"
        args.flops = args.flops or 3e9
        args.validate_every = 0.25
        args.lrs = args.lrs if args.lrs != [1e-3] else [1e-3, 3e-3]  # a sweep of two
        if not args.candidate:
            args.candidate = [["adamw", "train.optim.type=adamw"]]  # against the recipe's Muon: two contenders that differ
        if args.out == Path("outputs/recipe-ablation"):
            args.out = Path("outputs/recipe-ablation-smoke")
    if not (args.flops or args.clock or args.summarize):
        ap.error("set --flops (equal compute) or --clock (equal wall clock)")
    if args.summarize:
        args.out = args.summarize
    args.out = args.out.resolve()
    args.contenders = {args.baseline[0]: args.baseline[1:], **{c[0]: c[1:] for c in args.candidate}}
    if len(args.contenders) < 1 + len(args.candidate):
        ap.error("contender names must differ")
    try:
        args.lrs_of = {c[0]: [float(v) for v in c[1:]] for c in args.lrs_for if len(c) > 1}
    except ValueError as e:
        ap.error(f"--lrs-for: {e}")
    if unknown := set(args.lrs_of) - set(args.contenders):
        ap.error(f"--lrs-for names no contender: {', '.join(sorted(unknown))}")
    previous, settings = args.out / "ablation.json", None
    if args.summarize and previous.is_file() and not args.candidate:  # the contenders and sweeps of the run
        settings = json.loads(previous.read_text())["settings"]
        args.contenders, args.lrs, args.seeds = settings["contenders"], settings["lrs"], settings["seeds"]
        args.lrs_of, args.baseline = settings.get("lrs_for") or {}, [next(iter(settings["contenders"]))]
        args.baseline_budgets = args.baseline_budgets or settings.get("baseline_budgets") or []
        args.baseline_budget_seeds = args.baseline_budget_seeds or settings.get("baseline_budget_seeds") or []
        if args.baseline_budget_lr_factors == [1.0]:
            args.baseline_budget_lr_factors = settings.get("baseline_budget_lr_factors") or [1.0]
        args.only_best_for_seeds = args.only_best_for_seeds or settings.get("only_best_for_seeds") or []
        args.recipe, args.size, args.flops, args.clock = settings["recipe"], settings.get("size"), settings.get("flops"), settings.get("clock")
        args.overrides = settings.get("overrides") or []
        args.settings_trained = settings.get("trained")  # what these runs trained then (the recipe may have changed since)
        if settings.get("baseline_from") and not args.baseline_from:
            args.baseline_from = Path(settings["baseline_from"])
    args.stored_baseline = stored_baseline(args.baseline_from, args) if args.baseline_from else None
    if args.baseline_budgets and len(base_lrs := args.lrs_of.get(args.baseline[0], args.lrs)) == 1 and not args.stored_baseline:
        args.baseline_lr = base_lrs[0]  # nothing to sweep: its larger budgets train beside the sweep, not after it
    sweep_seeds = [s for s in args.seeds if s not in args.only_best_for_seeds]
    if args.only_best_for_seeds and not sweep_seeds:
        ap.error("--only-best-for-seeds: some seed of --seeds must sweep the lrs")
    runs = plan(args)
    if not args.summarize:
        args.out.mkdir(parents=True, exist_ok=True)
        run_all(args, runs)
    if args.only_best_for_seeds or args.baseline_budgets:  # the sweep decides the lrs; then the rest
        swept = summarize(args.out, runs, args.baseline[0], args.extrapolate, sweep_seeds, args.stored_baseline)["contenders"]
        args.best_lrs = {name: e["best_lr"] for name, e in swept.items()}
        if args.baseline_budgets:
            args.baseline_lr = args.best_lrs[args.baseline[0]]
        runs = plan(args)
        if not args.summarize:
            run_all(args, runs)
    result = summarize(args.out, runs, args.baseline[0], args.extrapolate, sweep_seeds, args.stored_baseline)
    result["settings"] = settings or {"recipe": args.recipe, "size": args.size, "flops": args.flops, "clock": args.clock, "lrs": args.lrs,
                          "lrs_for": args.lrs_of, "seeds": args.seeds, "baseline_budgets": args.baseline_budgets,
                          "baseline_budget_seeds": args.baseline_budget_seeds,
                          "baseline_budget_lr_factors": args.baseline_budget_lr_factors, "only_best_for_seeds": args.only_best_for_seeds, "parallel": args.parallel, "overrides": args.overrides,
                          "contenders": args.contenders, "baseline_from": args.baseline_from and str(args.baseline_from),
                          "trained": {name: args.stored_baseline["trained"] if args.stored_baseline and name == args.baseline[0]
                                      else trained(args, name) for name in args.contenders}}  # a stored baseline: what it trained then
    (args.out / "ablation.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    plot(result, args.out / "ablation.png")
    print(table(result))
    print(f"written: {args.out / 'ablation.json'}, {args.out / 'ablation.png'}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
