"""Run reports: ``report.html`` (self-contained: plots embedded as base64 PNG) plus the PNG files.

``write_report(run)`` writes ``<run>/report.html`` and ``<run>/plots/*.png``;
``write_report(run_a, run_b, ..., out=folder)`` compares runs side by side (overlaid curves and
tables with one column per run).
"""

from __future__ import annotations

import base64
import html
import statistics
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from cramlm.io import write_text
from cramlm.report.runs import RunData, is_number, as_percent, load_run_data, result_score

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
th { background: #f3f3f3; }
figure { margin: 1em 0 2em; } figcaption { font-weight: 600; margin-bottom: 0.3em; }
img { max-width: 100%; border: 1px solid #eee; }
pre { background: #f7f7f7; padding: 1em; overflow-x: auto; font-size: 0.8em; }
"""

# summary.json keys shown first, in this order; any other scalar key follows
SUMMARY_KEYS = ("parameters", "budget_seconds", "train_seconds", "setup_seconds", "steps", "tokens",
                "tokens_per_second", "first_loss", "last_loss")


def _fmt(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return html.escape(str(value))
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1e5 else f"{value:,.0f}"
    return html.escape(str(value))


def _table(header: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_fmt(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def run_facts(run: RunData) -> dict[str, Any]:
    """What one run is and reached: config choices, summary.json, last validation loss, eval mean."""
    cfg = run.config
    facts: dict[str, Any] = {
        "model": (cfg.get("arch") or {}).get("type"),
        "data": (cfg.get("data") or {}).get("name"),
        "budget (hours)": cfg.get("budget"),
    }
    keys = [k for k in SUMMARY_KEYS if k in run.summary]
    keys += [k for k in run.summary if k not in keys and (is_number(run.summary[k]) or isinstance(run.summary[k], str))]
    facts.update({k: run.summary[k] for k in keys if k not in ("name", "data")})
    if run.has("val_loss"):
        facts["last val_loss"] = [m["val_loss"] for m in run.metrics if is_number(m.get("val_loss"))][-1]
    scores = [as_percent(str(r.get("metric", "")), s) for r in run.eval_results if (s := result_score(r)) is not None]
    if scores:
        facts["eval mean"] = round(statistics.fmean(scores), 2)
    return {k: v for k, v in facts.items() if v is not None}


def facts_table(runs: list[RunData]) -> str:
    facts = [run_facts(run) for run in runs]
    keys = list(dict.fromkeys(k for f in facts for k in f))
    return _table([""] + [run.name for run in runs], [[k] + [f.get(k, "") for f in facts] for k in keys])


def eval_table(runs: list[RunData]) -> str:
    if len(runs) == 1:  # one run: every scalar field of each task result
        results = runs[0].eval_results
        cols = ["task", "metric", "score", "best"]
        cols += [k for k in dict.fromkeys(k for r in results for k in r) if k not in cols and is_number(results[0].get(k))]
        rows = []
        for r in results:
            metric = str(r.get("metric", ""))
            score = result_score(r)
            row = [r.get("task"), metric, None if score is None else round(as_percent(metric, score), 2)]
            row.append(round(as_percent(metric, r["best"]), 2) if is_number(r.get("best")) else "")
            row += [r.get(k, "") for k in cols[4:]]
            rows.append(row)
        return _table(cols, rows)
    tasks = list(dict.fromkeys((r.get("task"), str(r.get("metric", ""))) for run in runs for r in run.eval_results))
    rows = []
    for task, metric in tasks:
        row: list[Any] = [task, metric]
        for run in runs:
            r = next((r for r in run.eval_results if r.get("task") == task), None)
            score = result_score(r) if r else None
            row.append("" if score is None else round(as_percent(metric, score), 2))
        rows.append(row)
    return _table(["task", "metric"] + [run.name for run in runs], rows)


def stages_table(run: RunData) -> str:
    stages = run.pipeline.get("stages") or {}
    rows = [[name, s.get("status", ""), s.get("seconds", ""), s.get("finished", "")] for name, s in stages.items()]
    return _table(["stage", "status", "seconds", "finished (UTC)"], rows) if rows else ""


def _img(name: str, title: str, path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return (f'<figure id="fig-{name}"><figcaption>{html.escape(title)}</figcaption>'
            f'<img data-plot="{name}" alt="{html.escape(title)}" src="data:image/png;base64,{data}"></figure>')


def render_html(runs: list[RunData], figures: dict[str, tuple[str, Path]]) -> str:
    title = f"cramlm report: {runs[0].name}" if len(runs) == 1 else "cramlm comparison: " + ", ".join(r.name for r in runs)
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>",
             f"<p>Generated {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC from "
             + ", ".join(f"<code>{html.escape(str(r.folder))}</code>" for r in runs) + ".</p>",
             "<h2>Runs</h2>", facts_table(runs)]
    if any(r.eval_results for r in runs):
        parts += ["<h2>Evaluation (dev scores, %)</h2>", eval_table(runs)]
    parts.append("<h2>Plots</h2>")
    parts += [_img(name, title, path) for name, (title, path) in figures.items()]
    if len(runs) == 1:
        if stages := stages_table(runs[0]):
            parts += ["<h2>Pipeline stages</h2>", stages]
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
    if out is None:
        if len(runs) > 1:
            raise ValueError("comparing runs needs an output folder (out=...)")
        out = runs[0].folder
    out = Path(out)
    figures = draw_all(runs, out / "plots")
    path = out / "report.html"
    write_text(path, render_html(runs, figures))
    return path
