"""Muon's compute multiplier (the shipped recipe's masked-LM fields against AdamW tuned at every
budget) as a law of model size and tokens per parameter, fitted on every committed seed and budget
row (recipe_multiplier/budget-rows.json and low-budget-rows.json; others: ``--rows``), and carried to crammed-bert at a
GPU day (cramming's 24 A6000-hours: 5e18 FLOPs) with a 90% prediction interval; the literature beside.

    python benchmarks/multiplier_law.py                       # fit, extrapolate, print JSON and a table
    python benchmarks/multiplier_law.py --json benchmarks/results/bridge/law.json   # (+ law.md beside)

The law, cramlm.pipeline.scaling.fit_multiplier_law: log m = k + b log(N / 1e6) + c log(D / N),
N non-embedding parameters, D tokens (steps x 64 x 128 here). Fitted on each (size, budget) group's
mean over its seeds (they are read on one AdamW frontier, so their errors are shared: the groups'
degrees of freedom, the seeds' scatter added to a prediction's); the per-seed fit beside (the one the
512x8 prediction was registered with). A row whose multiplier is a bound (the candidate beyond the
baseline's frontier) is listed and left out of the fits.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cramlm.io import write_result
from cramlm.pipeline.scaling import fit_multiplier_law, multiplier_law

ROWS = [Path(__file__).parent / "results" / "recipe_multiplier" / name for name in ("budget-rows.json", "low-budget-rows.json")]
# non-embedding parameters of crammed-bert at these sizes (pipeline.scaling.non_embedding_parameters,
# vocab 8192, QK-norm) and of crammed-bert (16 x 768) itself
PARAMS = {"128x4": 658_176, "256x4": 2_627_072, "384x6": 8_858_880, "512x8": 20_990_976, "crammed-bert": 94_424_064}
TOKENS_PER_STEP = 64 * 128
GPU_DAY = {"flops": 5e18, "flops_per_token": 0.62e9, "source": "cramming: 24 A6000-hours at ~40% MFU, ~0.62 GFLOP/token"}
LITERATURE = [
    ("Muon vs tuned AdamW, 0.1B (Wen et al. 2025, 'Fantastic pretraining optimizers')", "~1.4x"),
    ("Muon vs tuned AdamW, 1.2B (same study)", "~1.1x"),
    ("Moonshot, 'Muon is scalable' (compute-optimal runs, their AdamW)", "~2x"),
    ("modded-nanogpt step-count track, 124M GPT-2 (Adam 'likely undertuned')", "~1.6x in steps"),
]


def observations(rows_files: list[Path]) -> list[dict]:
    """One observation per (size, budget, seed): N, D, the multiplier."""
    obs = []
    for path in rows_files:
        for block in json.loads(path.read_text()):
            for row in block.get("budget_rows", []):
                for seed, v in row["per_seed"].items():
                    obs.append({"size": row["size"], "times": row["times"], "seed": int(seed), "params": PARAMS[row["size"]],
                                "tokens": v["steps"] * TOKENS_PER_STEP, "flops": v["flops"], "multiplier": v["multiplier"],
                                "bound": v.get("bound")})
    return obs


def main(argv: list[str]) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=Path, nargs="+", default=ROWS,
                    help="budget-rows files (frontier_lr_check.py --budget-rows, law_low_budget.py)")
    ap.add_argument("--json", type=Path, help="also write the result here (and the table beside, .md)")
    args = ap.parse_args(argv)
    obs = observations(args.rows)
    for o in obs:
        if o["bound"]:
            print(f"multiplier_law: {o['size']} at {o['times']}x, seed {o['seed']}: {o['multiplier']:.2f}x is a {o['bound']} "
                  "bound (the candidate is beyond the baseline's frontier): listed, left out of the fits", file=sys.stderr)
    fitted = [o for o in obs if not o["bound"]]
    N, D, m = ([o[k] for o in fitted] for k in ("params", "tokens", "multiplier"))
    groups = [f"{o['size']}-{o['times']}x" for o in fitted]
    tokens = GPU_DAY["flops"] / GPU_DAY["flops_per_token"]
    result: dict = {"observations": obs, "laws": {}, "literature": LITERATURE,
                    "gpu_day": {"params": PARAMS["crammed-bert"], "tokens": tokens, **GPU_DAY},
                    "observed_tokens_per_param": [min(d / n for n, d in zip(N, D)), max(d / n for n, d in zip(N, D))]}
    lines = ["| size | budget | seed | N | D / N | multiplier |", "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {o['size']} | {o['times']}x | {o['seed']} | {o['params'] / 1e6:.2f}M | {o['tokens'] / o['params']:.2f} | "
              f"{o['multiplier']:.2f}x{' (' + o['bound'] + ' bound, not fitted)' if o['bound'] else ''} |" for o in obs]
    lines += ["", "| law (terms; fitted on) | log m = | r2 | residual sd (within a group) | dof | crammed-bert, GPU day (90% interval) | the CPU hour |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for terms, grouped in ((("size", "ratio"), True), (("ratio",), True), (("size",), True), (("size", "ratio"), False)):
        fit = fit_multiplier_law(N, D, m, terms, groups=groups if grouped else None)
        day, hour = multiplier_law(fit, PARAMS["crammed-bert"], tokens), multiplier_law(fit, PARAMS["128x4"], 20.8e6)
        result["laws"]["+".join(terms) + ("" if grouped else " (per seed)")] = {"fit": fit, "gpu_day": day, "cpu_hour": hour}
        within = (f" ({fit['sigma2_within'] ** 0.5:.3f})" if fit["points"] < fit["observations"] else " (-)") if grouped else ""
        lines.append(f"| {' + '.join(terms)}; {'group means' if grouped else 'every seed (as registered)'} | {fit['k']:.3f} "
                     f"{fit['b']:+.3f} log(N/1e6) {fit['c']:+.3f} log(D/N) | {fit['r2']:.2f} | {fit['sigma2'] ** 0.5:.3f}{within} | "
                     f"{fit['dof']} | {day['multiplier']:.2f}x ({day['low']:.2f}x - {day['high']:.2f}x) | "
                     f"{hour['multiplier']:.2f}x ({hour['low']:.2f}x - {hour['high']:.2f}x) |")
    # the law's test (issue 37 item 3): 512x8 at 1.6e14 FLOPs (muon-full's 113 steps), predicted by the
    # laws fitted without it (as registered before its runs), beside its measured multiplier once it has one
    held_out = [o for o in fitted if o["size"] != "512x8"]
    measured = [o for o in fitted if o["size"] == "512x8" and o["times"] == 1]
    bounds = [o for o in obs if o["bound"] and o["size"] == "512x8" and o["times"] == 1]  # beyond the frontier: no verdict
    test = {"params": PARAMS["512x8"], "tokens": (measured[0]["tokens"] if measured else 113 * TOKENS_PER_STEP),
            "flops": measured[0]["flops"] if measured else 1.6e14}
    hN, hD, hm = ([o[k] for o in held_out] for k in ("params", "tokens", "multiplier"))
    hgroups = [f"{o['size']}-{o['times']}x" for o in held_out]
    result["test_512x8"] = {**test, "fitted_without_512x8": True,
                            "measured": [o["multiplier"] for o in measured] or None,
                            "bounds": [{"multiplier": o["multiplier"], "bound": o["bound"]} for o in bounds] or None}
    for terms, grouped in ((("size", "ratio"), True), (("ratio",), True), (("size",), True), (("size", "ratio"), False)):
        fit = fit_multiplier_law(hN, hD, hm, terms, groups=hgroups if grouped else None)
        result["test_512x8"]["+".join(terms) + ("" if grouped else " (per seed)")] = multiplier_law(fit, test["params"], test["tokens"])
    seen = (", measured " + " / ".join(f"{x:.2f}x" for x in result["test_512x8"]["measured"])) if measured else ""
    seen += "".join(f", a {o['bound']} bound {o['multiplier']:.2f}x (no verdict)" for o in bounds)
    lines += ["", f"512x8 at {test['flops']:.2g} FLOPs (N {test['params'] / 1e6:.1f}M, D/N {test['tokens'] / test['params']:.3f}){seen}; "
              "predicted by the laws fitted without it: "
              + "; ".join(f"{name} {p['multiplier']:.2f}x ({p['low']:.2f}x - {p['high']:.2f}x)"
                          + ("" if not measured else " inside" if all(p["low"] <= o["multiplier"] <= p["high"] for o in measured)
                             else " outside")
                          for name, p in result["test_512x8"].items() if isinstance(p, dict))]
    corr = result["laws"]["size+ratio"]["fit"]["regressor_correlation"]
    lines += ["", f"crammed-bert at a GPU day: N {PARAMS['crammed-bert'] / 1e6:.1f}M, D {tokens / 1e9:.1f}B, D/N "
              f"{tokens / PARAMS['crammed-bert']:.0f} (observed D/N {result['observed_tokens_per_param'][0]:.2f}-"
              f"{result['observed_tokens_per_param'][1]:.1f}); correlation of log N and log D/N in the data: {corr:.2f}",
              "", "| literature | multiplier |", "|---|---:|", *[f"| {a} | {b} |" for a, b in LITERATURE]]
    text = "\n".join(lines)
    print(json.dumps(result))
    print(text)
    if args.json:
        write_result(args.json, result, text)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
