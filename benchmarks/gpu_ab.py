"""The first GPU's recipe A/B: cramlm's GPU-day recipe (`gpu-24h`) against cramming's
(`crammed-bert-24h`, bert-o4) on crammed-bert at equal FLOPs, about a minute each, on the shared
corpus (vocab 8192, 128-token blocks), every schedule keyed to the same FLOP budget. Three contenders,
in this order (a check cut short keeps the first ones):

- ``cramming``: crammed-bert-24h, MLM with AdamW;
- ``cramlm-mlm``: gpu-24h's fields (Muon, QK-norm, zero-init) with cramming's MLM objective: its held-out
  MLM loss compares with cramming's directly, the GPU's reading of the multiplier the CPU law predicts;
- ``cramlm``: gpu-24h whole (ELECTRA): its held-out loss is its generator's (labelled by objective, not
  comparable with an MLM run's), so it is judged against the others by zero-shot accuracy, the figure
  every objective shares.

A step of benchmarks/gpu_check.sh (``GPU_CHECK_STEPS=ab``).

    python benchmarks/gpu_ab.py --out RES --work WORK --data-dir DIR [--flops 1e16] [--pairs DIR] [--contenders a,b]
    python benchmarks/gpu_ab.py --out RES --work WORK --data-dir DIR --dry     # CPU, tiny sizes (CI)
    python benchmarks/gpu_ab.py --out RES --work W2 --data-dir DIR --data-cache CACHE --prepare   # the data alone, ahead

The contenders share one prepared-data entry (the shared corpus, WordPiece 8192): ``--prepare`` makes it
ahead (gpu_check.sh: in the background of the first call, into an ignored folder a warm machine keeps), and
``--data-cache`` points the A/B at it; ``ab.json``'s ``data_prepared_before`` says whether it was there.

Writes ``RES/ab.json`` after every run and prints a table, with the held-out difference of each pair of
runs that share an objective. At 1e16 FLOPs the recipes' ``train.min_updates=1000`` holds the batch at one
microbatch of 128 (cramming ~1,030 steps, 1.7e7 tokens; the Muon contenders ~800-860, 1.3-1.4e7: ELECTRA's
generator and Muon's Newton-Schulz, ~17% of a step at this batch against under 1% at a GPU day's, are
counted): the recipes are compared in that small-batch regime, not at a GPU day's batch of 8,192 sequences
(which such a budget would spend in ~15 steps).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

# name -> (recipe, overrides), in the order they run
CONTENDERS = {"cramming": ("crammed-bert-24h", []), "cramlm-mlm": ("gpu-24h", ["train.objective=mlm"]),
              "cramlm": ("gpu-24h", [])}
TINY = ["arch.hidden_size=32", "arch.num_layers=2", "arch.num_heads=2", "arch.intermediate_size=64",
        "arch.max_seq_length=32", "data.seq_length=32", "data.tokenizer.vocab_size=512",
        "data.max_entries_in_raw_dataset=20", "train.batch_size=8", "impl.microbatch_size=8", "budget=null",
        "train.budget.steps=2"]


def pretrain_cmd(recipe: str, overrides: list[str], name: str, work: Path, data_dir: str, flops: float,
                 dry: bool, data_cache: Path | None = None, stages: str = "data,pretrain") -> list[str]:
    # eager on the GPU too: compiling a contender (its static, dynamic-shape and eval-mode graphs, ELECTRA's
    # generator beside) takes minutes that the step does not have; compilation does not change the maths
    size = TINY if dry else ["budget=null", f"train.budget.flops={flops:g}", "impl.microbatch_size=128",
                             "train.validate_every=0", "train.checkpoint_minutes=null", "train.checkpoint_at=[]",
                             "impl.compile=false"]
    data = "data=default" if dry else "data=shared-corpus"
    return [sys.executable, "-m", "cramlm", "run", recipe, f"name={name}", f"stages=[{stages}]", data,
            f"base_dir={work / 'runs'}", f"impl.data_cache={data_cache or work / 'data'}", "impl.progress=false", *overrides, *size]


def prepared(cache: Path) -> bool:
    """Whether ``cache`` holds a finished data entry (one with its manifest; an entry is written in a hidden
    temporary folder, manifest last, and renamed into place whole)."""
    return any(not p.parent.name.startswith(".") for p in cache.glob("*/manifest.json"))


def eval_cmd(run: Path, pairs: str | None, dry: bool) -> list[str]:
    zero_shot = [f"eval.minimal_pairs.paths=[{pairs}]", f"eval.minimal_pairs.max_pairs={20 if dry else 300}"] if pairs else []
    return [sys.executable, "-m", "cramlm", "eval", f"checkpoint={run}", "impl.progress=false", "eval.tasks=[]",
            *zero_shot, *(["eval.max_dev_examples=32"] if dry else [])]


def call(cmd: list[str], env: dict) -> int:
    print("+", shlex.join(cmd), flush=True)
    return subprocess.run(cmd, env=env).returncode


def record(run: Path) -> dict:
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").is_file() else {}
    ev = json.loads((run / "eval.json").read_text()) if (run / "eval.json").is_file() else {}
    out = {k: summary.get(k) for k in ("objective", "steps", "tokens", "flops", "train_seconds", "tokens_per_second", "mfu",
                                       "precision", "val_loss")}
    heldout = ev.get("heldout") or {}
    out["heldout"] = {"loss": heldout.get("loss"), "objective": heldout.get("objective")}
    pairs = ev.get("minimal_pairs") or {}
    out["zero_shot"] = {name: {k: r[k] for k in ("accuracy", "tie_rate", "pairs", "phenomena")}
                        for name, r in (pairs.get("scores") or {}).items()}
    out["zero_shot_headline"] = pairs.get("headline")
    return out


def same_objective(result: dict) -> list[dict]:
    """Each pair of runs whose held-out losses compare (one objective): the later one's loss minus the earlier's."""
    runs = [(name, (r.get("heldout") or {})) for name, r in result["runs"].items()]
    return [{"a": a, "b": b, "objective": ha["objective"], "b_minus_a": hb["loss"] - ha["loss"]}
            for i, (a, ha) in enumerate(runs) for b, hb in runs[i + 1:]
            if ha.get("loss") is not None and hb.get("loss") is not None and ha.get("objective") == hb.get("objective")]


def table(result: dict) -> str:
    lines = ["| contender | recipe | objective | steps | FLOPs | tokens/s | MFU | held-out loss | zero-shot |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in result["runs"].items():
        acc = ((r.get("zero_shot") or {}).get(r.get("zero_shot_headline")) or {}).get("accuracy")
        loss = (r.get("heldout") or {}).get("loss")
        recipe, overrides = CONTENDERS[name]
        lines.append(f"| {name} | {' '.join([recipe, *overrides])} | {r.get('objective')} | {r.get('steps') or '-'} | "
                     f"{(r.get('flops') or 0):.3g} | {(r.get('tokens_per_second') or 0):,.0f} | "
                     f"{100 * (r.get('mfu') or 0):.1f}% | {'-' if loss is None else f'{loss:.3f}'} | "
                     f"{'-' if acc is None else f'{100 * acc:.1f}'} |")
    lines += [f"held-out {d['objective']}: {d['b']} - {d['a']} = {d['b_minus_a']:+.3f}" for d in result.get("same_objective", [])]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="results folder (ab.json)")
    ap.add_argument("--work", type=Path, required=True, help="runs and data (never under --out)")
    ap.add_argument("--data-dir", required=True, help="the folder holding corpus/ (the shared corpus)")
    ap.add_argument("--flops", type=float, default=1e16, help="each contender's FLOP budget (1e16: about 57 s eager at the 22%% MFU the first H200 check measured)")
    ap.add_argument("--contenders", default=",".join(CONTENDERS),
                    help=f"a comma list of contenders to run, in the order given (default: {','.join(CONTENDERS)})")
    ap.add_argument("--pairs", help="minimal pairs (a folder of JSONL paradigms; the first 300 pairs of each) for "
                    "zero-shot scoring; omitted: held-out only")
    ap.add_argument("--data-cache", type=Path, help="the prepared-data cache the contenders share (default: WORK/data); "
                    "one that an earlier --prepare filled spares the A/B the preparation (~1 minute of CPU for the shared corpus)")
    ap.add_argument("--prepare", action="store_true", help="only prepare the contenders' data into --data-cache (they "
                    "share one entry) and exit: gpu_check.sh runs it in the background of the first call, so that the "
                    "A/B call finds it")
    ap.add_argument("--dry", action="store_true", help="CPU, tiny sizes, the shipped corpus: the script's plumbing only")
    args = ap.parse_args(argv)
    import os

    chosen = list(dict.fromkeys(c.strip() for c in args.contenders.split(",") if c.strip()))  # each once
    unknown = [c for c in chosen if c not in CONTENDERS]
    if unknown or not chosen:
        print(f"Error: --contenders: {', '.join(unknown) or 'none given'} (choose from {', '.join(CONTENDERS)})", file=sys.stderr)
        return 2

    env = dict(os.environ, CRAMLM_DATA_DIR=args.data_dir)
    cache = args.data_cache or args.work / "data"
    if args.prepare:
        recipe, overrides = CONTENDERS[chosen[0]]
        return call(pretrain_cmd(recipe, overrides, "prepare-data", args.work, args.data_dir, args.flops, args.dry, cache,
                                 stages="data"), env)
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict = {"flops_budget": None if args.dry else args.flops, "dry": args.dry, "runs": {},
                    "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "data_prepared_before": prepared(cache)}
    failed = 0
    for name in chosen:
        recipe, overrides = CONTENDERS[name]
        run = args.work / "runs" / name
        failed += call(pretrain_cmd(recipe, overrides, name, args.work, args.data_dir, args.flops, args.dry, cache), env) != 0
        if (run / "summary.json").is_file():
            failed += call(eval_cmd(run, args.pairs, args.dry), env) != 0
        result["runs"][name] = record(run)
        result["same_objective"] = same_objective(result)
        (args.out / "ab.json").write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))
    return failed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
