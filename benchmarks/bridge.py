"""Downstream against compute, 1x to 8x the CPU hour: the shipped cpu-1h (ELECTRA, Muon) and the
recipe before it (MLM, AdamW at its tuned lr 1.6e-2, no QK-norm or zero-init: ``adamw``), each
trained once per seed as one warmup-stable-decay run to 8x the hour's FLOPs, with a cooldown branched
from its stable phase at 1x, 2x and 4x (Hagele et al. 2024, "Scaling laws and compute-optimal
training beyond fixed training durations"; MiniCPM). A branch resumes the long run's newest
checkpoint before its own decay starts, with its budget and the warm-up in absolute terms as allowed
changes: it is bit for bit the WSD run trained at that budget from the start
(tests/train/test_branch.py). Each recipe's own budgeted schedule (``own``; cpu-1h's: cramming's
budget-triangle2) at 1x is the check that WSD costs nothing. The objective lines (issue 38: MLM at
15/25/40% masking, GPT-2's causal LM, GPT-BERT's hybrid; cpu-1h is ``rtd``) have no long run: each is
trained with its own schedule at 1x and 4x, two seeds, and evaluated as the points are (``prose``:
cpu-1h on the ``english-prose`` corpus, the single-sentence study's domain control, at 1x; ``half``: cpu-1h on
half the training documents, what repetition costs). Every point is fine-tuned on the five shared tasks (median of 3
seeds), beside each line's untrained twin, and scored zero-shot on the first 300 pairs of each of the 36
shared BLiMP paradigms (both PLL variants; ELECTRA runs by their detector and their generator).

    python benchmarks/bridge.py plan                         # every command, in order
    python benchmarks/bridge.py long --line rtd --seed 0     # the long run (continues where it stopped)
    python benchmarks/bridge.py branch --line rtd --seed 0 --k 1   # waits for its checkpoint, then the cooldown
    python benchmarks/bridge.py own --line rtd --seed 0 --k 1  # the recipe's own schedule at 1x
    python benchmarks/bridge.py eval --line rtd --seed 0 --k 1     # fine-tuning of one point (--twin: the twin)
    python benchmarks/bridge.py segments                     # which ran where: every run's segments (markdown)
    python benchmarks/bridge.py summarize                    # table (JSON + markdown + plot) of what has finished,
                                                             # and where each line leaves its untrained twin
    python benchmarks/bridge.py summarize --merge benchmarks/results/bridge/points.json \\
        --twins benchmarks/results/bridge/twin-pairs \\
        --json benchmarks/results/bridge/points.json           # ... with the committed rows kept beside

Runs live in ``--out`` (default outputs/bridge); every command is idempotent: a finished run is
skipped, an interrupted one continues from its newest checkpoint (``--resume auto``: a FLOP-budgeted
run resumed bitwise is the same run). Which segment ran where: benchmarks/results/bridge/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

from cramlm.eval.pairs import ahead_of, off_chance_of
from cramlm.io import write_result

HOUR = 1.49e14  # cpu-1h's hour: 2,541 ELECTRA steps of 64 x 128 tokens (momentum_085_vs_095_downstream.md)
KS = (1, 2, 4, 8)
WARMUP = 0.05  # of the 1x budget, in absolute terms at every budget
DECAY = 0.2  # of each budget: the cooldown (Hagele et al.: 20% with 1 - sqrt matches cosine)
EVERY = 50  # steps between a point's checkpoints: a killed run (a session's hard stop) trains <= 50 steps again
TASKS = ["rotten_tomatoes", "spam", "epistemic_nli", "fever_claims", "vitaminc"]
LINES = {
    "rtd": ["cpu-1h"],
    "adamw": ["cpu-1h-mlm", "train.optim.type=adamw", "train.optim.lr=1.6e-2", "arch.qk_norm=false",
              "arch.zero_init_out=false"],
    # the objectives at equal FLOPs (issue 38 item 4), each with cpu-1h's model, optimizer and data
    "mlm15": ["cpu-1h-mlm", "train.mlm_probability=0.15"],
    "mlm25": ["cpu-1h-mlm"],
    "mlm40": ["cpu-1h-mlm", "train.mlm_probability=0.4"],
    "gpt2": ["gpt2-cpu-1h"],
    "hybrid": ["cpu-1h-hybrid"],
    # the domain control of benchmarks/single_sentence.py: cpu-1h on English prose, no software docs
    "prose": ["cpu-1h", "data=english-prose"],
    # what repetition costs: cpu-1h at the same FLOPs on a hash-chosen half of the training documents
    # (validation and tokenizer unchanged), so 1x repeats the text ~3.5 times instead of ~1.9, and 4x
    # ~14 times, as 8x on the whole corpus does (~15); against own-rtd at the same k
    "half": ["cpu-1h", "data.train_subset=0.5"],
}
LONG = ("rtd", "adamw")  # the lines with a long run and branches
TWIN_OF = {"half": "rtd", "mlm15": "mlm25", "mlm40": "mlm25"}  # lines whose untrained twin is another line's (the same model and tokenizer)


def wsd(k: float) -> list[str]:
    return ["train.schedule.type=warmup-stable-decay", f"train.schedule.warmup={WARMUP / k}",
            f"train.schedule.decay={DECAY}", "train.schedule.decay_shape=sqrt"]


def common(out: Path, k: float) -> list[str]:
    # fp32 on every machine: the runs outlive sessions, and a resume in another precision is refused
    # (bf16 autocast is 2.2x fp32 on one of this project's CPUs and 0.13x on another)
    return [f"base_dir={out}", f"impl.data_cache={out / 'data'}", "impl.progress=false", "impl.threads=1",
            "impl.precision=fp32", "budget=null", f"train.budget.flops={k * HOUR:.6g}"]


def name(line: str, seed: int, k: int | None = None, schedule: str = "wsd") -> str:
    return f"{schedule}-{line}-s{seed}" + (f"-{k}x" if k and k != max(KS) else "")


def pretrain_cmd(out: Path, line: str, seed: int, k: int, extra: list[str]) -> list[str]:
    recipe, *overrides = LINES[line]
    return ["cramlm", "run", recipe, f"name={extra[0]}", "stages=[data,pretrain]", f"seed={seed}", *overrides,
            *common(out, k), *extra[1:]]


def long_cmd(out: Path, line: str, seed: int) -> list[str]:
    k = max(KS)  # checkpoints every 200 steps, all kept: the branches start from them
    return pretrain_cmd(out, line, seed, k, [name(line, seed), *wsd(k), "train.checkpoint_every=200",
                                             "train.keep_checkpoints=1000", "--resume", "auto"])


def branch_point(long_run: Path, k: int) -> Path | None:
    """The long run's newest checkpoint at or before the k-x branch's decay starts (None: not yet
    written; the long run has not yet passed that point)."""
    start, found, passed = (1 - DECAY) * k * HOUR, None, (long_run / "summary.json").is_file()
    for folder in sorted((long_run / "checkpoints").glob("step-*")):
        flops = json.loads((folder / "state.json").read_text())["usage"]["flops"]
        if flops <= start:
            found = folder
        else:
            passed = True
    return found if passed else None


def branch_cmd(out: Path, line: str, seed: int, k: int, point: Path) -> list[str]:
    run = out / name(line, seed, k)
    resume = "auto" if any((run / "checkpoints").glob("step-*")) else str(point)
    return pretrain_cmd(out, line, seed, k, [name(line, seed, k), *wsd(k), f"train.checkpoint_every={EVERY}", "--resume", resume, "--allow-change",
                                             "train.budget.flops", "--allow-change", "train.schedule.warmup"])


def own_cmd(out: Path, line: str, seed: int, k: int) -> list[str]:
    return pretrain_cmd(out, line, seed, k, [name(line, seed, k, "own"), f"train.checkpoint_every={EVERY}", "--resume", "auto"])


def eval_cmd(out: Path, run: str, data_dir: str, twin: bool = False) -> list[str]:
    return ["cramlm", "eval", f"checkpoint={out / run}" + ("-untrained" if twin else ""), "impl.progress=false",
            "impl.threads=1", "eval.seeds=3", "eval.max_train_examples=4000",
            "eval.tasks=[" + ",".join(f"{data_dir}/tasks/{t}" for t in TASKS) + "]",
            f"eval.minimal_pairs.paths=[{data_dir}/minimal_pairs/blimp]", "eval.minimal_pairs.pll=[word-l2r,original]",
            "eval.minimal_pairs.max_pairs=300"]  # 10,800 pairs (standard error ~0.5 points): ~9 CPU-minutes at 128x4


def run(cmd: list[str], log: Path) -> None:
    print("+", shlex.join(cmd), flush=True)
    with log.open("a") as f:
        f.write(f"\n### {time.strftime('%Y-%m-%d %H:%M:%S')} on {os.uname().nodename}: {shlex.join(cmd)}\n")
        f.flush()
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc:
        sys.exit(f"failed ({rc}), see {log}: {shlex.join(cmd)}")


def done(out: Path, run_name: str) -> bool:
    return (out / run_name / "summary.json").is_file()


def ran_of(folder: Path) -> dict:
    """When (UTC) a point finished training (pipeline.json's pretrain stage) and was evaluated (eval.json's
    time on disk), and on which machines (its segment lines: code since 23fa128; the bridge's af07c0f
    predates them, so README's segments table says where those ran and when each segment started)."""
    from cramlm.report.rundata import read_metrics
    from cramlm.report.segments import segments

    from datetime import datetime, timezone

    try:
        stage = json.loads((folder / "pipeline.json").read_text())["stages"]["pretrain"]
    except (OSError, ValueError, KeyError, TypeError):  # none, or not pipeline.json's shape
        stage = {}
    machines = [s.machine for s in segments(read_metrics(folder / "metrics.jsonl")) if s.machine]
    evaluated = (folder / "eval.json").stat().st_mtime if (folder / "eval.json").is_file() else None
    return {"trained": stage.get("finished") if isinstance(stage, dict) else None,
            "evaluated": datetime.fromtimestamp(evaluated, timezone.utc).isoformat(timespec="seconds") if evaluated else None,
            "machines": list(dict.fromkeys(machines)) or None}


def summarize(out: Path, merge: Path | None = None, twins: Path | None = None) -> dict:
    """Each finished point: held-out loss (eval.json's, else the run's last validation), each task's
    median and seeds; each line's twin. Every row names its code: the first word of ``--out``'s
    ``COMMIT.<run>`` file where a run was made by other code than the rest, else of its ``COMMIT``.
    ``merge``: an earlier summary whose rows are kept beside, keyed ``NAME@CODE`` where they were
    made by other code (a row of the same name and code from the folders replaces its copy; one of
    this code whose folder is gone, a lost machine's, keeps its name). ``twins``:
    a folder of twins evaluated outside the run folders, ``<run>-untrained.json`` (zero-shot only, ``cramlm eval
    ... untrained=true eval.tasks=[]``, or in full), each the twin of its run's line where the line has none yet
    (key ``LINE@twin-pairs``)."""
    result: dict = {"hour_flops": HOUR, "points": {}, "twins": {}}
    def code_of(path: Path) -> str | None:
        return path.read_text().split()[0] if path.is_file() else None

    code = code_of(out / "COMMIT")

    def scores(path: Path) -> dict | None:
        if not path.is_file():
            return None
        ev = json.loads(path.read_text())
        rows = {r["task"]: {"metric": r["metric"], "median": r["score"], "seeds": [s["last"][r["metric"]] for s in r["seeds"]]}
                for r in ev["results"]}
        pairs = ev.get("minimal_pairs") or {}
        zero_shot = {name: r["accuracy"] for name, r in (pairs.get("scores") or {}).items()}
        off = {name: c for name, r in (pairs.get("scores") or {}).items() if (c := off_chance_of(r)) is not None}
        head = (pairs.get("scores") or {}).get(pairs.get("headline")) or {}
        counts: dict[str, int] = {}
        for r in (head.get("paradigms") or {}).values():
            if "phenomenon" in r and "pairs" in r:
                counts[r["phenomenon"]] = counts.get(r["phenomenon"], 0) + r["pairs"]
        return {"tasks": rows, "mean": ev["mean"]["last"]["arithmetic"], "heldout": (ev.get("heldout") or {}).get("loss"),
                "zero_shot": zero_shot, "zero_shot_headline": pairs.get("headline"), "zero_shot_off_chance": off,
                "zero_shot_pairs": head.get("pairs"), "phenomena": head.get("phenomena"),
                "phenomenon_pairs": counts or None}

    for folder in sorted(p for p in out.iterdir() if (p / "summary.json").is_file()):
        s = json.loads((folder / "summary.json").read_text())
        point = {k: s.get(k) for k in ("steps", "tokens", "flops", "val_loss", "objective", "train_seconds")}
        point["multiple"] = round(s["flops"] / HOUR, 3)
        point["eval"] = scores(folder / "eval.json")
        point["code"] = code_of(out / f"COMMIT.{folder.name}") or code
        point["ran"] = ran_of(folder)
        result["points"][folder.name] = point
        if (twin := scores(folder / "eval-untrained.json")) is not None:
            line = parse(folder.name)["line"]
            if line in result["twins"]:
                raise SystemExit(f"Error: {folder}/eval-untrained.json: a second untrained twin for line {line}; "
                                 "a line has one (seed 0's), which every seed is judged against")
            result["twins"][line] = {**twin, "code": point["code"]}
    for kind, rows in (json.loads(merge.read_text()) if merge else {}).items():
        if kind not in ("points", "twins"):
            continue
        for key, row in rows.items():
            row_code = row.get("code") or "earlier"
            if "@" not in key and key in result[kind]:
                if result[kind][key].get("code") == row_code:
                    continue  # the folder's own row replaces its copy
                key = f"{key}@{row_code}"  # made by other code: beside it
            elif "@" not in key and row_code != code:
                key = f"{key}@{row_code}"
            result[kind].setdefault(key, {**row, "code": row_code})  # (a row of this code whose folder is gone keeps its name)
    for path in sorted(twins.glob("*-untrained.json")) if twins else []:
        line = parse(path.name[: -len("-untrained.json")])["line"]
        if not any(k.partition("@")[0] == line for k in result["twins"]):
            result["twins"][f"{line}@twin-pairs"] = {**scores(path), "code": "twin-pairs"}
    return result


def table(result: dict) -> str:
    tasks = sorted({t for p in result["points"].values() if p["eval"] for t in p["eval"]["tasks"]})
    lines = ["| run | x hour | held-out loss | " + " | ".join(tasks) + " | mean | zero-shot (headline; paradigms above / below chance) |",
             "|---|---:|---:|" + "---:|" * (len(tasks) + 2)]

    def zero_shot(ev) -> str:
        head = (ev or {}).get("zero_shot_headline")
        acc, off = (ev or {}).get("zero_shot", {}).get(head), (ev or {}).get("zero_shot_off_chance", {}).get(head)
        off = f"; {off['above']} / {off['below']}" if off else ""
        return " - |" if acc is None else f" {100 * acc:.1f} ({head}{off}) |"

    def row(label: str, mult: str, loss, ev) -> str:
        cells = [f"{100 * ev['tasks'][t]['median']:.1f}" if ev and t in ev["tasks"] else "-" for t in tasks]
        return (f"| {label} | {mult} | {loss:.3f} | " if loss is not None else f"| {label} | {mult} | - | ") \
            + " | ".join(cells) + (f" | {100 * ev['mean']:.1f} |" if ev and ev.get("mean") is not None else " | - |") + zero_shot(ev)

    for run_name, p in sorted(result["points"].items(), key=lambda kv: (kv[0].split("-")[1], kv[1]["multiple"], kv[0])):
        lines.append(row(run_name, f"{p['multiple']:g}", (p["eval"] or {}).get("heldout") or p["val_loss"], p["eval"]))
    for line, ev in result["twins"].items():
        lines.append(row(f"untrained twin ({line})", "0", ev.get("heldout"), ev))
    return "\n".join(lines)


def task_ahead(median: float, twin: list[float]) -> int:
    """1 where a point's median over its fine-tuning seeds is above every seed of its twin's, -1 where
    below every one, else 0 (within the twin's spread). The median, as every score here: one seed's
    fine-tuning that collapses (epistemic_nli: the twin's 74.0 beside 91.7 and 92.0) moves neither side."""
    return 1 if median > max(twin) else -1 if median < min(twin) else 0


def leaves(verdicts: dict[float, int]) -> str:
    """The first multiple from which a line stays ahead of its twin at every later point measured,
    or "not by Nx" (the largest measured)."""
    ks = sorted(verdicts)
    first = next((k for i, k in enumerate(ks) if all(verdicts[j] > 0 for j in ks[i:])), None)
    return f"{first:g}x" if first is not None else f"not by {ks[-1]:g}x" if ks else "-"


def versus(result: dict) -> list[dict]:
    """Each line (schedule, line, seed) with a twin, against that twin at each multiple of the hour:
    per task the margin of the medians and ``task_ahead``; zero-shot (the headline scorer's macro and
    each phenomenon, over their pooled pairs) the margin and eval.pairs' ``ahead_of``; and where it
    ``leaves`` the twin. A line's points made by different code are joined (every commit since 70188c8
    leaves a CPU step as it was); where two share a multiple the fp32 one is taken, and a bf16 one is
    marked. Rows: {"line", "kind" (task, zero-shot), "what", "cells": {multiple: (margin, ahead, bf16)}, "leaves"}."""
    lines: dict[tuple, dict] = {}
    for key in sorted(result["points"]):
        p = result["points"][key]
        if not p.get("eval"):
            continue
        k, bf16 = parse(key), is_bf16(key, p)
        at = lines.setdefault((k["schedule"], k["line"], k["seed"]), {})
        if p["multiple"] not in at or at[p["multiple"]][1] and not bf16:
            at[p["multiple"]] = (p["eval"], bf16)
    twins = {}
    for key in sorted(result["twins"]):
        twins.setdefault(key.partition("@")[0], result["twins"][key])
    rows = []
    for (schedule, line, seed), at in sorted(lines.items(), key=lambda kv: (kv[0][0] != "wsd", kv[0])):  # the long lines first
        base = line.split("+")[0]
        twin = twins.get(TWIN_OF.get(base, base))
        if twin is None:
            continue
        label = f"{line} ({schedule}, seed {seed})"
        for task in sorted(twin["tasks"]):
            cells = {m: (ev["tasks"][task]["median"] - twin["tasks"][task]["median"],
                         task_ahead(ev["tasks"][task]["median"], twin["tasks"][task]["seeds"]), bf16)
                     for m, (ev, bf16) in at.items() if task in ev["tasks"]}
            rows.append({"line": label, "kind": "task", "what": task, "cells": cells})
        head = twin.get("zero_shot_headline")
        zs = {m: (ev, bf16) for m, (ev, bf16) in at.items() if ev.get("zero_shot_headline") == head and head}
        if zs and head in twin.get("zero_shot", {}):
            b, nb = twin["zero_shot"][head], twin.get("zero_shot_pairs")
            rows.append({"line": label, "kind": "zero-shot", "what": f"macro ({head})", "cells": {
                m: (ev["zero_shot"][head] - b, ahead_of(ev["zero_shot"][head], n, b, nb) if (n := ev.get("zero_shot_pairs")) and nb else 0, bf16)
                for m, (ev, bf16) in zs.items()}})
            for ph, b in sorted((twin.get("phenomena") or {}).items()):
                nb = (twin.get("phenomenon_pairs") or {}).get(ph)
                cells = {}
                for m, (ev, bf16) in zs.items():
                    if (a := (ev.get("phenomena") or {}).get(ph)) is not None:
                        n = (ev.get("phenomenon_pairs") or {}).get(ph)
                        cells[m] = (a - b, ahead_of(a, n, b, nb) if n and nb else 0, bf16)
                rows.append({"line": label, "kind": "zero-shot", "what": ph, "cells": cells})
    for r in rows:
        r["leaves"] = leaves({m: c[1] for m, c in r["cells"].items()})
    return rows


def versus_table(result: dict) -> str:
    """``versus`` as markdown, a table of the tasks and one of zero-shot: margins in points, **ahead**,
    *behind*, † a bf16 point."""
    rows = versus(result)

    def cell(c) -> str:
        if c is None:
            return "-"
        text = f"{100 * c[0]:+.1f}" + ("†" if c[2] else "")
        return f"**{text}**" if c[1] > 0 else f"*{text}*" if c[1] < 0 else text

    out = []
    for kind, title, rule, what in (
            ("task", "Tasks", "the median of its fine-tuning seeds above (below) every seed of the twin's", "task"),
            ("zero-shot", "Zero-shot", "beyond two binomial standard errors of the pooled pairs and 2 points; the "
             "headline scorer's macro, then each phenomenon", "phenomenon")):
        mine = [r for r in rows if r["kind"] == kind]
        if not mine:
            continue
        out += [f"{title} against the untrained twin: the margin in points at each multiple of the hour; "
                f"**bold** ahead, *italic* behind ({rule}); † a bf16 point. Every seed of a line against the line's one "
                "twin (seed 0's untrained model; the twins' rows above give its code). Leaves the twin: the first multiple "
                "from which it stays ahead at every later point.", "",
                f"| line | {what} | " + " | ".join(f"{k}x" for k in KS) + " | leaves the twin |",
                "|---|---|" + "---:|" * len(KS) + "---|"]
        out += [f"| {r['line']} | {r['what']} | " + " | ".join(cell(r["cells"].get(k)) for k in KS) + f" | {r['leaves']} |"
                for r in mine]
        out.append("")
    return "\n".join(out).rstrip()


def parse(key: str) -> dict:
    """A point's key, ``{schedule}-{line}-s{seed}[-{k}x][-{variant}][@code]``, in parts; a variant (a
    run beside its line with one field changed, own-rtd-s1-1x-nsf32) is a line of its own, ``rtd+nsf32``."""
    run_name, _, code = key.partition("@")
    schedule, line, rest = run_name.split("-", 2)
    seed, *more = rest.split("-")
    line += "".join(f"+{m}" for m in more if not re.fullmatch(r"\d+x", m))
    return {"schedule": schedule, "line": line, "seed": int(seed[1:]), "code": code or None}


def is_bf16(key: str, point: dict) -> bool:
    """Whether a point trained in bf16: its code (the key's, else the row's) ends in "-bf16"."""
    return (parse(key)["code"] or point.get("code") or "").endswith("-bf16")


def plot_groups(points: dict) -> dict[tuple, list]:
    """The plotted lines: {(schedule, line, precision): [(multiple, seed, eval), ...]}. A line's points
    made by different code in the same precision are one line (every commit since 70188c8 leaves a CPU
    step as it was; points.md names each point's code); "-bf16" codes trained in bf16, the rest fp32."""
    groups: dict[tuple, list] = {}
    for key, p in points.items():
        k = parse(key)
        groups.setdefault((k["schedule"], k["line"], "bf16" if is_bf16(key, p) else "fp32"), []).append(
            (p["multiple"], k["seed"], p["eval"]))
    return groups


def plot(result: dict, path: Path) -> None:
    """Downstream against compute: one panel per task and one for zero-shot (each point's headline
    scorer), x the multiple of the hour's FLOPs (log 2), a line per (schedule, line, precision) with
    each seed a marker, and each line's untrained twin dashed in its colour."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = {k: p for k, p in result["points"].items() if p.get("eval")}
    tasks = sorted({t for p in points.values() for t in p["eval"]["tasks"]}) + ["zero-shot"]

    def score(ev: dict, task: str):
        if task == "zero-shot":
            acc = ev.get("zero_shot", {}).get(ev.get("zero_shot_headline"))
            return None if acc is None else 100 * acc
        return 100 * ev["tasks"][task]["median"] if task in ev["tasks"] else None

    groups = plot_groups(points)
    colors = dict(zip(sorted({g[1] for g in groups} | {t.partition("@")[0] for t in result["twins"]}),
                      plt.rcParams["axes.prop_cycle"].by_key()["color"] * 3))
    cols = 3
    fig, axes = plt.subplots((len(tasks) + cols - 1) // cols, cols, figsize=(4.2 * cols, 3.4 * ((len(tasks) + cols - 1) // cols)),
                             squeeze=False)
    for ax, task in zip(axes.flat, tasks):
        for (schedule, line, precision), rows in sorted(groups.items()):
            style = ("^" if precision == "bf16" else "o" if schedule == "wsd" else "s") + ("-" if schedule == "wsd" else ":")  # bf16: triangles
            for seed in sorted({r[1] for r in rows}):
                pts = sorted((m, y) for m, s_, ev in rows if s_ == seed and (y := score(ev, task)) is not None)
                if pts:
                    ax.plot(*zip(*pts), style, color=colors[line], alpha=1 if seed == 0 else 0.5,
                            label=f"{line} ({schedule}, {precision})" if seed == min(r[1] for r in rows) else None)
        for twin_key, ev in result["twins"].items():
            line, _, code = twin_key.partition("@")
            if (y := score(ev, task)) is not None:
                ax.axhline(y, color=colors[line], ls="--", lw=1, label=f"twin {line}" + (f" ({code})" if code else ""))
        ax.set_xscale("log", base=2)
        ax.set_xticks(KS, [f"{k}x" for k in KS])
        ax.set_title(task)
        ax.set_xlabel("x the hour's FLOPs (1.49e14)")
    for ax in list(axes.flat)[len(tasks):]:
        ax.axis("off")
    legend: dict = {}  # every panel's lines (a zero-shot-only twin draws in the zero-shot panel alone)
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    handles, labels = list(legend.values()), list(legend)
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8)
    legend_rows = (len(labels) + 3) // 4
    fig.tight_layout(rect=(0, 0.02 + 0.025 * legend_rows, 1, 1))  # the legend below the panels, clear of their axes
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plan(out: Path, data_dir: str) -> list[str]:
    cmds = []
    for line in LINES:
        for seed in (0,) if line == "prose" else (0, 1):  # prose: the domain control, one seed
            if line in LONG:
                cmds.append(shlex.join(long_cmd(out, line, seed)) + ("" if seed == 0 else "   # seed 1: stopped past 1.6x"))
                for k in KS[:-1] if seed == 0 else (1, 2):
                    cmds.append(f"python benchmarks/bridge.py branch --line {line} --seed {seed} --k {k}")
            for k in (1,) if line in ("adamw", "prose") else (1, 4):
                cmds.append(f"python benchmarks/bridge.py own --line {line} --seed {seed} --k {k}")
    cmds.append("python benchmarks/bridge.py eval ...   # each point; --twin once per line")
    return cmds


def segments_markdown(out: Path) -> str:
    """Every run folder's segments under ``out`` (two levels: the ablations' and screens' runs sit in
    folders of their own), as one markdown table: which ran where, and what a cut-off cost."""
    from cramlm.report.rundata import read_metrics
    from cramlm.report.segments import markdown, segment_rows, segments

    rows = []
    for metrics in sorted([*out.glob("*/metrics.jsonl"), *out.glob("*/*/metrics.jsonl")]):
        run_dir = metrics.parent
        summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").is_file() else {}
        steps = summary.get("steps")
        rows += segment_rows(str(run_dir.relative_to(out)), segments(read_metrics(metrics), steps if isinstance(steps, int) else None))
    return markdown(rows)


def status(out: Path, now: float | None = None) -> str:
    """What the queues are doing: each unfinished run's step, share of its budget, rate over its last
    ten minutes of training and when it should end at that rate (UTC); each queue's next lines."""
    from datetime import datetime, timezone

    from cramlm.report.rundata import read_metrics
    from cramlm.report.segments import current_lines, when

    now = time.time() if now is None else now
    rows = []
    for metrics in sorted([*out.glob("*/metrics.jsonl"), *out.glob("*/*/metrics.jsonl")]):
        if (metrics.parent / "summary.json").is_file():
            continue
        train = [r for r in current_lines(read_metrics(metrics)) if r.get("kind") == "train" and r.get("t")]
        if not train:
            continue
        last = train[-1]
        recent = [r for r in train if r["elapsed"] >= last["elapsed"] - 600]
        rate = (last["t"] - recent[0]["t"]) / (last["elapsed"] - recent[0]["elapsed"]) if len(recent) > 1 else 0.0
        idle = now - metrics.stat().st_mtime
        ends = "-" if rate <= 0 else when(datetime.fromtimestamp(now + (1 - last["t"]) / rate, timezone.utc).isoformat(timespec="minutes"))
        per_minute = 60 * rate * last["step"] / last["t"]
        rows.append([str(metrics.parent.relative_to(out)), f"{last['step']:,} of ~{last['step'] / last['t']:,.0f}",
                     f"{100 * last['t']:.1f}%", f"{per_minute:.0f}", ends if idle < 600 else f"stopped ({idle / 60:,.0f} min since its last line)"])
    lines = ["| run | step | budget | steps a minute | ends at this rate (UTC) |", "|---|---:|---:|---:|---|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows] or ["| (no unfinished run) | | | | |"]
    for queue in sorted(out.glob("queue-*.txt")):
        todo = [x for x in queue.read_text().splitlines() if x.strip() and not x.lstrip().startswith("#")]
        lines += ["", f"{queue.name}: {len(todo)} line{'s' * (len(todo) != 1)} to run"]
        lines += [f"  {i + 1}. {x[:160]}" for i, x in enumerate(todo[:3])]
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["plan", "long", "branch", "own", "eval", "summarize", "segments", "status"])
    ap.add_argument("--out", type=Path, default=Path("outputs/bridge"))
    ap.add_argument("--line", choices=sorted(LINES), default="rtd")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--k", type=int, choices=KS, default=max(KS), help="the point, in multiples of the hour's FLOPs")
    ap.add_argument("--schedule", choices=["wsd", "own"], default="wsd", help="eval: which run of the point")
    ap.add_argument("--twin", action="store_true", help="eval: the line's untrained twin (through its point's run)")
    ap.add_argument("--json", type=Path, help="summarize: also write the result here (the table beside, .md, and the plot, .png)")
    ap.add_argument("--merge", type=Path, help="summarize: an earlier summary (JSON) whose rows are kept beside")
    ap.add_argument("--twins", type=Path, help="summarize: a folder of twins evaluated outside the run folders, <run>-untrained.json, for lines without one")
    args = ap.parse_args(argv)
    out, data_dir = args.out, os.environ.get("CRAMLM_DATA_DIR", "../shared/data")
    out.mkdir(parents=True, exist_ok=True)
    log = out / "bridge.log"
    if args.what in ("long", "branch") and args.line not in LONG:
        sys.exit(f"--line {args.line}: an objective line has no long run; `own --k 1` and `own --k 4` train it")
    if args.what == "plan":
        print("\n".join(plan(out, data_dir)))
    elif args.what == "long" and not done(out, name(args.line, args.seed)):
        run(long_cmd(out, args.line, args.seed), log)
    elif args.what == "branch" and args.k != max(KS) and not done(out, name(args.line, args.seed, args.k)):
        while (point := branch_point(out / name(args.line, args.seed), args.k)) is None:
            time.sleep(60)
        run(branch_cmd(out, args.line, args.seed, args.k, point), log)
    elif args.what == "own" and not done(out, name(args.line, args.seed, args.k, "own")):
        run(own_cmd(out, args.line, args.seed, args.k), log)
    elif args.what == "eval":
        run_name = name(args.line, args.seed, args.k, args.schedule)
        if not (out / run_name / ("eval-untrained.json" if args.twin else "eval.json")).is_file():
            run(eval_cmd(out, run_name, data_dir, args.twin), log)
    elif args.what == "segments":
        print(segments_markdown(out))
    elif args.what == "status":
        print(status(out))
    elif args.what == "summarize":
        result = summarize(out, args.merge, args.twins)
        text = table(result) + (f"\n\n{vs}" if (vs := versus_table(result)) else "")
        print(json.dumps(result))
        print(text)
        if args.json:
            write_result(args.json, result, text)
            if result["points"]:
                plot(result, args.json.with_suffix(".png"))


if __name__ == "__main__":
    main(sys.argv[1:])
