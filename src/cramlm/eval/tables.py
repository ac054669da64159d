"""Results over seeds -> one row per task and dev split -> tables (markdown, CSV, JSON).

Per row: the median over seeds of the last-epoch score (what cramming reports) and of the
best-epoch score (the epoch chosen by the headline metric, per seed), for every metric of the task.
Below the rows: arithmetic and harmonic mean of the headline metric over rows, as cramming's
GLUE average (MNLI matched and mismatched count as two rows). The harmonic mean is undefined
(None in JSON, "undefined" in tables) when a score is at or below 0.

``versus`` pairs a checkpoint's results with its untrained twin's (same architecture, tokenizer
and fine-tuning, random weights): the margin is what pretraining bought.
"""

from __future__ import annotations

import csv
import io
import statistics

import numpy as np

from cramlm.eval.metrics import arithmetic_mean, harmonic_mean, score
from cramlm.eval.tasks import SAMPLE_SEED, Task, sample


def objective_label(objective: str) -> str:
    """A held-out loss's objective in words, as its component names it (``loss_title``: 'MLM',
    'causal LM', 'RTD generator MLM', a plugin's own); an objective no component registers, as given."""
    from cramlm.config.registry import config_class

    try:
        return config_class("objective", objective).loss_title or objective
    except (KeyError, ValueError):
        return objective


def majority_scores(task: Task, max_dev_examples: int | None = None) -> dict[str, float]:
    """Per dev split, the headline score of always predicting the most frequent training label
    (regression: the training mean, which scores 0 correlation): the floor a model must beat."""
    train_y = np.asarray([e.label for e in task.train])
    constant = train_y.mean() if task.is_regression else np.bincount(train_y.astype(int)).argmax()
    out = {}
    for split, exs in task.dev.items():
        dev_y = np.asarray([e.label for e in sample(exs, max_dev_examples)])
        out[split] = score(task.metric, np.full(len(dev_y), constant), dev_y)
    return out


def task_rows(task: Task, runs: list[dict], majority: dict[str, float] | None = None) -> list[dict]:
    """Rows for ``task`` from its per-seed ``finetune`` results."""
    rows = []
    for split in task.dev:
        name = task.name if split == "dev" else f"{task.name}-{split}"
        per_seed = []
        for run in runs:
            scores = [epoch[split] for epoch in run["epochs"]]  # [{metric: value}] per epoch
            best_epoch = max(range(len(scores)), key=lambda e: scores[e][task.metric])
            per_seed.append({"seed": run["seed"], "last": scores[-1], "best": scores[best_epoch], "best_epoch": best_epoch + 1, "epochs": scores})
        rows.append(
            {
                "task": name,
                "metric": task.metric,
                "metrics": task.metrics,
                "score": statistics.median(s["last"][task.metric] for s in per_seed),  # the headline
                "best": statistics.median(s["best"][task.metric] for s in per_seed),
                "last_metrics": {m: statistics.median(s["last"][m] for s in per_seed) for m in task.metrics},
                "best_metrics": {m: statistics.median(s["best"][m] for s in per_seed) for m in task.metrics},
                "seeds": per_seed,
                "train_examples": runs[0]["train_examples"],
                "dev_examples": runs[0]["dev_examples"][split],
                "seconds": round(sum(r["seconds"] for r in runs), 1),
                "majority": (majority or {}).get(split),
            }
        )
    return rows


def means(rows: list[dict]) -> dict[str, dict[str, float]]:
    out = {}
    for which, key in (("last", "score"), ("best", "best")):
        headline = [r[key] for r in rows]
        out[which] = {"arithmetic": arithmetic_mean(headline), "harmonic": harmonic_mean(headline)}
    return out


UNDEFINED = "undefined"


def _pct(x: float | None) -> str:
    return UNDEFINED if x is None else f"{100 * x:.2f}"


def _others(row: dict) -> str:
    return ", ".join(f"{m} {_pct(row['last_metrics'][m])}" for m in row["metrics"][1:])


HEADER = ["task", "metric", "last epoch", "best epoch", "other metrics (last)", "seeds", "train", "dev", "majority class"]
LEFT = {0, 1, 4}  # text columns; the others are numbers


def _cells(rows: list[dict], mean: dict) -> list[list[str]]:
    """The eval table's cells (scores in %, two decimals), the means last: eval.md and the console share them."""
    cells = [[r["task"], r["metric"], _pct(r["score"]), _pct(r["best"]), _others(r), str(len(r["seeds"])),
              str(r["train_examples"]), str(r["dev_examples"]), _pct(r["majority"]) if r.get("majority") is not None else "-"]
             for r in rows]
    for kind in ("arithmetic", "harmonic") if rows else ():  # no tasks (eval.tasks=[]): no means of nothing
        cells.append([f"{kind} mean", "", _pct(mean["last"][kind]), _pct(mean["best"][kind]), "", "", "", "", ""])
    return cells


NO_TASKS = "no fine-tuning tasks (eval.tasks=[])"


def markdown(rows: list[dict], mean: dict, title: str) -> str:
    if not rows:
        return f"**{title}**: {NO_TASKS}\n"
    lines = [f"**{title}**", "", "| " + " | ".join(HEADER) + " |",
             "|" + "|".join("---" if i in LEFT else "---:" for i in range(len(HEADER))) + "|"]
    for c in _cells(rows, mean):
        if c[0].endswith(" mean"):
            c = [f"**{c[0]}**", *c[1:]]
        lines.append("|" + "|".join(f" {v} " if v else " " for v in c) + "|")
    notes = [n for n in (sample_note(rows), select_note(rows)) if n]
    return "\n".join(lines) + "\n" + "".join(f"\n{n}\n" for n in notes)


def select_note(rows: list[dict]) -> str:
    """What eval.md says when ``eval.select`` chose a task's lr and epochs ("" when none was chosen)."""
    chosen = [f"{r['task']} lr {sel['lr']:g}, {sel['epochs']} epochs ({sel['metric']} on {sel['held_out']:,} held-out "
              f"training examples, {len(sel['grid'])} configurations)" for r in rows if (sel := r.get("selected"))]
    return (f"Chosen per task (`eval.select`, on a share of the training split, never dev): {'; '.join(chosen)}."
            if chosen else "")


def sample_note(rows: list[dict]) -> str:
    """What eval.md says when max_train_examples / max_dev_examples cut a split ("" when none did)."""
    cut = []
    for r in rows:
        hp = r.get("hparams") or {}
        for key, count, what in (("max_train_examples", "train_examples", "train"), ("max_dev_examples", "dev_examples", "dev")):
            if hp.get(key) and r.get(count) == hp[key]:
                cut.append(f"{r['task']} {what} {hp[key]:,}")
    if not cut:
        return ""
    return (f"Sampled ({', '.join(cut)} examples): a random sample with the fixed seed {SAMPLE_SEED}, the same "
            "for every model and seed, in file order (`eval.max_train_examples`, `eval.max_dev_examples`).")


def text_table(rows: list[dict], mean: dict, title: str) -> str:
    """The same table as plain aligned text, for the console."""
    if not rows:
        return f"{title}: {NO_TASKS}\n"
    cells = [HEADER, *_cells(rows, mean)]
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADER))]
    line = lambda c: "  ".join(v.ljust(w) if i in LEFT else v.rjust(w) for i, (v, w) in enumerate(zip(c, widths))).rstrip()  # noqa: E731
    return f"{title}:\n" + "\n".join(line(c) for c in cells) + "\n"


def to_csv(rows: list[dict], mean: dict) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["task", "metric", "last", "best", "other_metrics_last", "seeds", "train_examples", "dev_examples", "seconds", "majority"])
    for r in rows:
        others = ";".join(f"{m}={r['last_metrics'][m]:.6f}" for m in r["metrics"][1:])
        writer.writerow([r["task"], r["metric"], f"{r['score']:.6f}", f"{r['best']:.6f}", others,
                         len(r["seeds"]), r["train_examples"], r["dev_examples"], r["seconds"],
                         "" if r.get("majority") is None else f"{r['majority']:.6f}"])
    for kind in ("arithmetic", "harmonic") if rows else ():
        writer.writerow([f"{kind}_mean", "", *(UNDEFINED if mean[w][kind] is None else f"{mean[w][kind]:.6f}" for w in ("last", "best")),
                         "", "", "", "", "", ""])
    return buf.getvalue()


def same_protocol(row: dict, twin: dict | None) -> bool:
    """Whether the twin's row of a task was fine-tuned as the run's was: the same metric, examples,
    number of seeds and hyperparameters (those eval.select chose for each model apart): a margin
    between two protocols measures the protocols."""
    if not isinstance(twin, dict) or twin.get("metric") != row.get("metric"):
        return False
    for key in ("train_examples", "dev_examples"):
        if key in row and key in twin and row[key] != twin[key]:
            return False
    if isinstance(row.get("seeds"), list) and isinstance(twin.get("seeds"), list) and len(row["seeds"]) != len(twin["seeds"]):
        return False
    chosen = set((row.get("selected") or {})) | set((twin.get("selected") or {}))
    a, b = row.get("hparams"), twin.get("hparams")
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: v for k, v in a.items() if k not in chosen} == {k: v for k, v in b.items() if k not in chosen}
    return True  # rows written before hparams were recorded: as before


def versus(pretrained: dict, untrained: dict | None) -> list[dict]:
    """Per task of ``pretrained`` (an ``eval.json``): its headline score, the untrained twin's, the
    margin (pretrained - untrained; None where the twin lacks the task) and the majority-class floor."""
    twin = {row.get("task"): row for row in (untrained or {}).get("results", []) if isinstance(row, dict)}
    out = []
    for row in pretrained.get("results", []):
        if not isinstance(row, dict) or not isinstance(row.get("score"), (int, float)):
            continue  # a row without a headline score (an older or hand-made eval.json)
        other = twin.get(row.get("task"))
        base = other.get("score") if same_protocol(row, other) else None
        base = base if isinstance(base, (int, float)) else None
        out.append({"task": row.get("task"), "metric": row.get("metric"), "pretrained": row["score"], "untrained": base,
                    "margin": None if base is None else row["score"] - base, "majority": row.get("majority")})
    return out


AHEAD, BEHIND = 0.02, 0.01  # a margin that counts as a gain (2 points) and as a loss (1 point)


def _seed_spread(row: dict | None) -> float | None:
    """Max - min of the per-seed headline scores; None with fewer than two seeds."""
    seeds = (row or {}).get("seeds")
    if not isinstance(seeds, list):
        return None
    scores = [s["last"][row["metric"]] for s in seeds
              if isinstance(s, dict) and isinstance(s.get("last"), dict) and isinstance(s["last"].get(row.get("metric")), (int, float))]
    return max(scores) - min(scores) if len(scores) > 1 else None


def twin_heldout(pretrained: dict, untrained: dict | None) -> dict | None:
    """The twin's held-out loss where it is the same objective's as the run's (a loss of another
    objective, e.g. an MLM twin beside a hybrid run's masked next-token loss, compares nothing)."""
    lm_a, lm_b = pretrained.get("heldout"), (untrained or {}).get("heldout")
    if not isinstance(lm_b, dict) or not isinstance(lm_a, dict) or lm_a.get("objective") != lm_b.get("objective"):
        return None
    return lm_b


DRY_RUN_VERDICT = "dry run: a few steps scored on a few examples; the scores check the machinery, they say nothing about learning"


def verdict(pretrained: dict, untrained: dict | None, dryrun: bool = False) -> str | None:
    """What pretraining bought, in a few sentences, what paid first: per fine-tuned task, ahead of the untrained twin
    by >= 2 points, behind by > 1 point, or level (and whether a margin lies within the seeds'
    spread); zero-shot, per minimal-pair paradigm (eval/pairs.py: pairs_verdict); the held-out LM
    loss of both as the evidence of what pretraining learnt, and where it was measured to pay.
    ``dryrun``: a dry run's scores say nothing about learning, and the verdict says so instead."""
    from cramlm.eval.pairs import pairs_verdict

    rows = [r for r in versus(pretrained, untrained) if r["margin"] is not None]
    zero_shot = pairs_verdict(pretrained.get("minimal_pairs"), (untrained or {}).get("minimal_pairs"))
    if not rows and not zero_shot:
        return None
    if dryrun:
        return DRY_RUN_VERDICT
    finetuned, paid = _finetuned_verdict(pretrained, untrained, rows) if rows else (None, False)
    if finetuned and zero_shot:  # both kinds: each named, and what paid said first
        finetuned = "fine-tuned, " + finetuned
    zero_shot_first = bool(zero_shot) and zero_shot.startswith("zero-shot, pretraining paid") and not paid
    said = [s for s in ((zero_shot, finetuned) if zero_shot_first else (finetuned, zero_shot)) if s]
    text = ". ".join(s[0].upper() + s[1:] if i else s for i, s in enumerate(said))
    lm_a, lm_b = pretrained.get("heldout"), twin_heldout(pretrained, untrained)
    if isinstance(lm_a, dict) and isinstance(lm_b, dict) and all(isinstance(x.get("loss"), (int, float)) for x in (lm_a, lm_b)):
        text += (f". Held-out {objective_label(str(lm_a.get('objective') or 'LM'))} loss {lm_a['loss']:.2f} against the twin's {lm_b['loss']:.2f}: "
                 + ("the model learnt the corpus" if lm_a["loss"] < lm_b["loss"] - 0.5 else "it learnt little of the corpus"))
        if rows and not paid and lm_a["loss"] < lm_b["loss"] - 0.5:
            text += (", but not yet features these fine-tuned tasks need beyond what fine-tuning from random weights "
                     "finds (measured on 2 CPU cores: a minute pays zero-shot on word order in held-out text and on no "
                     "fine-tuned task, an hour on fine-tuned sentence pairs and fact claims, not on sentiment or spam, where a bag of words "
                     "with a few thousand labels does as well: benchmarks/results/demo_minute_tasks.md, single_sentence.md)")
    return text + "."


def _finetuned_verdict(pretrained: dict, untrained: dict | None, rows: list[dict]) -> tuple[str, bool]:
    """The fine-tuned tasks' sentence of :func:`verdict` and whether it paid (``rows``: versus()
    rows with a margin)."""
    margin = {r["task"]: round(r["margin"], 9) for r in rows}  # 0.82 - 0.80 is a gain of 2 points
    ahead = [t for t, m in margin.items() if m >= AHEAD]
    behind = [t for t, m in margin.items() if m < -BEHIND]
    by_task = {r.get("task"): r for r in pretrained.get("results", []) if isinstance(r, dict)}
    twin = {r.get("task"): r for r in (untrained or {}).get("results", []) if isinstance(r, dict)}
    noise = []
    for t, m in margin.items():
        spreads = [x for x in (_seed_spread(by_task.get(t)), _seed_spread(twin.get(t))) if x is not None]
        if spreads and abs(m) <= max(spreads):
            noise.append(t)
    paid = len(ahead) > len(rows) / 2 and not behind
    text = (f"pretraining {'paid' if paid else 'did not pay (yet)'}: ahead of the untrained twin by >= 2 points on "
            f"{len(ahead)} of {len(rows)} task{'s' if len(rows) > 1 else ''}"
            + (f" ({', '.join(ahead)})" if ahead and len(ahead) < len(rows) else "")
            + f", behind by more than 1 point on {len(behind)}" + (f" ({', '.join(behind)})" if behind else ""))
    if noise:
        text += f"; the margin is within the fine-tuning seeds' spread on {len(noise)}"
    return text, paid


def versus_text(pretrained: dict, untrained: dict | None, say_verdict: bool = True) -> str:
    """A plain-text table of :func:`versus` for the console (scores in %, margin in points), then
    :func:`verdict` unless ``say_verdict`` is false."""
    rows = versus(pretrained, untrained)
    header = ["task", "metric", "pretrained", "untrained", "margin", "majority"]
    cells = [[r["task"], r["metric"], _pct(r["pretrained"]), "-" if r["untrained"] is None else _pct(r["untrained"]),
              "-" if r["margin"] is None else f"{100 * r['margin']:+.2f}", "-" if r["majority"] is None else _pct(r["majority"])]
             for r in rows]
    means_row = ["arithmetic mean", "", _pct(pretrained["mean"]["last"]["arithmetic"])]
    twin_mean = (untrained or {}).get("mean", {}).get("last", {}).get("arithmetic")
    means_row += [_pct(twin_mean) if untrained else "-",
                  f"{100 * (pretrained['mean']['last']['arithmetic'] - twin_mean):+.2f}" if untrained and twin_mean is not None else "-", ""]
    if rows:
        cells.append(means_row)
    lm_a, lm_b = pretrained.get("heldout"), twin_heldout(pretrained, untrained)
    if lm_a:
        cells.append([f"held-out {objective_label(str(lm_a.get('objective') or 'LM'))} loss", "", f"{lm_a['loss']:.3f}",
                      f"{lm_b['loss']:.3f}" if lm_b else "-", f"{lm_a['loss'] - lm_b['loss']:+.3f}" if lm_b else "-", ""])
    widths = [max(len(str(c[i])) for c in [header, *cells]) for i in range(len(header))]
    fmt = lambda c: "  ".join(str(v).ljust(w) if i < 2 else str(v).rjust(w) for i, (v, w) in enumerate(zip(c, widths)))  # noqa: E731
    said = verdict(pretrained, untrained) if say_verdict else None
    return "\n".join([fmt(header), *(fmt(c) for c in cells)]) + "\n" + (f"{said}\n" if said else "")

