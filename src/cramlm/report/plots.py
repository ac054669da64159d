"""The report's figures (matplotlib, Agg backend: no display needed). Every figure overlays all
runs given, so the same code draws one run's report and a side-by-side comparison."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

from cramlm.report.runs import RunData, as_percent, result_score  # noqa: E402

DPI = 110


def save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def colors(n: int) -> list:
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return [cycle[i % len(cycle)] for i in range(n)]


def _marker(xs: list) -> str | None:
    return "o" if len(xs) <= 20 else None  # a short run's few points stay visible


def _label(run: RunData, many: bool, what: str) -> str:
    return f"{run.name} {what}" if many else what


def loss_figure(runs: list[RunData], x: str, xlabel: str, scale: float, path: Path) -> Path:
    """Train loss (solid) and validation loss (dashed, when logged) against ``x``."""
    fig, ax = plt.subplots(figsize=(7, 4))
    many = len(runs) > 1
    for run, color in zip(runs, colors(len(runs))):
        xs, ys = run.series(x, "loss")
        ax.plot([v * scale for v in xs], ys, color=color, marker=_marker(xs), ms=3, label=_label(run, many, "train"))
        if run.has("val_loss"):
            xs, ys = run.series(x, "val_loss")
            # open diamonds: a run often validates only at its end, and one point must stay visible
            ax.plot([v * scale for v in xs], ys, "D--", color=color, ms=6, markerfacecolor="white",
                    label=_label(run, many, "validation"))
    ax.set_xlabel(xlabel)
    ax.set_ylabel("MLM / LM loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save(fig, path)


def _panels(runs: list[RunData], panels: list[tuple[str, str, str, str, float]], path: Path) -> Path:
    """One subplot per (x key, y key, xlabel, ylabel, x scale), every run overlaid."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6), squeeze=False)
    many = len(runs) > 1
    for ax, (x, y, xlabel, ylabel, scale) in zip(axes[0], panels):
        for run, color in zip(runs, colors(len(runs))):
            xs, ys = run.series(x, y)
            ax.plot([v * scale for v in xs], ys, color=color, marker=_marker(xs), ms=3, label=run.name if many else None)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if x == "t":
            ax.set_xlim(0, 1)
        if many:
            ax.legend(fontsize=8)
    return save(fig, path)


def schedule_figure(runs: list[RunData], path: Path) -> Path:
    return _panels(runs, [("t", "lr", "budget used", "learning rate", 1.0),
                          ("t", "batch_size", "budget used", "batch size (sequences)", 1.0)], path)


def throughput_figure(runs: list[RunData], path: Path) -> Path:
    panels = [("elapsed", "tokens_per_second", "training time (min)", "tokens / s", 1 / 60)]
    if any(run.has("mfu") for run in runs):
        panels.append(("elapsed", "mfu", "training time (min)", "MFU", 1 / 60))
    return _panels(runs, panels, path)


def eval_figure(runs: list[RunData], path: Path) -> Path:
    """Grouped bars: one group per task, one bar per run."""
    tasks = list(dict.fromkeys(r.get("task", "?") for run in runs for r in run.eval_results))
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(tasks) * max(1, len(runs)) ** 0.5), 3.8))
    width = 0.8 / len(runs)
    for i, (run, color) in enumerate(zip(runs, colors(len(runs)))):
        by_task = {r.get("task", "?"): r for r in run.eval_results}
        xs, heights = [], []
        for j, task in enumerate(tasks):
            r = by_task.get(task)
            score = result_score(r) if r else None
            if score is not None:
                xs.append(j + (i - (len(runs) - 1) / 2) * width)
                heights.append(as_percent(str(r.get("metric", "")), score))
        bars = ax.bar(xs, heights, width, color=color, label=run.name)
        ax.bar_label(bars, fmt="%.1f", fontsize=7)
    ax.set_xticks(range(len(tasks)), tasks, rotation=15, fontsize=8)
    ax.set_ylabel("dev score")
    ax.grid(axis="y", alpha=0.3)
    if len(runs) > 1:
        ax.legend(fontsize=8)
    return save(fig, path)


# name -> (title, draws it?, draw); the report shows the figures whose data exists
FIGURES: dict[str, tuple[str, Callable[[list[RunData]], bool], Callable[[list[RunData], Path], Path]]] = {
    "loss_vs_tokens": ("Loss against tokens", lambda runs: any(r.has("loss") for r in runs),
                       lambda runs, p: loss_figure(runs, "tokens", "tokens (millions)", 1e-6, p)),
    "loss_vs_time": ("Loss against training time", lambda runs: any(r.has("loss") for r in runs),
                     lambda runs, p: loss_figure(runs, "elapsed", "training time (min)", 1 / 60, p)),
    "schedule": ("Learning rate and batch size over the budget", lambda runs: any(r.has("lr") for r in runs),
                 schedule_figure),
    "throughput": ("Throughput (and MFU when logged) over time",
                   lambda runs: any(r.has("tokens_per_second") for r in runs), throughput_figure),
    "eval": ("Evaluation", lambda runs: any(r.eval_results for r in runs), eval_figure),
}


def draw_all(runs: list[RunData], folder: Path) -> dict[str, tuple[str, Path]]:
    """Draw every figure with data into ``folder``; name -> (title, PNG path)."""
    folder.mkdir(parents=True, exist_ok=True)
    return {name: (title, draw(runs, folder / f"{name}.png"))
            for name, (title, wanted, draw) in FIGURES.items() if wanted(runs)}
