"""``report.html``: a curated runs table (labels and units; summary.json stays available, raw, in a
collapsed section), the evaluation against the untrained twin and the majority class, the plots
and the pipeline's stages."""

from __future__ import annotations

import base64
import html
import json
import os
import statistics
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import yaml

from cramlm.io import on_full_disk, write_text
from cramlm.report.rundata import (
    RunData, as_percent, is_number, load_run_data, loss_groups, percent_scores, result_score, train_task_differences,
    train_task_words)

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; padding: 0 1em; max-width: 1100px; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
th { background: #f3f3f3; }
tr.mean td { font-weight: 600; background: #fafafa; }
td.pos { color: #1a7f37; } td.neg { color: #b3261e; }
figure { margin: 1em 0 2em; } figcaption { font-weight: 600; margin-bottom: 0.3em; }
figcaption small { font-weight: normal; color: #555; }
img { max-width: 100%; border: 1px solid #eee; }
pre { background: #f7f7f7; padding: 1em; overflow-x: auto; font-size: 0.8em; }
p.note { color: #555; font-size: 0.85em; max-width: 60em; }
div.text td, div.text th { text-align: left; }
"""

UNDEFINED = "undefined"


# ------------------------------------------------------------------------------ formatting


def _fmt(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return html.escape(str(value))
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1e5 else f"{value:,.0f}"
    return html.escape(str(value))


def duration(seconds: float) -> str:
    """A budget or a time as people write it: 45s, 1m, 1m 30s, 1h, 24h, 1h 30m."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        m, s = divmod(seconds, 60)
        return f"{m}m" + (f" {s}s" if s else "")
    h, rest = divmod(seconds, 3600)
    return f"{h}h" + (f" {rest // 60}m" if rest // 60 else "")


def seconds_text(seconds: float) -> str:
    return f"{seconds:,.1f} s" + (f" ({duration(seconds)})" if seconds >= 60 else "")


def si(value: float, unit: str) -> str:
    """1.139e12 FLOPs -> '1.14 TFLOPs'."""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _pct(value: float | None, digits: int = 1) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _table(header: list[str], rows: list[list[Any]], row_classes: list[str] | None = None) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{row_classes[i]}"' if row_classes and row_classes[i] else ""
        body.append(f"<tr{cls}>" + "".join(_cell(c) for c in row) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


class Margin(float):
    """A margin in points: signed and coloured in tables."""


def _cell(value: Any) -> str:
    if isinstance(value, Margin):
        shown = round(float(value), 1) + 0.0  # as printed: a margin that rounds to zero is neither sign (no "-0.0")
        return f'<td class="{"pos" if shown > 0 else "neg" if shown < 0 else ""}">{shown:+.1f}</td>'
    return f"<td>{_fmt(value)}</td>"


# -------------------------------------------------------------------------------- runs table


def _objective(run: RunData) -> str:
    return f"{run.objective} ({run.objective_config.title})"


def _model(run: RunData) -> str | None:
    arch = run.config.get("arch") or {}
    if not arch.get("type"):
        return None
    shape = [f"hidden {arch['hidden_size']}" if arch.get("hidden_size") else "",
             f"{arch['num_layers']} layers" if arch.get("num_layers") else ""]
    shape = ", ".join(s for s in shape if s)
    return f"{arch['type']} ({shape})" if shape else str(arch["type"])


def _data(run: RunData) -> str | None:
    data = run.config.get("data") or {}
    if not data.get("name"):
        return None
    parts = [f"{data['seq_length']}-token sequences" if data.get("seq_length") else "",
             f"tokenizer {run.tokenizer}" if run.tokenizer else ""]
    parts = ", ".join(p for p in parts if p)
    return f"{data['name']} ({parts})" if parts else str(data["name"])


def _budget(run: RunData) -> str | None:
    hours = run.config.get("budget")
    limits = ((run.config.get("train") or {}).get("budget") or {})
    parts = [duration(3600 * hours)] if is_number(hours) else []
    if is_number(limits.get("tokens")):
        parts.append(f"{int(limits['tokens']):,} tokens")
    if is_number(limits.get("flops")):
        parts.append(si(limits["flops"], "FLOPs"))
    if is_number(limits.get("steps")):
        parts.append(f"{int(limits['steps']):,} steps")
    if parts:
        return parts[0] + " of training" if len(parts) == 1 else " or ".join(parts) + ", whichever is spent first"
    return str(run.summary["budget"]) if run.summary.get("budget") else None


def _twin_heldout(r: RunData) -> dict | None:
    """The twin's held-out block where it measured the run's objective (eval/tables.py: twin_heldout)."""
    from cramlm.eval.tables import twin_heldout

    return twin_heldout(r.eval or {}, r.eval_untrained) if r.eval_untrained else None


def _heldout_loss(heldout: Any) -> str | None:
    if not isinstance(heldout, dict) or not is_number(heldout.get("loss")):
        return None
    extra = f", perplexity {heldout['perplexity']:,.1f}" if is_number(heldout.get("perplexity")) else ""
    seqs = f" ({heldout['sequences']:,} sequences)" if isinstance(heldout.get("sequences"), int) else ""
    return f"{heldout['loss']:.3f}{extra}{seqs}"


def _heldout_bpb(heldout: Any) -> str | None:
    return f"{heldout['bpb']:.3f}" if isinstance(heldout, dict) and is_number(heldout.get("bpb")) else None


def _train_loss(run: RunData) -> str | None:
    """'43.549 → 22.015 (generator MLM + 50 x detector BCE)': the loss the run minimised, first and
    last logged, with its objective's words where it is not one task's loss (its ``train_loss``); a run
    without summary.json, its metrics' first and last so far."""
    first, last, so_far = run.summary.get("first_loss"), run.summary.get("last_loss"), ""
    if not run.summary and (losses := run.logged("loss")[1]):
        first, last, so_far = losses[0], losses[-1], " so far"
    if not (is_number(first) and is_number(last)):
        return None
    words = run.train_loss_words
    return f"{first:.3f} → {last:.3f}{so_far}" + (f" ({words})" if words else "")


def _last_logged(run: RunData) -> dict[str, Any]:
    """A run without summary.json (training, or stopped before its end): its last train metrics line
    ({} for a finished run or one that logged none)."""
    if run.summary:
        return {}
    lines = [m for m in run.metrics if m.get("kind", "train") == "train" and is_number(m.get("step"))]
    return lines[-1] if lines else {}


def _status(run: RunData) -> str | None:
    """Where a run without summary.json stands (training, stopped, failed, or trained to its end with its
    summary not written), from its log's last lines; None for a finished run (the row is left out, or
    says "finished" beside an unfinished one) or one with no log."""
    if run.summary or not run.log:
        return None
    last = _last_logged(run)
    step = last.get("step") if last else max((m["step"] for m in run.log if is_number(m.get("step"))), default=None)
    where = (f"step {step:,}" if is_number(step) else "no step logged") + (
        f", {100 * last['t']:.0f} % of the budget" if is_number(last.get("t")) else "")
    end = next((m for m in reversed(run.log) if m.get("kind") in ("event", "finished")), {})
    old = run.stale_summary.get("steps")  # the step of a summary.json from before the run trained on
    of_step = f", of step {old:,}," if is_number(old) else ""
    past = f"; its summary.json{of_step} is from before it trained on" if run.stale_summary else ""
    if end.get("kind") == "finished":
        there = f"; the one there is of step {old:,}" if is_number(old) else ""
        return (f"trained to its end ({where}); its summary.json was not written (the save stopped: run it again with "
                f"--resume auto){there}")
    if end.get("event") == "failed":
        return f"failed at {where}: {end.get('error') or 'an error'}{past}"
    stopped_at = end.get("step") if is_number(end.get("step")) else 0
    if end.get("event") == "interrupted" and stopped_at >= (step if is_number(step) else 0):
        return (f"stopped at {where} ({end.get('signal') or 'a signal'}; checkpoint "
                f"{Path(str(end.get('checkpoint') or '?')).name}): not finished, --resume auto continues{past}")
    path = run.folder / "metrics.jsonl"
    when = datetime.fromtimestamp(path.stat().st_mtime, timezone.utc).strftime("%Y-%m-%d %H:%M UTC") if path.is_file() else None
    return (f"not finished: last logged {where}" + (f" (metrics.jsonl written {when})" if when else "")
            + "; training still, or cut off without a signal" + past)


def _so_far(run: RunData, key: str, write: Callable[[Any], str]) -> str | None:
    """A run without summary.json: the last logged ``key`` as ``write`` writes it, followed by "so far"."""
    value = _last_logged(run).get(key)
    return f"{write(value)} so far" if is_number(value) else None


def _percent(value: float) -> str:
    return f"{100 * value:.0f} %"


def _val_loss(run: RunData) -> str | None:
    """summary.json's val_loss, else the last one logged (a run still training, or an older one)."""
    if is_number(run.summary.get("val_loss")):
        return f"{run.summary['val_loss']:.3f}"
    logged = run.series("step", "val_loss")[1]
    return f"{logged[-1]:.3f} ({'last logged' if run.summary else 'so far'})" if logged else None


def _eval_means(run: RunData, results: list[dict] | None = None) -> tuple[float | None, float | None, bool]:
    """(arithmetic mean in %, harmonic mean in % or None where undefined, any score at all) of the run's
    task results (or of ``results``)."""
    from cramlm.eval.metrics import harmonic_mean

    scores = percent_scores(run.eval_results if results is None else results)
    if not scores:
        return None, None, False
    return statistics.fmean(scores), harmonic_mean(scores), True


# label -> how to read it from a run (None: the row is left out for that run). Every label says
# what the number is and its unit; summary.json is shown raw below the table.
FACTS: list[tuple[str, Callable[[RunData], Any]]] = [
    ("Model", _model),
    ("Status", _status),
    ("Objective", _objective),
    ("Parameters", lambda r: r.summary.get("parameters")),
    ("Data", _data),
    ("Data warnings (from its preparation)", lambda r: "; ".join(r.summary["data_warnings"]) if r.summary.get("data_warnings") else None),
    ("Budget", _budget),
    ("Budget used", lambda r: _percent(r.summary["t"]) if is_number(r.summary.get("t")) else _so_far(r, "t", _percent)),
    ("Training time (counted)", lambda r: seconds_text(r.summary["train_seconds"]) if is_number(r.summary.get("train_seconds"))
     else _so_far(r, "elapsed", seconds_text)),
    ("Set-up time (not counted)", lambda r: seconds_text(r.summary["setup_seconds"]) if is_number(r.summary.get("setup_seconds")) else None),
    ("Optimizer steps", lambda r: r.summary.get("steps") if r.summary else _so_far(r, "step", "{:,}".format)),
    ("Tokens trained on", lambda r: r.summary.get("tokens") if r.summary else _so_far(r, "tokens", "{:,}".format)),
    ("Throughput", lambda r: f"{r.summary['tokens_per_second']:,.0f} tokens/s" if is_number(r.summary.get("tokens_per_second"))
     else f"{v:,.0f} tokens/s (the last logged window)" if is_number(v := _last_logged(r).get("tokens_per_second"))
     else None),
    ("Training compute", lambda r: si(r.summary["flops"], "FLOPs") + (f" ({si(r.summary['flops_per_token'], 'FLOPs')} per token)"
                                                                          if is_number(r.summary.get("flops_per_token")) else "")
     if is_number(r.summary.get("flops")) else None),
    ("MFU (model FLOPs utilisation)", lambda r: (f"{100 * r.summary['mfu']:.1f} % of "
                                                 f"{si(r.summary['peak_flops'] * (r.summary.get('world_size') or 1), 'FLOP/s')}"
                                                 + (f" ({r.summary['peak_source']})" if r.summary.get("peak_source") else ""))
     if is_number(r.summary.get("mfu")) and is_number(r.summary.get("peak_flops")) else None),
    ("Processes", lambda r: r.summary.get("world_size") if (r.summary.get("world_size") or 1) > 1 else None),
    ("Training precision", lambda r: r.summary.get("precision")),
    ("Train loss, first → last logged (nats per token)", lambda r: _train_loss(r)),
    ("Validation loss at the end of training (nats per token)", lambda r: _val_loss(r)),
    ("Validation bits per byte at the end of training", lambda r: f"{r.summary['val_bpb']:.3f}" if is_number(r.summary.get("val_bpb")) else None),
    ("Held-out loss, evaluation (nats per token)", lambda r: _heldout_loss(r.heldout)),
    ("Held-out bits per byte, evaluation", lambda r: _heldout_bpb(r.heldout)),
    ("Held-out loss, untrained twin (nats per token)", lambda r: _heldout_loss(_twin_heldout(r))),
    ("Held-out bits per byte, untrained twin", lambda r: _heldout_bpb(_twin_heldout(r))),
    ("Non-finite steps skipped", lambda r: r.summary.get("nonfinite_steps") or None),
    ("Rollbacks", lambda r: r.summary.get("rollbacks") or None),
    ("Task mean (arithmetic, %)", lambda r: _pct(_eval_means(r)[0]) or None),
    ("Task mean (harmonic, %)", lambda r: (_pct(_eval_means(r)[1]) or f"{UNDEFINED} (a score ≤ 0)") if _eval_means(r)[2] else None),
    ("Checkpoint", lambda r: r.summary.get("final_checkpoint")),
]


def run_facts(run: RunData) -> dict[str, Any]:
    """What one run is and reached, under human labels with units (rows of the runs table)."""
    facts = {}
    for label, read in FACTS:
        try:
            value = read(run)
        except (KeyError, TypeError, ValueError):  # a field of an unexpected type: leave the row out
            value = None
        if value is not None and value != "":
            facts[label] = value
    return facts


def facts_table(runs: list[RunData]) -> str:
    facts = [run_facts(run) for run in runs]
    if any("Status" in f for f in facts):  # beside an unfinished run, a finished one says so
        for run, f in zip(runs, facts):
            if run.summary:
                f["Status"] = "finished"
    keys = [label for label, _ in FACTS if any(label in f for f in facts)]
    table = _table([""] + [run.name for run in runs], [[k] + [f.get(k, "") for f in facts] for k in keys])
    notes = []
    if any("Held-out loss, evaluation (nats per token)" in f for f in facts):
        notes.append('<p class="note">Held-out numbers (data/heldout.py, <code>heldout-v1</code>) depend only on the prepared '
                     "data: the validation file's sequences (all of them up to 2<sup>18</sup> tokens, else that many chosen "
                     "by a fixed seed), MLM masks at 15 % from a fixed seed, nats averaged over the scored tokens, in fp32; "
                     "the same for every recipe, microbatch, precision and number of processes. The validation loss at the "
                     "end of training is the run's own quick check (the first <code>train.validate_sequences</code> of "
                     "those sequences, in the run's precision), not a held-out number to set beside another run's. "
                     "Bits per byte divide the nats by ln 2 and by the UTF-8 bytes of text the scored tokens stand for.</p>")
    if len(loss_kinds := {(r.objective, r.tokenizer) for r in runs}) > 1:
        notes.append('<p class="note">These runs differ in objective or tokenizer, so their losses in nats per token '
                     "do not compare; bits per byte do (and an MLM's and a causal LM's bits per byte measure different "
                     f"tasks). Loss plots get one panel per objective and tokenizer ({len(loss_kinds)}).</p>")
    from cramlm.eval.tables import objective_label

    for (objective, _), members in loss_groups(runs).items():
        if differ := train_task_differences(members):
            each = "; ".join(f"{html.escape(run.name)} {html.escape(train_task_words(run, differ))}" for run in members)
            if train_task_differences(members, curve=True):
                which = "their train losses do not compare" + (
                    " (more masked tokens: less context for each)" if "mlm_probability" in differ else "")
            else:  # the curves measure one task (ELECTRA's generator MLM at one masking rate); the sums do not
                title = html.escape(members[0].train_curve[1] or "train")
                which = (f"the losses they minimised (the runs table's train loss) do not compare; their train curves "
                         f"({title}) do")
            notes.append(f'<p class="note">These {html.escape(objective_label(objective))} runs train on different tasks '
                         f"({each}), so {which}; their held-out losses do: heldout-v1 scores every run on the same masks.</p>")
    raw = "".join(
        f"<details><summary>summary.json{'' if len(runs) == 1 else ' of ' + html.escape(run.name)} (raw)</summary>"
        f"<pre>{html.escape(json.dumps(run.summary, indent=2))}</pre></details>"
        for run in runs if run.summary
    )
    return table + "".join(notes) + raw


# -------------------------------------------------------------------------------- eval table


def _score(run: RunData, r: dict[str, Any] | None) -> float | None:
    score = result_score(r) if r else None
    return None if score is None else as_percent(str(r.get("metric", "")), score)


def _majority(r: dict[str, Any] | None) -> float | None:
    return as_percent(str(r.get("metric", "")), r["majority"]) if r and is_number(r.get("majority")) else None


def _round(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"  # one unit in a column: percentage points, one decimal


def eval_table(runs: list[RunData]) -> str:
    """Dev scores in % per task: each run, its untrained twin when evaluated, the margin (points)
    and the majority-class floor; then the arithmetic and harmonic means over tasks."""
    tasks = list(dict.fromkeys((r.get("task"), str(r.get("metric", ""))) for run in runs for r in run.eval_results))
    one = len(runs) == 1
    header = ["task", "metric"]
    # per run: its score column, and with a twin, the twin's and the margin; the means follow the same layout
    columns: list[list[float | None]] = []
    for run in runs:
        header.append("pretrained" if one else run.name)
        columns.append([_score(run, next((r for r in run.eval_results if r.get("task") == t), None)) for t, _ in tasks])
        if run.untrained_results:
            header += ["untrained twin" if one else f"{run.name} untrained", "margin"]
            columns.append([None if (s := run.untrained_score(t)) is None else as_percent(m, s) for t, m in tasks])
            columns.append([])  # the margin: computed from the two columns before it
    header.append("majority class")
    if one:
        header += ["best epoch", "seeds", "train examples", "dev examples"]
    rows: list[list[Any]] = []
    for i, (task, metric) in enumerate(tasks):
        row: list[Any] = [task, metric]
        for j, values in enumerate(columns):
            if values:
                row.append(_round(values[i]))
            else:
                a, b = columns[j - 2][i], columns[j - 1][i]
                row.append(Margin(a - b) if a is not None and b is not None else "")
        results = [next((r for r in run.eval_results if r.get("task") == task), None) for run in runs]
        row.append(_round(next((m for r in results if (m := _majority(r)) is not None), None)))
        if one:
            r = results[0] or {}
            seeds = r.get("seeds")
            row += [_round(as_percent(metric, r["best"])) if is_number(r.get("best")) else "",
                    len(seeds) if isinstance(seeds, list) else seeds if is_number(seeds) else "",
                    r.get("train_examples", ""), r.get("dev_examples", "")]
        rows.append(row)
    for kind in ("arithmetic", "harmonic"):
        row = [f"{kind} mean", ""]
        for j, values in enumerate(columns):
            if values:
                mean = _col_mean(values, kind)
                row.append(_round(mean) if isinstance(mean, float) else mean)
            else:
                a, b = _col_mean(columns[j - 2], kind), _col_mean(columns[j - 1], kind)
                row.append(Margin(a - b) if isinstance(a, float) and isinstance(b, float) else "")
        rows.append(row + [""] * (len(header) - len(row)))
    return _table(header, rows, [""] * len(tasks) + ["mean", "mean"])


def _col_mean(values: list[float | None], kind: str) -> float | str:
    """The mean over tasks of one column (blank when a task lacks a score); the harmonic mean is
    undefined with a score at or below 0 (an accuracy of 0, a negative correlation): shown as
    such, never as 0."""
    from cramlm.eval.metrics import arithmetic_mean, harmonic_mean

    if not values or any(v is None for v in values):
        return ""
    if kind == "arithmetic":
        return arithmetic_mean(values)
    mean = harmonic_mean(values)
    return UNDEFINED if mean is None else mean


# ------------------------------------------------------------------------------ minimal pairs


def pairs_table(runs: list[RunData]) -> str:
    """Zero-shot minimal-pair accuracy in % per phenomenon: each run's headline scorer, its untrained
    twin and the margin; the macro average over paradigms, the tie rate, the paradigms off chance,
    and BLiMP's published figures where the paradigms are the shared 36 (eval/pairs.py). Below it, what
    does not compare or is missing: runs scored on other pairs than each other, a twin not set beside
    its run, and a run or twin whose scoring was refused (or, beside scored runs, a run not scored)."""
    from cramlm.eval.pairs import REFERENCE_36, off_chance_cell, reference, twin_mismatch

    scored = [r for r in runs if r.pairs]
    heads = [r.pairs["scores"][r.pairs["headline"]] for r in scored]
    mismatch = [twin_mismatch(r.pairs, r.untrained_pairs) for r in scored]
    twins = [r.untrained_pairs["scores"][r.untrained_pairs["headline"]] if r.untrained_pairs and not why else None
             for r, why in zip(scored, mismatch)]
    said = [f"{r.name}: minimal pairs not scored: {r.pairs_skipped}" if r.pairs_skipped
            else f"{r.name}: not scored on minimal pairs" for r in runs if not r.pairs and (scored or r.pairs_skipped)]
    if not scored:
        return f'<p class="note">{html.escape(". ".join(said))}.</p>'
    phenomena = list(dict.fromkeys(p for h in heads for p in h["phenomena"]))
    header = ["phenomenon"]
    for r, twin in zip(scored, twins):
        name = "pretrained" if len(runs) == 1 else r.name
        header.append(f"{name} ({r.pairs['headline']})")
        if twin:
            header += ["untrained twin" if len(runs) == 1 else f"{r.name} untrained", "margin"]

    def cells(get) -> list[Any]:
        row = []
        for head, twin in zip(heads, twins):
            a = get(head)
            row.append(_round(None if a is None else 100 * a))
            if twin:
                b = get(twin)
                row += [_round(None if b is None else 100 * b), Margin(100 * (a - b)) if a is not None and b is not None else ""]
        return row

    rows = [[p, *cells(lambda h, p=p: h["phenomena"].get(p))] for p in phenomena]
    rows.append(["macro average (paradigms)", *cells(lambda h: h["accuracy"])])
    rows.append(["tie rate", *cells(lambda h: h["tie_rate"])])
    off = ["paradigms off chance (above / below)"]
    for head, twin in zip(heads, twins):
        off += [off_chance_cell(head)] + ([off_chance_cell(twin), ""] if twin else [])
    rows.append(off)
    classes = [""] * len(phenomena) + ["mean", "", ""]
    table = _table(header, rows, classes)
    note = ("Ties count half (lm-evaluation-harness and the BabyLM pipelines count them right, so a model that scores "
            "every sentence alike would get 100). Chance is 50; a paradigm is off chance when its accuracy is more than "
            "two binomial standard errors from 50, so a macro average near 50 may hide paradigms passed and failed "
            "systematically.")
    tests = [{k: p["pairs"] for k, p in h["paradigms"].items()} for h in heads]
    if any(t != tests[0] for t in tests):
        note += (" The runs were scored on different pairs (" + ", ".join(
            f"{r.name} {sum(t.values()):,} in {len(t)} paradigms" for r, t in zip(scored, tests))
            + "): their columns do not compare; evaluate them with the same eval.minimal_pairs.")
    on_36 = [r.name for r, h in zip(scored, heads) if reference(h["paradigms"])]
    if on_36:
        note += (" BLiMP's published figures on " + ("these 36 paradigms" if len(on_36) == len(scored) else
                                                     f"the shared 36 paradigms (scored on them: {', '.join(on_36)})")
                 + ": " + ", ".join(f"{k} {v}" for k, v in REFERENCE_36.items()) + ".")
    said += [f"{r.name}: {why}" for r, why in zip(scored, mismatch) if why]
    said += [f"{r.name}: the untrained twin's minimal pairs were not scored: {r.untrained_pairs_skipped}"
             for r in scored if r.untrained_pairs_skipped]
    note += "".join(f" {s}." for s in said)
    return table + f'<p class="note">{html.escape(note)}</p>'


def checkpoints_table(run: RunData) -> str:
    """The run's checkpoints evaluated (eval-step-N.json), in step order, and its end (eval.json): held-out
    loss, the zero-shot headline (macro average over paradigms) and the task mean, against tokens and
    compute: what the run had learned along the way. "" when no checkpoint was evaluated."""
    end = run.summary.get("steps")
    rows = [[f"{p.step:,}" if p.step is not None else "end" if p.source == "eval.json" else "",
             p.source if p.source != "eval.json" else "end of training (eval.json)" if p.step in (None, end) else
             "eval.json (before the run went on)",
             si(p.tokens, "") if p.tokens is not None else "", si(p.flops, "FLOPs") if p.flops is not None else "",
             f"{p.heldout:.3f}" if p.heldout is not None else "",
             _round(p.zero_shot) + (f" ({p.headline})" if p.headline else ""), _pct(p.task_mean) or ""]
            for p in run.along()]
    return _table(["step", "results", "tokens", "compute", "held-out loss", "zero-shot, macro %", "task mean, %"], rows) if rows else ""


# ------------------------------------------------------------------------------ stages table


def stages_table(run: RunData, now: datetime | None = None) -> str:
    """The pipeline's stages. The report stage is running while this page is written; a page that
    exists finished it, so it is shown done, its time counted up to now."""
    from cramlm.report.segments import when

    now = now or datetime.now(timezone.utc)
    stages = run.pipeline.get("stages") or {}
    rows = []
    for name, s in stages.items():
        status, seconds, finished = s.get("status", ""), s.get("seconds", ""), s.get("finished", "")
        if name == "report" and status == "running":
            status, finished = "done", now.isoformat(timespec="seconds")
            try:
                seconds = round((now - datetime.fromisoformat(s["started"])).total_seconds(), 2)
            except (KeyError, TypeError, ValueError):
                seconds = ""
        rows.append([name, status, f"{seconds:,.1f}" if is_number(seconds) else seconds,
                     when(finished) if isinstance(finished, str) and finished else ""])
    return _table(["stage", "status", "seconds", "finished (UTC)"], rows) if rows else ""


def segments_table(run: RunData) -> str:
    """Each start or resume of the training and how it ended (report/segments.py); "" for a run
    trained in one go by code that wrote no segment line."""
    from cramlm.report.segments import HEADER, segment_rows, segments

    steps = run.summary.get("steps")
    segs = segments(run.log, steps if isinstance(steps, int) else None)
    if not segs or (len(segs) == 1 and not segs[0].info):
        return ""
    rows = [row[1:] for row in segment_rows(run.name, segs)]
    keep = [i for i in range(len(HEADER) - 1) if any(row[i] != "-" for row in rows)]  # a log from before segment lines: no machine or time
    return '<div class="text">' + _table([HEADER[1:][i] for i in keep], [[row[i] for i in keep] for row in rows]) + "</div>"


# ------------------------------------------------------------------------------------ page


def _img(name: str, title: str, path: Path, note: str = "") -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    small = f" <small>{html.escape(note)}</small>" if note else ""
    return (f'<figure id="fig-{name}"><figcaption>{html.escape(title)}{small}</figcaption>'
            f'<img data-plot="{name}" alt="{html.escape(title)}" src="data:image/png;base64,{data}"></figure>')


def render_html(runs: list[RunData], figures: dict[str, tuple[str, Path]]) -> str:
    from cramlm.report.plots import COMPARE_NOTES, NOTES

    now = datetime.now(timezone.utc)
    title = f"cramlm report: {runs[0].name}" if len(runs) == 1 else "cramlm comparison: " + ", ".join(r.name for r in runs)
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>",
             f"<p>Generated {now:%Y-%m-%d %H:%M} UTC from "
             + ", ".join(f"<code>{html.escape(str(r.folder))}</code>" for r in runs) + ".</p>",
             "<h2>Runs</h2>", facts_table(runs)]
    if any(r.eval_results for r in runs):
        parts += ["<h2>Evaluation (dev scores, %)</h2>", eval_table(runs)]
        if any(r.untrained_results for r in runs):
            parts.append('<p class="note">The untrained twin has the same architecture and tokenizer and is fine-tuned '
                         "the same way, from random weights: the margin (points) is what pretraining bought. "
                         "The majority class always predicts the most frequent training label.</p>")
            from cramlm.eval.tables import verdict

            for run in runs:
                if run.untrained_results and (said := verdict(run.eval, run.eval_untrained, bool(run.config.get("dryrun")))):
                    who = "" if len(runs) == 1 else f"<b>{html.escape(run.name)}</b>: "
                    parts.append(f'<p class="verdict">{who}{html.escape(said[0].upper() + said[1:])}</p>')
    if any(r.pairs or r.pairs_skipped for r in runs):
        parts += ["<h2>Zero-shot minimal pairs (accuracy, %)</h2>", pairs_table(runs)]
        from cramlm.eval.tables import verdict

        for run in runs:  # a run evaluated zero-shot alone: its verdict here (with fine-tuning, above)
            if not run.untrained_results and run.untrained_pairs and (said := verdict(run.eval, run.eval_untrained, bool(run.config.get("dryrun")))):
                who = "" if len(runs) == 1 else f"<b>{html.escape(run.name)}</b>: "
                parts.append(f'<p class="verdict">{who}{html.escape(said[0].upper() + said[1:])}</p>')
    parts.append("<h2>Plots</h2>")
    notes = {name: " ".join(n for n in (NOTES.get(name), COMPARE_NOTES.get(name) if len(runs) > 1 else None) if n)
             for name in figures}
    parts += [_img(name, title, path, notes[name]) for name, (title, path) in figures.items() if name != "along"]
    if len(runs) == 1:
        if checkpoints := checkpoints_table(runs[0]):
            parts += ["<h2>Checkpoints evaluated</h2>",
                      *([_img("along", *figures["along"], notes["along"])] if "along" in figures else []), checkpoints,
                      '<p class="note">Each of the run\'s checkpoints evaluated (<code>cramlm eval checkpoint=&lt;run&gt;/checkpoints/step-N</code>) '
                      "by the settings its results file records: rows compare where those are the same.</p>"]
        if stages := stages_table(runs[0], now):
            parts += ["<h2>Pipeline stages</h2>", stages]
        if segments := segments_table(runs[0]):
            parts += ["<h2>Segments (which ran where)</h2>", segments]
        if runs[0].config:
            config = yaml.safe_dump(runs[0].config, sort_keys=False)
            parts.append(f"<details><summary>Resolved config</summary><pre>{html.escape(config)}</pre></details>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def write_report(*run_dirs: str | Path, out: str | Path | None = None) -> Path:
    """Write the report of one run (into its folder) or the comparison of several (into ``out``)."""
    from cramlm.report.plots import draw_all

    if not run_dirs:
        raise ValueError("no run folders given")
    runs = [load_run_data(d) for d in run_dirs]
    for name in {r.name for r in runs}:  # two runs of one name (the same point of two sweeps): each named by its folder
        same = [r for r in runs if r.name == name]
        if len(same) > 1:
            common = Path(os.path.commonpath([r.folder.resolve() for r in same]))
            for r in same:
                r.name = f"{name} ({r.folder.resolve().relative_to(common) if r.folder.resolve() != common else r.folder})"
    if out is None:
        if len(runs) > 1:
            raise ValueError("comparing runs needs an output folder (out=...)")
        out = runs[0].folder
    out = Path(out)
    path = out / "report.html"
    with on_full_disk(out, f"{out}: disk full while writing the report ({{free}}); no file of it was left half-written: "
                      "free some space, or write it elsewhere (cramlm report RUN --out FOLDER)"):
        figures = draw_all(runs, out / "plots")
        write_text(path, render_html(runs, figures))
    return path
