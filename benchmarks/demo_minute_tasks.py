"""What the demo's minute buys, per kind of task, against the untrained twin: collects finished
`cramlm run` folders (eval.json, eval-untrained.json, summary.json) into one JSON and a markdown
table: per fine-tuned task the per-seed scores, the twin's and the gain; per zero-shot minimal-pair
paradigm the accuracy, the twin's, the gain and two standard errors of it.

The runs themselves are `cramlm run default ...` commands, fixed in steps or FLOPs (the machine is
shared: a wall-clock budget would measure the load); the ones behind
results/demo_minute_vs_twin.md are listed there. Tasks and pairs come from
benchmarks/moby_dick_tasks.py (`--tasks`, `--pairs`).

    python benchmarks/demo_minute_tasks.py outputs/i39-8/{screen,rtd,mlm210,hybrid,hybrid-s1} \\
        --json benchmarks/results/demo_minute_tasks.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from cramlm.eval.pairs import pairs_versus


def _load(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _seeds(row: dict | None) -> list[float]:
    return [s["last"][row["metric"]] for s in row["seeds"]] if row else []


def collect(run: Path) -> dict:
    """One run folder's figures: pretraining, held-out loss, fine-tuned tasks and zero-shot pairs."""
    ev = _load(run / "eval.json") or {}
    twin = _load(run / "eval-untrained.json") or {}
    summary = _load(run / "summary.json") or {}
    config = ev.get("config", {})
    twin_rows = {r["task"]: r for r in twin.get("results", [])}
    tasks = []
    for row in ev.get("results", []):
        mine, base = _seeds(row), _seeds(twin_rows.get(row["task"]))
        tasks.append({"task": row["task"], "pretrained": row["score"], "pretrained_seeds": mine,
                      "untrained": twin_rows[row["task"]]["score"] if base else None, "untrained_seeds": base,
                      "gain": row["score"] - twin_rows[row["task"]]["score"] if base else None,
                      "spread": max([max(s) - min(s) for s in (mine, base) if len(s) > 1], default=None),
                      "majority": row.get("majority")})
    pairs = ev.get("minimal_pairs") or {}
    zero_shot = pairs_versus(pairs, twin.get("minimal_pairs")) if twin else []
    if not zero_shot and "scores" in pairs:  # no twin: the run's own accuracies
        head = pairs["scores"][pairs["headline"]]["paradigms"]
        zero_shot = [{"paradigm": k, "pretrained": v["accuracy"], "untrained": None, "margin": None, "two_se": None}
                     for k, v in head.items()]
    return {"run": run.name, "objective": summary.get("objective") or (config.get("train") or {}).get("objective"),
            "steps": summary.get("steps"), "tokens": summary.get("tokens"), "flops": summary.get("flops"),
            "heldout": (ev.get("heldout") or {}).get("loss"), "heldout_twin": (twin.get("heldout") or {}).get("loss"),
            "scorer": pairs.get("headline"), "tasks": tasks, "zero_shot": zero_shot}


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def markdown(runs: list[dict]) -> str:
    lines = ["| run | objective | steps | kind | task / paradigm | pretrained (seeds) | twin (seeds) | gain | noise |",
             "|---|---|---:|---|---|---:|---:|---:|---:|"]
    for r in runs:
        for t in r["tasks"]:
            gain = "-" if t["gain"] is None else f"{100 * t['gain']:+.1f}"
            lines.append(f"| {r['run']} | {r['objective']} | {r['steps']} | fine-tuned | {t['task']} | "
                         f"{_pct(t['pretrained'])} ({' '.join(_pct(s) for s in t['pretrained_seeds'])}) | "
                         f"{_pct(t['untrained'])} ({' '.join(_pct(s) for s in t['untrained_seeds'])}) | "
                         f"{gain} | "
                         f"spread {_pct(t['spread'])} |")
        for z in r["zero_shot"]:
            gain = "-" if z["margin"] is None else f"{100 * z['margin']:+.1f}"
            lines.append(f"| {r['run']} | {r['objective']} | {r['steps']} | zero-shot ({r['scorer']}) | {z['paradigm']} | "
                         f"{_pct(z['pretrained'])} | {_pct(z['untrained'])} | {gain} | 2 SE {_pct(z['two_se'])} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="finished `cramlm run` folders")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    runs = [collect(r) for r in args.runs]
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1) + "\n")
    print(json.dumps(runs))
    print(markdown(runs))


if __name__ == "__main__":
    main()
