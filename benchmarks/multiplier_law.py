"""Muon's compute multiplier (the shipped recipe's masked-LM fields against AdamW tuned at every
budget) as a law of model size and tokens per parameter, fitted on every committed seed and budget
row (recipe_multiplier/budget-rows.json and low-budget-rows.json; others: ``--rows``), and carried to crammed-bert at a
GPU day (cramming's 24 A6000-hours: 5e18 FLOPs) with a 90% prediction interval; the literature beside.

    python benchmarks/multiplier_law.py                       # fit, extrapolate, print JSON and a table
    python benchmarks/multiplier_law.py --json benchmarks/results/bridge/law.json   # (+ law.md beside)

The law, cramlm.pipeline.scaling.fit_multiplier_law: log m = k + b log(N / 1e6) + c log(D / N),
N non-embedding parameters, D tokens (steps x 64 x 128 here).
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
    N, D, m = ([o[k] for o in obs] for k in ("params", "tokens", "multiplier"))
    tokens = GPU_DAY["flops"] / GPU_DAY["flops_per_token"]
    result: dict = {"observations": obs, "laws": {}, "literature": LITERATURE,
                    "gpu_day": {"params": PARAMS["crammed-bert"], "tokens": tokens, **GPU_DAY},
                    "observed_tokens_per_param": [min(d / n for n, d in zip(N, D)), max(d / n for n, d in zip(N, D))]}
    lines = ["| size | budget | seed | N | D / N | multiplier |", "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {o['size']} | {o['times']}x | {o['seed']} | {o['params'] / 1e6:.2f}M | {o['tokens'] / o['params']:.2f} | "
              f"{o['multiplier']:.2f}x |" for o in obs]
    lines += ["", "| law (terms) | log m = | r2 | residual sd | crammed-bert, GPU day (90% interval) | the CPU hour |",
              "|---|---|---:|---:|---:|---:|"]
    for terms in (("size", "ratio"), ("ratio",), ("size",)):
        fit = fit_multiplier_law(N, D, m, terms)
        day, hour = multiplier_law(fit, PARAMS["crammed-bert"], tokens), multiplier_law(fit, PARAMS["128x4"], 20.8e6)
        result["laws"]["+".join(terms)] = {"fit": fit, "gpu_day": day, "cpu_hour": hour}
        lines.append(f"| {' + '.join(terms)} | {fit['k']:.3f} {fit['b']:+.3f} log(N/1e6) {fit['c']:+.3f} log(D/N) | {fit['r2']:.2f} | "
                     f"{fit['sigma2'] ** 0.5:.3f} | {day['multiplier']:.2f}x ({day['low']:.2f}x - {day['high']:.2f}x) | "
                     f"{hour['multiplier']:.2f}x ({hour['low']:.2f}x - {hour['high']:.2f}x) |")
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
