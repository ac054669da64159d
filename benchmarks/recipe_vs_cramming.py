"""Quality at equal compute: the `cpu-1h-mlm` recipe against cramming's recipe (`train=bert-o4`: its
batch ramp to 8192 sequences, budget-keyed triangle schedule) on the same model, data, tokenizer,
implementation and wall-clock budget, and both against their untrained twin (same architecture and
tokenizer, random weights): does the recipe beat cramming's at equal compute, and does
pretraining beat no pretraining?

Three `cramlm run` pipelines into ``--out``: ``recipe`` (``--recipe``, default cpu-1h-mlm: cpu-1h with
MLM, as cramming's; the committed results name it cpu-1h: docs/results.md), ``bert-o4`` (the same
with ``train=bert-o4``; cramlm's bert-o4 caps the ramp so the budget gives at least 1,000 updates,
kinder than cramming's original), and the twin's evaluation (through the bert-o4 run:
``eval-untrained``; the twin depends only on architecture, tokenizer and eval seed, so it is the
recipe's twin too). Fine-tuning: the five shared tasks, 3 seeds, median. The held-out MLM loss is
eval.json's (definition heldout-v1, data/heldout.py: the runs share the data config, so the same
sequences and masks), and again by cramlm.eval.lm.run_heldout (the same function). Both runs get the same wall clock, and since they
train the same model with the same implementation, also (within a fraction of a percent, printed)
the same tokens and FLOPs: the comparison is at equal compute and at equal tokens at once.

``--against NAME OVERRIDE ...`` replaces cramming's recipe by another contender of the same
model (the twin is then evaluated through it): e.g. the recipe as it was before Muon,
``--against cpu-1h-adamw train.optim.type=adamw train.optim.lr=1e-3 ...``, or ELECTRA's objective,
``--against rtd train.objective=rtd`` (that is ``--recipe cpu-1h`` against ``--recipe cpu-1h-mlm``).

``--parallel`` runs the two pretrainings side by side, each pinned to one core with one thread
(``taskset``): two hours of a 2-core machine in one, each run a 1-core hour. Evaluation follows.

    CRAMLM_DATA_DIR=../shared/data python benchmarks/recipe_vs_cramming.py --parallel --out /tmp/rvc
    python benchmarks/recipe_vs_cramming.py --summarize /tmp/rvc      # the tables from finished runs
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from cramlm.pipeline.pinned import run_pinned  # two runs side by side, one core each

TASKS = ["rotten_tomatoes", "spam", "epistemic_nli", "fever_claims", "vitaminc"]
BERT_O4 = ["train=bert-o4", "train.batch_size=8192", "train.batch_ramp=0.6", "train.min_updates=1000"]


def commands(out: Path, budget: str, parallel: bool, data_dir: str, against: list[str] | None = None,
             shared: list[str] = (), recipe: str = "cpu-1h-mlm") -> dict[str, list[list[str]]]:
    """The pretrainings and evaluations; ``against``: the other contender's name and overrides
    (default: cramming's recipe, ``bert-o4``); ``shared``: overrides for every run (e.g. a FLOP
    budget, ``train.budget.flops=2e14``, for a comparison at equal FLOPs)."""
    name, extra = (against[0], against[1:]) if against else ("bert-o4", BERT_O4)
    common = [f"base_dir={out}", f"impl.data_cache={out / 'data'}", "impl.progress=false", f"budget={budget}",
              "eval.seeds=3", "eval.tasks=[" + ",".join(f"{data_dir}/tasks/{t}" for t in TASKS) + "]", *shared]
    if parallel:
        common.append("impl.threads=1")
    run = ["cramlm", "run", recipe]
    return {
        "pretrain": [[*run, "name=recipe", "stages=[data,pretrain]", *common],
                     [*run, f"name={name}", "stages=[data,pretrain]", *extra, *common]],
        "eval": [[*run, "name=recipe", "stages=[eval]", "untrained_twin=false", *common],
                 [*run, f"name={name}", "stages=[eval]", "untrained_twin=false", *extra, *common],
                 [*run, f"name={name}", "stages=[eval-untrained]", *extra, *common]],
    }


def run_all(out: Path, budget: str, parallel: bool, data_dir: str, against: list[str] | None = None,
            shared: list[str] = (), recipe: str = "cpu-1h-mlm") -> None:
    out.mkdir(parents=True, exist_ok=True)
    plan = commands(out, budget, parallel, data_dir, against, shared, recipe)
    data = [c for c in plan["pretrain"][0] if not c.startswith("stages=")] + ["stages=[data]"]
    subprocess.run(data, check=True)  # once, before two processes want it
    for phase in ("pretrain", "eval"):
        if parallel:
            run_pinned(plan[phase])
        else:
            for cmd in plan[phase]:
                print("+", shlex.join(cmd), flush=True)
                subprocess.run(cmd, check=True)


def summarize(out: Path, against: str = "bert-o4", also: list[str] = ()) -> dict:
    """The tables' figures; ``also``: more evaluated runs in ``out`` (e.g. an RTD pretraining), as
    columns of their own. The twin's scores: ``eval-untrained.json`` in the other contender's folder,
    else in the recipe's (the twin depends only on architecture, tokenizer and eval seed)."""
    from cramlm.eval.lm import run_heldout

    def load(path: Path):
        return json.loads(path.read_text()) if path.is_file() else None

    runs = {name: out / name for name in ("recipe", against, *also)}
    evals = {**{name: load(folder / "eval.json") for name, folder in runs.items()},
             "untrained twin": load(runs[against] / "eval-untrained.json") or load(runs["recipe"] / "eval-untrained.json")}
    result: dict = {"against": against, "also": list(also), "runs": {}, "tasks": {}, "means": {}, "lm": {}}
    for name, folder in runs.items():
        s = load(folder / "summary.json") or {}
        result["runs"][name] = {k: s.get(k) for k in ("steps", "tokens", "flops", "train_seconds", "tokens_per_second",
                                                      "mfu", "precision", "val_loss")}
        try:  # an RTD run exports its discriminator, which has no MLM head
            result["runs"][name]["common_split"] = run_heldout(folder)
        except Exception as e:  # noqa: BLE001 (shown as '-', with the reason in the JSON)
            result["runs"][name]["common_split"] = {"error": f"{type(e).__name__}: {e}"}
    for name, ev in evals.items():
        if not ev:
            continue
        result["means"][name] = ev["mean"]["last"]["arithmetic"]
        result["lm"][name] = (ev.get("heldout") or {}).get("loss")
        for row in ev["results"]:
            entry = result["tasks"].setdefault(row["task"], {"metric": row["metric"], "majority": row.get("majority")})
            entry[name] = {"median": row["score"], "seeds": [s["last"][row["metric"]] for s in row["seeds"]]}
    return result


def table(result: dict) -> str:
    against = result.get("against", "bert-o4")
    names = ["recipe", against, *result.get("also", []), "untrained twin"]
    label = "bert-o4 (cramming)" if against == "bert-o4" else against
    lines = [f"| task (metric, majority) | cpu-1h recipe | {label} | " + "".join(f"{n} | " for n in result.get("also", []))
             + "untrained twin | recipe - twin |", "|---|" + "---:|" * (len(names) + 1)]
    for task, entry in result["tasks"].items():
        cells = []
        for n in names:
            e = entry.get(n)
            cells.append("-" if not e else f"{100 * e['median']:.1f} ({' '.join(f'{100 * v:.1f}' for v in e['seeds'])})")
        margin = (f"{100 * (entry['recipe']['median'] - entry['untrained twin']['median']):+.1f}"
                  if "recipe" in entry and "untrained twin" in entry else "-")
        majority = "" if entry.get("majority") is None else f", {100 * entry['majority']:.1f}"
        lines.append(f"| {task} ({entry['metric']}{majority}) | " + " | ".join(cells) + f" | {margin} |")
    ahead = [t for t, e in result["tasks"].items() if "recipe" in e and "untrained twin" in e
             and e["recipe"]["median"] - e["untrained twin"]["median"] >= 0.02]
    result["ahead_of_twin_by_2_points"] = ahead
    lines.append("| mean | " + " | ".join(f"{100 * result['means'][n]:.1f}" if n in result["means"] else "-" for n in names)
                 + " | " + (f"{100 * (result['means']['recipe'] - result['means']['untrained twin']):+.1f}"
                            if {"recipe", "untrained twin"} <= set(result["means"]) else "-") + " |")
    runs = result["runs"]
    def common(n: str) -> str:  # an RTD run is scored by its generator (a smaller MLM): said in the cell
        split = runs.get(n, {}).get("common_split", {})
        if "loss" not in split:
            return "-"
        return f"{split['loss']:.3f}" + (" (its generator)" if split.get("objective") == "rtd" else "")
    lines.append("| held-out MLM loss, cramlm.eval.lm.run_heldout | " + " | ".join(common(n) for n in names) + " | |")
    lines.append("| held-out MLM loss, eval.json | " + " | ".join(
        f"{result['lm'][n]:.3f}" if result["lm"].get(n) is not None else "-" for n in names) + " | |")
    lines.append("")
    lines.append(f"recipe >= 2 points above the twin on {len(ahead)} of {len(result['tasks'])} tasks" + (f" ({', '.join(ahead)})" if ahead else ""))
    for n, r in runs.items():
        if r.get("steps") is None:  # no summary.json (a pretraining that did not finish)
            lines.append(f"{n}: no summary.json")
            continue
        lines.append(f"{n}: {r['steps']:,} steps, {r['tokens'] / 1e6:.2f}M tokens, {r['flops']:.3g} FLOPs in {r['train_seconds']:.0f} s "
                     f"({r['tokens_per_second']:,.0f} tokens/s, {r['precision']}, MFU {100 * r['mfu']:.1f}%)")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="outputs/recipe-vs-cramming")
    ap.add_argument("--recipe", default="cpu-1h-mlm", help="the recipe of both contenders (default cpu-1h-mlm: MLM, as cramming's)")
    ap.add_argument("--budget", default="1h", help="wall-clock hours of each pretraining ('null': none, then --set a "
                    "train.budget)")
    ap.add_argument("--set", nargs="+", default=[], metavar="OVERRIDE", dest="shared",
                    help="overrides for every run, e.g. train.budget.flops=2e14 (equal FLOPs; with --budget 1h, "
                    "whichever is spent first ends a run)")
    ap.add_argument("--parallel", action="store_true", help="both pretrainings at once, one pinned core and thread each")
    ap.add_argument("--summarize", metavar="DIR", help="only the tables, from the finished runs in DIR")
    ap.add_argument("--json", help="also write the result here")
    ap.add_argument("--also", nargs="*", default=[], metavar="NAME", help="more evaluated runs in DIR, as columns (--summarize)")
    ap.add_argument("--against", nargs="+", metavar=("NAME", "OVERRIDE"),
                    help="the other contender's name and overrides (default: cramming's recipe, bert-o4)")
    args = ap.parse_args(argv)
    out = Path(args.summarize or args.out)
    if not args.summarize:
        run_all(out, args.budget, args.parallel, os.environ.get("CRAMLM_DATA_DIR", "../shared/data"), args.against,
                args.shared, args.recipe)
    result = summarize(out, args.against[0] if args.against else "bert-o4", args.also)
    text = table(result)  # (adds the tasks ahead of the twin to result)
    print(json.dumps(result))
    print(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
