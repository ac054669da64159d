"""The masked-LM multipliers of benchmarks/results/recipe_multiplier.md read again on a baseline
frontier tuned at every budget, not only at 1x: does the multiplier hold when AdamW gets its best
lr at each budget?

The stored ablations judged muon-full against AdamW's frontier at AdamW's 1x-best lr; a run four
times as long takes a larger lr, so that frontier flatters the candidate where the larger budgets
were under-tuned. This adds AdamW runs at larger budgets and other lrs (finished ``cramlm run``
folders, trained with the ablation's baseline overrides: checked) to the stored frontier points,
takes at each budget the lowest final loss of its lrs (cramlm.pipeline.scaling.best_lr_frontier),
and reads the stored muon-full finals on both frontiers (scaling.frontier_multiplier). The
wall-clock multiplier is the compute multiplier times the stored rate of counted FLOPs per second
(benchmarks/contender_steps.py's files).

    python benchmarks/frontier_lr_check.py --runs outputs/frontier-lr --out outputs/frontier-lr-check.json

What it reads, in ``--dir`` (default benchmarks/results/recipe_multiplier), each replaceable:
``--ablation SIZE FILE [FILE ...]`` per size the ablation with muon-full's runs and AdamW's 1x/2x
frontier, then further stored AdamW frontier points (default: 128x4.json x4-128x4.json, 256x4.json
x4-256x4.json, 384x6.json 384x6-x2.json, 512x8.json); ``--rates`` the contenders' step rates
(steps_mlm_{size}.json); ``--frontier-runs`` the finals of AdamW runs trained since
(frontier-*-runs.json); ``--recipe-runs`` the finals of the shipped recipe's runs
(screen-*-runs.json). So the tables read again without the runs' folders (``--runs`` adds more).
``--budget-rows`` also reads the shipped recipe (muon-full, momentum 0.85, each size's lr) at each
budget multiple it was trained at (1x, 2x, ...) on the same tuned frontier: does the multiplier
hold from the smallest to the largest size when each is given more compute? A size with none of the
recipe's own run at 1x (512x8) stands at 1x by its ablation's muon-full at the sweep's best lr, when that
trained momentum 0.85 (its larger budgets: screen-512x8-runs.json, the same command at 2x).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

from cramlm.pipeline.scaling import best_lr_frontier, frontier_multiplier


@dataclass
class Stored:
    """The committed files this check reads (the defaults: what recipe_multiplier.md's tables were
    read from), all in ``folder``: ``ablations`` per size [the ablation with muon-full's runs and
    AdamW's 1x/2x frontier, further stored frontier points ...]; ``rates`` the contenders' step rates
    ({size} filled in); ``frontier_runs`` and ``recipe_runs`` globs of run finals (name -> summary)
    of AdamW and of the shipped recipe."""

    folder: Path = Path(__file__).parent / "results" / "recipe_multiplier"
    ablations: dict[str, list[str]] = field(default_factory=lambda: {
        "128x4": ["128x4.json", "x4-128x4.json"], "256x4": ["256x4.json", "x4-256x4.json"],
        "384x6": ["384x6.json", "384x6-x2.json"], "512x8": ["512x8.json"]})
    rates: str = "steps_mlm_{size}.json"
    frontier_runs: str = "frontier-*-runs.json"
    recipe_runs: str = "screen-*-runs.json"


def stored_points(stored: Stored, size: str) -> tuple[dict, list[dict]]:
    """The stored ablation of ``size`` and its AdamW frontier points (seed 0) beyond 1x, each with its lr."""
    main, *extra = stored.ablations[size]
    ab = json.loads((stored.folder / main).read_text())
    lr = ab["contenders"]["adamw"]["best_lr"]
    points = [{**f, "lr": lr, "source": main} for f in ab["baseline_frontier"]["0"][1:]]
    for name in extra:
        d = json.loads((stored.folder / name).read_text())
        if "x4" in d:  # one 4x run: {x4: {flops, val_loss, ...}}
            points.append({"flops": d["x4"]["flops"], "seconds": d["x4"]["train_seconds"], "val_loss": d["x4"]["val_loss"],
                           "lr": lr, "source": name})
        else:  # an ablation at 2x the budget with its own frontier (its 1x is our 2x)
            points += [{**f, "lr": d["contenders"]["adamw"]["best_lr"], "source": name} for f in d["baseline_frontier"]["0"]]
    return ab, points


NAME = re.compile(r"^(?P<size>\d+x\d+)(?:-x(?P<times>\d+))?(?P<rest>.*?)(?:-s(?P<seed>\d+))?$")


def from_name(name: str, sizes) -> dict | None:
    """What a run's name says: ``<size>[-x<budget multiple>][-...-lr<lr>][-mom<momentum>][-s<seed>]``
    (None: not one of ``sizes``)."""
    m = NAME.match(name)
    if not m or m["size"] not in sizes:
        return None
    lr = re.search(r"-lr([0-9.e-]+)", m["rest"])
    mom = re.search(r"-mom([0-9.]+)", m["rest"])
    return {"name": name, "size": m["size"], "times": int(m["times"] or 1), "seed": int(m["seed"] or 0),
            "lr": float(lr[1]) if lr else None, "momentum": float(mom[1]) if mom else None}


def is_recipe(named: dict) -> bool:
    """The shipped recipe by its name: momentum 0.85 at its size's own lr (no lr in the name)."""
    return named["momentum"] == 0.85 and named["lr"] is None


def stored_runs(stored: Stored, pattern: str, keep=lambda named: True) -> list[dict]:
    """The runs of the committed files ``pattern`` (name -> final summary) of a size of ``stored``
    whose name (from_name) ``keep`` takes, each with what its name says (explicit fields win)."""
    runs = []
    for path in sorted(stored.folder.glob(pattern)):
        for name, s in json.loads(path.read_text()).items():
            named = from_name(name, stored.ablations)
            if named and keep(named):
                runs.append({**named, "source": path.name, **s})
    return runs


def finished(folder: Path | None) -> list[dict]:
    """The finished ``cramlm run`` folders under ``folder``: name, resolved config, summary, size (HIDDENxLAYERS)."""
    import yaml

    runs = []
    for summary in sorted(folder.glob("*/summary.json")) if folder else []:
        cfg = yaml.safe_load((summary.parent / "config.yaml").read_text())
        runs.append({"folder": summary.parent, "cfg": cfg, "summary": json.loads(summary.read_text()),
                     "size": f"{cfg['arch']['hidden_size']}x{cfg['arch']['num_layers']}"})
    return runs


def run_points(runs: list[dict], size: str) -> list[dict]:
    """Of ``runs``, the AdamW runs of ``size`` (seed 0, the baseline's overrides): final points."""
    points = []
    for run in runs:
        cfg, s = run["cfg"], run["summary"]
        arch, train = cfg["arch"], cfg["train"]
        if run["size"] != size or cfg.get("seed", 0) != 0:
            continue
        if (train["optim"]["type"], arch["qk_norm"], arch["zero_init_out"], train["objective"]) != ("adamw", False, False, "mlm"):
            raise SystemExit(f"Error: {run['folder']}: not the ablation's AdamW baseline (optim, qk_norm, zero_init_out, objective)")
        points.append({"flops": s["flops"], "seconds": s["train_seconds"], "val_loss": s["val_loss"],
                       "lr": train["optim"]["lr"], "source": str(run["folder"])})
    return points


def check(stored: Stored, size: str, runs: list[dict]) -> dict:
    ab, points = stored_points(stored, size)
    base = ab["contenders"]["adamw"]
    first = {**base["runs"][f"{base['best_lr']:g}"]["0"]["final"], "lr": base["best_lr"], "source": "1x sweep"}
    committed = [{"flops": r["flops"], "seconds": r["train_seconds"], "val_loss": r["val_loss"], "lr": r["lr"],
                  "source": r["source"] + ":" + r["name"]}
                 for r in stored_runs(stored, stored.frontier_runs, lambda n: n["size"] == size and n["seed"] == 0)]
    seen = {(c["flops"], c["val_loss"]) for c in committed}  # a folder that is also committed counts once
    new = committed + [p for p in run_points(runs, size) if (p["flops"], p["val_loss"]) not in seen]
    one_x = [p for p in new if abs(p["flops"] / first["flops"] - 1) < 0.05]  # more 1x lrs: the sweep, not the frontier
    larger = [p for p in points + new if p not in one_x]
    fronts = {"1x-best lr": best_lr_frontier(first, [p for p in larger if p["lr"] == first["lr"]]),
              "best lr at each budget": best_lr_frontier(first, larger)}
    cand = ab["contenders"]["muon-full"]
    finals = {s: r["final"] for s, r in cand["runs"][f"{cand['best_lr']:g}"].items()}
    rate = json.loads((stored.folder / stored.rates.format(size=size)).read_text())["rows"]["muon-full"]["rate_vs_first"]["median"]
    out = {"size": size, "rate_vs_adamw": rate, "adamw_points": [first, *larger], "adamw_1x_other_lrs": one_x, "frontiers": {}}
    trained = (ab.get("settings") or {}).get("trained", {}).get("muon-full", {})
    if trained.get("train.optim.momentum") == 0.85:  # the shipped recipe's fields at the sweep's best lr: its 1x row
        out["recipe_1x"] = {s: {**c, "lr": cand["best_lr"]} for s, c in finals.items()}
    for name, front in fronts.items():
        per_seed = {s: frontier_multiplier(front, c["flops"], c["val_loss"]) for s, c in finals.items()}
        median = statistics.median(m["multiplier"] for m in per_seed.values())
        out["frontiers"][name] = {
            "points": [{k: f.get(k) for k in ("flops", "val_loss", "lr", "source")} for f in front],
            "muon_full": {s: {"val_loss": finals[s]["val_loss"], **m, "wall_clock": m["multiplier"] * rate} for s, m in per_seed.items()},
            "median": median, "median_wall_clock": median * rate}
    return out


def table(results: list[dict]) -> str:
    lines = ["| size | frontier | AdamW points (FLOPs: loss @ lr) | muon-full s0 / s1 | multiplier s0 / s1 (median) | wall clock (median) |",
             "|---|---|---|---|---:|---:|"]
    for r in results:
        for name, f in r["frontiers"].items():
            pts = "; ".join(f"{p['flops']:.2g}: {p['val_loss']:.3f} @ {p['lr']:g}" for p in f["points"])
            m = f["muon_full"]
            losses = " / ".join(f"{v['val_loss']:.3f}" for v in m.values())
            lines.append(f"| {r['size']} | {name} | {pts} | {losses} | "
                         + " / ".join(f"{'>= ' if v['bound'] == 'lower' else ''}{v['multiplier']:.2f}x" for v in m.values())
                         + f" ({f['median']:.2f}x) | {f['median_wall_clock']:.2f}x |")
    return "\n".join(lines)


def candidates(runs: list[dict], results: list[dict]) -> list[dict]:
    """Of ``runs`` (screens on top of muon-full: any size of the tables, any overrides), each read on
    its size's frontier tuned at every budget: its final loss and multiplier."""
    fronts = {r["size"]: r["frontiers"]["best lr at each budget"]["points"] for r in results}
    rows = []
    for run in runs:
        cfg, s, size = run["cfg"], run["summary"], run["size"]
        if (size not in fronts or cfg["train"]["objective"] != "mlm" or cfg["arch"]["type"] != "crammed-bert"
                or "shared-corpus" not in str(s.get("data"))):  # the ablations' model, objective and data only
            continue
        m = frontier_multiplier(fronts[size], s["flops"], s["val_loss"])
        rows.append({"run": run["folder"].name, "size": size, "seed": cfg.get("seed"), "flops": s["flops"], "steps": s["steps"],
                     "val_loss": s["val_loss"], "momentum": cfg["train"]["optim"].get("momentum"), **m})
    return rows


def budget_rows(results: list[dict], stored: Stored, runs: list[dict] = ()) -> list[dict]:
    """The shipped recipe (muon-full at momentum 0.85, each size's own lr: runs named without an lr)
    at each budget multiple it was trained at, committed (``stored.recipe_runs``) or in ``runs``
    (finished folders named alike), each seed read on its size's frontier tuned at every budget."""
    fronts = {r["size"]: r["frontiers"]["best lr at each budget"]["points"] for r in results if "size" in r}
    cands = stored_runs(stored, stored.recipe_runs, is_recipe)
    for run in runs:
        named = from_name(run["folder"].name, fronts)
        if named and is_recipe(named):
            cands.append({**named, "seed": run["cfg"].get("seed", 0), **run["summary"]})
    for r in results:  # a size without the recipe's own run at 1x: its ablation's muon-full (momentum 0.85, best lr)
        if "recipe_1x" in r and not any(c["size"] == r["size"] and c["times"] == 1 for c in cands):
            cands += [{"size": r["size"], "times": 1, "seed": int(s), **c} for s, c in r["recipe_1x"].items()]
    rows = []
    for size in fronts:
        front = fronts[size]
        for times in sorted({c["times"] for c in cands if c["size"] == size}):
            seeds = {c["seed"]: c for c in cands if c["size"] == size and c["times"] == times}
            per_seed = {s: {"val_loss": c["val_loss"], "flops": c["flops"], "steps": c["steps"],
                            **frontier_multiplier(front, c["flops"], c["val_loss"])} for s, c in sorted(seeds.items())}
            rows.append({"size": size, "times": times, "per_seed": per_seed,
                         "median": statistics.median(v["multiplier"] for v in per_seed.values()),
                         "frontier_ends_at": max(f["flops"] for f in front)})
    return rows


def budget_table(rows: list[dict]) -> str:
    lines = ["| size | budget | steps | recipe's held-out loss per seed | multiplier per seed (median) |",
             "|---|---:|---:|---|---:|"]
    for r in rows:
        v = list(r["per_seed"].values())
        lines.append(f"| {r['size']} | {r['times']}x ({v[0]['flops']:.2g}) | {v[0]['steps']} | "
                     + " / ".join(f"s{s} {x['val_loss']:.3f}" for s, x in r["per_seed"].items()) + " | "
                     + " / ".join(f"{'>= ' if x['bound'] == 'lower' else ''}{x['multiplier']:.2f}x" for x in v)
                     + f" ({'>= ' if any(x['bound'] == 'lower' for x in v) else ''}{r['median']:.2f}x) |")
    return "\n".join(lines)


def main(argv: list[str]) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, help="a folder of finished AdamW cramlm runs (any size, budget, lr; seed 0)")
    ap.add_argument("--sizes", nargs="+", help="sizes of --ablation to read (default: all)")
    ap.add_argument("--dir", type=Path, default=Stored.folder, help="where the committed files are (default: %(default)s)")
    ap.add_argument("--ablation", nargs="+", action="append", metavar=("SIZE", "FILE"),
                    help="a size's ablation JSON with muon-full's runs and AdamW's 1x/2x frontier, then further stored "
                         "frontier JSONs (repeat per size; given, they replace the defaults: " + "; ".join(
                             f"{k} {' '.join(v)}" for k, v in Stored().ablations.items()) + ")")
    ap.add_argument("--rates", default=Stored.rates, help="the contenders' step rates, {size} filled in (default: %(default)s)")
    ap.add_argument("--frontier-runs", default=Stored.frontier_runs, help="glob of AdamW run finals (default: %(default)s)")
    ap.add_argument("--recipe-runs", default=Stored.recipe_runs, help="glob of the shipped recipe's run finals (default: %(default)s)")
    ap.add_argument("--candidate-runs", type=Path, help="a folder of finished screen runs: each read on its size's tuned frontier")
    ap.add_argument("--budget-rows", action="store_true", help="also the shipped recipe at each budget multiple on the tuned frontier")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if any(len(a) < 2 for a in args.ablation or []):
        ap.error("--ablation takes a size and at least one file")
    stored = Stored(args.dir, {a[0]: a[1:] for a in args.ablation} if args.ablation else Stored().ablations,
                    args.rates, args.frontier_runs, args.recipe_runs)
    if unknown := set(args.sizes or []) - set(stored.ablations):
        ap.error(f"--sizes: no ablation for {', '.join(sorted(unknown))}")
    sizes = args.sizes or list(stored.ablations)
    for size in sizes:
        for name, flag in [*((n, "--dir, --ablation") for n in stored.ablations[size]), (stored.rates.format(size=size), "--dir, --rates")]:
            if not (stored.folder / name).is_file():
                raise SystemExit(f"Error: {stored.folder / name}: not found ({flag})")
    adamw = finished(args.runs)  # read once, for every size
    results = [check(stored, size, adamw) for size in sizes]
    print(table(results))
    screens = finished(args.candidate_runs)  # read once, for both tables
    if args.candidate_runs:
        rows = candidates(screens, results)
        print("\n| run | size | seed | steps | held-out loss | multiplier |\n|---|---|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {r['run']} | {r['size']} | {r['seed']} | {r['steps']} | {r['val_loss']:.3f} | "
                  f"{'>= ' if r['bound'] == 'lower' else ''}{r['multiplier']:.2f}x |")
        results = [*results, {"candidate_runs": rows}]
    if args.budget_rows:
        rows = budget_rows(results, stored, screens)
        print("\n" + budget_table(rows))
        results = [*results, {"budget_rows": rows}]
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
