"""The multiplier law's size-or-ratio question, asked cheaply: the shipped recipe's fields at 128x4 on a
budget below its 1x (6.19e12 FLOPs, ~115 steps: D/N 1.4, where 256x4 stands at 2x its budget, D/N 1.34),
read on AdamW's frontier tuned at every budget from 6.19e12 up. In the committed rows (law.md) log N and
log D/N correlate at -0.97, so a smaller multiplier at a larger size may be the size or the ratio: at
equal D/N the two sizes answer it.

AdamW's frontier below 1x is the stored sweep at 6.19e12 (four lrs) and its runs at 1.24e13 / 2.48e13
(lr 8e-3 and 1.6e-2; eqtok-128x4*.json), above it the committed 128x4 frontier (budget-rows.json). Those
ran bf16 on another machine and data cache; the runs here are fp32 on the bridge's data, so two of them
are trained again as a check (AdamW lr 8e-3 at 6.19e12, 1.6e-2 at 2e13) and momentum 0.95 at 6.19e12
against the stored 5.529.

    # the runs (benchmarks/results/bridge/law-runs.sh: names law-128x4-*), then
    python benchmarks/law_low_budget.py --runs outputs/screen     # stores their finals, prints the rows
    python benchmarks/law_low_budget.py                            # the same from the stored finals
    python benchmarks/multiplier_law.py --rows benchmarks/results/recipe_multiplier/budget-rows.json \
        benchmarks/results/recipe_multiplier/low-budget-rows.json --json benchmarks/results/bridge/law.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from cramlm.pipeline.scaling import frontier_multiplier

DIR = Path(__file__).parent / "results" / "recipe_multiplier"
RUNS = DIR / "law-low-budget-runs.json"  # the finals of the law-128x4-* runs
ROWS = DIR / "low-budget-rows.json"  # in budget-rows.json's layout, for multiplier_law.py --rows
ONE_X = 2e13  # 128x4's 1x budget
KEEP = ("steps", "tokens", "flops", "train_seconds", "val_loss", "precision", "data", "objective")


def stored_frontier() -> list[dict]:
    """AdamW at 128x4, best lr at each budget: the sweep at 6.19e12, 1.24e13 and 2.48e13 (eqtok), then
    the committed frontier from 1x (budget-rows.json)."""
    eq = json.loads((DIR / "eqtok-128x4.json").read_text())
    adamw = eq["contenders"]["adamw"]
    at = {}  # flops -> [(val_loss, lr, source)]
    for lr, seeds in adamw["runs"].items():
        final = seeds["0"]["final"]
        at.setdefault(round(final["flops"], -9), []).append((final["val_loss"], float(lr), "eqtok-128x4.json sweep"))
    for f in eq["baseline_frontier"]["0"][1:]:  # its best lr (8e-3) at 2x and 4x of 6.19e12
        at.setdefault(round(f["flops"], -9), []).append((f["val_loss"], adamw["best_lr"], "eqtok-128x4.json frontier"))
    for times in (2, 4):
        name = f"eqtok-128x4-adamw-lr0.016-x{times}-summary.json"
        s = json.loads((DIR / name).read_text())
        at.setdefault(round(s["flops"], -9), []).append((s["val_loss"], 0.016, name))
    rows = json.loads((DIR / "budget-rows.json").read_text())
    block = next(b for b in rows if b.get("size") == "128x4")
    for p in block["frontiers"]["best lr at each budget"]["points"]:
        at.setdefault(round(p["flops"], -9), []).append((p["val_loss"], p["lr"], f"budget-rows.json ({p['source']})"))
    front = []
    for flops in sorted(at):
        loss, lr, source = min(at[flops])
        front.append({"flops": flops, "val_loss": loss, "lr": lr, "source": source,
                      "tried": {f"{x[1]:g}": x[0] for x in sorted(at[flops], key=lambda x: x[1])}})
    return front


def finished(folder: Path) -> dict:
    """name -> the final summary of each law-128x4-* run under ``folder``."""
    out = {}
    for summary in sorted(folder.glob("law-128x4-*/summary.json")):
        s = json.loads(summary.read_text())
        out[summary.parent.name] = {k: s.get(k) for k in KEEP}
    return out


def main(argv: list[str]) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, help="a folder of finished law-128x4-* runs: their finals are stored first")
    args = ap.parse_args(argv)
    if args.runs:
        runs = {**(json.loads(RUNS.read_text()) if RUNS.exists() else {}), **finished(args.runs)}
        RUNS.write_text(json.dumps(runs, indent=1) + "\n")
    runs = json.loads(RUNS.read_text())
    front = stored_frontier()
    checks = []  # the same configuration stored (bf16, the older cache) and trained here (fp32, the bridge's)
    for name, lr, flops, want in (("law-128x4-e12-adamw-lr0.008-s0", 0.008, 6.19e12, "sweep"),
                                  ("law-128x4-x1-adamw-lr0.016-s0", 0.016, 2e13, "1x"),
                                  ("law-128x4-e12-mom0.95-s0", None, 6.19e12, "muon")):
        if name not in runs:
            continue
        if want == "muon":
            stored = json.loads((DIR / "eqtok-128x4.json").read_text())["contenders"]["muon-full"]["lr_sweep"]["0.016"]
        else:
            stored = next(p["tried"][f"{lr:g}"] for p in front if abs(p["flops"] / flops - 1) < 0.02)
        checks.append({"run": name, "stored": stored, "here": runs[name]["val_loss"], "difference": runs[name]["val_loss"] - stored})
    per_seed = {}
    for name, s in runs.items():
        if name.startswith("law-128x4-e12-mom0.85-s"):
            seed = name.rsplit("-s", 1)[1]
            per_seed[seed] = {"val_loss": s["val_loss"], "flops": s["flops"], "steps": s["steps"],
                              **frontier_multiplier(front, s["flops"], s["val_loss"])}
    rows = [{"size": "128x4", "times": round(6.19e12 / ONE_X, 2), "per_seed": per_seed,
             "median": statistics.median(v["multiplier"] for v in per_seed.values()),
             "frontier_ends_at": max(p["flops"] for p in front)}] if per_seed else []
    # how much the multipliers rest on one stored AdamW point: each checked point replaced by its re-run, or left out
    sensitivity = []
    for c in checks:
        if c["run"].startswith("law-128x4-e12-mom"):
            continue
        flops = runs[c["run"]]["flops"]
        swap = [dict(p, val_loss=c["here"]) if abs(p["flops"] / flops - 1) < 0.02 and p["val_loss"] == c["stored"] else p for p in front]
        drop = [p for p in front if abs(p["flops"] / flops - 1) >= 0.02]
        for label, fr in ((f"{c['run']} in place of the stored point", swap), (f"without the point at {flops:.3g}", drop)):
            sensitivity.append({"frontier": label, "multipliers": {s: frontier_multiplier(fr, v["flops"], v["val_loss"])["multiplier"]
                                                                 for s, v in per_seed.items()}})
    result = [{"size": "128x4", "frontier": front, "checks": checks, "budget_rows": rows, "sensitivity": sensitivity}]
    ROWS.write_text(json.dumps(result, indent=1) + "\n")
    lines = ["| AdamW frontier (FLOPs) | best loss | its lr | lrs tried (loss) |", "|---:|---:|---:|---|"]
    lines += [f"| {p['flops']:.3g} | {p['val_loss']:.3f} | {p['lr']:g} | {', '.join(f'{k}: {v:.3f}' for k, v in p['tried'].items())} |" for p in front]
    lines += ["", "| check | stored (bf16) | here (fp32) | difference |", "|---|---:|---:|---:|"]
    lines += [f"| {c['run']} | {c['stored']:.3f} | {c['here']:.3f} | {c['difference']:+.3f} |" for c in checks]
    lines += ["", "| run | steps | FLOPs | held-out | multiplier |", "|---|---:|---:|---:|---:|"]
    lines += [f"| 128x4 at {rows[0]['times']}x, seed {s} | {v['steps']} | {v['flops']:.3g} | {v['val_loss']:.3f} | "
              f"{'>= ' if v.get('bound') == 'lower' else '<= ' if v.get('bound') == 'upper' else ''}{v['multiplier']:.2f}x |"
              for s, v in per_seed.items()]
    lines += ["", "| AdamW frontier | " + " | ".join(f"seed {k}" for k in per_seed) + " |", "|---|" + "---:|" * len(per_seed)]
    lines += [f"| {x['frontier']} | " + " | ".join(f"{m:.2f}x" for m in x["multipliers"].values()) + " |" for x in sensitivity]
    print("\n".join(lines))
    return result[0]


if __name__ == "__main__":
    main(sys.argv[1:])
