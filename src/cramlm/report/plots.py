"""The report's figures (matplotlib, Agg backend: no display needed). Every figure overlays all
runs given, so the same code draws one run's report and a side-by-side comparison."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

from cramlm.io import atomic_write  # noqa: E402
from cramlm.report.rundata import (  # noqa: E402
    RunData, as_percent, is_number, loss_groups, percent_scores, result_score, train_task_differences, train_task_words)

DPI = 110


def save(fig, path: Path) -> Path:
    """``fig`` as ``path`` (written beside it and renamed: never a half-written PNG under its name)."""
    try:
        fig.tight_layout()
        with atomic_write(path) as tmp:
            fig.savefig(tmp, dpi=DPI, format=path.suffix.lstrip(".") or "png")
    finally:
        plt.close(fig)
    return path


def colors(n: int) -> list:
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return [cycle[i % len(cycle)] for i in range(n)]


def _marker(xs: list) -> str | None:
    return "o" if len(xs) <= 20 else None  # a short run's few points stay visible


def _label(run: RunData, many: bool, what: str) -> str:
    return f"{run.name} {what}" if many else what


def loss_title(objective: str) -> str:
    """The held-out loss of an objective in words: 'MLM', 'causal LM', 'RTD generator MLM' (ELECTRA
    runs, a group of their own), ... (its config's ``loss_title``)."""
    from cramlm.eval.tables import objective_label

    return objective_label(objective)


def loss_figure(runs: list[RunData], x: str, xlabel: str, scale: float, path: Path) -> Path:
    """Train loss (solid) and validation loss (dashed, when logged) against ``x``; one panel per
    objective and tokenizer, so that an MLM and a causal loss never share an axis (bits per byte,
    :func:`bpb_figure`, is the measure they share). Runs of a panel whose train losses measure different
    tasks (another masking rate: ``train_task_differences`` of the drawn curves) say their settings beside "train"."""
    groups = loss_groups(runs)
    fig, axes = plt.subplots(1, len(groups), figsize=(7 if len(groups) == 1 else 5 * len(groups), 4), squeeze=False)
    many = len(runs) > 1
    color_of = dict(zip((r.name for r in runs), colors(len(runs))))
    for ax, ((objective, tokenizer), members) in zip(axes[0], groups.items()):
        differ = train_task_differences(members, curve=True)
        for run in members:
            color = color_of[run.name]
            curve, title = run.train_curve
            xs, ys = run.series(x, curve)
            words = ", ".join(w for w in (title, train_task_words(run, differ) if differ else "") if w)
            train = f"train ({words})" if words else "train"
            ax.plot([v * scale for v in xs], ys, color=color, marker=_marker(xs), ms=3, label=_label(run, many, train))
            if run.has("val_loss"):
                xs, ys = run.series(x, "val_loss")
                # open diamonds: a run often validates only at its end, and one point must stay visible
                ax.plot([v * scale for v in xs], ys, "D--", color=color, ms=6, markerfacecolor="white",
                        label=_label(run, many, "validation"))
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"{loss_title(objective)} loss (nats per token)")
        if len(groups) > 1:
            ax.set_title(f"{loss_title(objective)}" + (f", {tokenizer}" if tokenizer else ""), fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save(fig, path)


def bpb_figure(runs: list[RunData], path: Path) -> Path:
    """Validation bits per byte against tokens (dashed), and `cramlm eval`'s held-out bits per
    byte at the run's last token (a star): one axis for every run, whatever its tokenizer or
    objective, each labelled with its objective."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for run, color in zip(runs, colors(len(runs))):
        name = f"{run.name} ({loss_title(run.objective)})"
        xs, ys = run.series("tokens", "val_bpb")
        if xs:
            ax.plot([v * 1e-6 for v in xs], ys, "D--", color=color, ms=5, markerfacecolor="white", label=f"{name} validation")
        bpb, tokens = run.heldout.get("bpb"), run.summary.get("tokens")
        if is_number(bpb) and is_number(tokens):
            ax.plot([tokens * 1e-6], [bpb], "*", color=color, ms=12, label=f"{name} held-out (eval)")
    ax.set_xlabel("tokens (millions)")
    ax.set_ylabel("bits per byte of validation text")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save(fig, path)


Y_SCALE = {"mfu": 100}  # logged as a fraction, drawn in percent (as the runs table states it)


def has_bpb(run: RunData) -> bool:
    return run.has("val_bpb") or (is_number(run.heldout.get("bpb")) and is_number(run.summary.get("tokens")))


def _panels(runs: list[RunData], panels: list[tuple[str, str, str, str, float]], path: Path) -> Path:
    """One subplot per (x key, y key, xlabel, ylabel, x scale), every run overlaid (y scaled by Y_SCALE)."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6), squeeze=False)
    many = len(runs) > 1
    for ax, (x, y, xlabel, ylabel, scale) in zip(axes[0], panels):
        for run, color in zip(runs, colors(len(runs))):
            xs, ys = run.series(x, y)
            ys = [v * Y_SCALE.get(y, 1) for v in ys]
            ax.plot([v * scale for v in xs], ys, color=color, marker=_marker(xs), ms=3, label=run.name if many else None)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if x == "t":
            ax.set_xlim(0, 1)
        if many:
            ax.legend(fontsize=8)
    return save(fig, path)


def overlap_sizes(n: int) -> list[tuple[float, float]]:
    """(line width, marker size) per run, widest first: runs with the same schedule (the usual case
    when comparing) draw on the same points, and each later, narrower line leaves the one under it
    showing as a rim instead of hiding it (the widest stays under 8 points however many runs)."""
    step = min(1.0, 3.0 / max(1, n - 1))
    return [(1.5 + 2.0 * step * (n - 1 - i), 4.0 + 3.0 * step * (n - 1 - i)) for i in range(n)]


def schedule_figure(runs: list[RunData], path: Path) -> Path:
    """Learning rate and batch size against t: lines from the schedule and batch-plan functions
    the trainer uses (curves.py), markers at the values logged while training."""
    from cramlm.report.curves import batch_curve, lr_curve

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    many = len(runs) > 1
    for ax, key, ylabel, curve in ((axes[0], "lr", "learning rate", lr_curve),
                                   (axes[1], "batch_size", "batch size (sequences)",
                                    lambda c, r: batch_curve(c, r.summary.get("world_size") or 1))):
        for (run, color), (lw, ms) in zip(zip(runs, colors(len(runs))), overlap_sizes(len(runs))):
            planned = curve(run.config) if key == "lr" else curve(run.config, run)
            if planned is not None:
                ax.plot(*planned, color=color, lw=lw, label=_label(run, many, "planned"))
            xs, ys = run.series("t", key)
            if xs:
                ax.plot(xs, ys, "o", color=color, ms=ms, markerfacecolor="white" if planned is not None else color,
                        label=_label(run, many, "logged"))
        ax.set_xlabel("budget used (t)")
        ax.set_ylabel(ylabel)
        # the last step may overshoot the budget (t > 1): keep its marker in view
        ax.set_xlim(0, max([1.0] + [t for run in runs for t in run.series("t", key)[0]]) + 0.02)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save(fig, path)


def throughput_figure(runs: list[RunData], path: Path) -> Path:
    panels = [("elapsed", "tokens_per_second", "training time (min)", "tokens / s", 1 / 60)]
    if any(run.has("mfu") for run in runs):
        panels.append(("elapsed", "mfu", "training time (min)", "MFU (%)", 1 / 60))
    return _panels(runs, panels, path)


def eval_figure(runs: list[RunData], path: Path) -> Path:
    """Grouped bars: one group per task, one bar per run (its score written inside); over each bar
    a dotted line at the run's untrained twin, over each group a dashed line at the majority class."""
    from matplotlib.lines import Line2D

    tasks = list(dict.fromkeys(r.get("task", "?") for run in runs for r in run.eval_results))
    fig, ax = plt.subplots(figsize=(min(12.0, 3.5 + 1.3 * len(tasks) * max(1, len(runs)) ** 0.5), 3.8))
    width = 0.7 / len(runs)
    handles: list = []
    majority_drawn, twin_drawn = set(), False
    for i, (run, color) in enumerate(zip(runs, colors(len(runs)))):
        by_task = {r.get("task", "?"): r for r in run.eval_results}
        xs, heights = [], []
        for j, task in enumerate(tasks):
            r = by_task.get(task)
            score = result_score(r) if r else None
            if score is None:
                continue
            metric = str(r.get("metric", ""))
            x = j + (i - (len(runs) - 1) / 2) * width
            xs.append(x)
            heights.append(as_percent(metric, score))
            twin = run.untrained_score(task)
            if twin is not None:
                y = as_percent(metric, twin)
                ax.hlines(y, x - width / 2, x + width / 2, colors="black", linestyles=":", lw=2, zorder=3)
                if len(runs) == 1:  # one run: the twin's value beside its line (several: the table has them)
                    ax.annotate(f"{y:.1f}", (x + width / 2, y), xytext=(3, 0), textcoords="offset points",
                                va="center", fontsize=7)
                twin_drawn = True
            if task not in majority_drawn and isinstance(r.get("majority"), (int, float)):
                ax.hlines(as_percent(metric, r["majority"]), j - 0.45, j + 0.45, colors="grey", linestyles="--", lw=1.2, zorder=3)
                majority_drawn.add(task)
        bars = ax.bar(xs, heights, width, color=color, label=run.name if len(runs) > 1 else "pretrained")
        ax.bar_label(bars, fmt="%.1f", label_type="center", fontsize=8, color="white")
        handles.append(bars)
    if twin_drawn:
        handles.append(Line2D([], [], color="black", ls=":", lw=2, label="untrained twin"))
    if majority_drawn:
        handles.append(Line2D([], [], color="grey", ls="--", lw=1.2, label="majority class"))
    ax.set_xticks(range(len(tasks)), tasks, rotation=15 if len(tasks) > 2 else 0, fontsize=8)
    ax.set_xlim(-0.6, len(tasks) - 0.4)
    ax.set_ylabel("dev score (%)")
    low, high = ax.get_ylim()
    ax.set_ylim(min(0.0, low), max(high, 100.0))  # negative correlations stay visible
    ax.grid(axis="y", alpha=0.3)
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return save(fig, path)


def _along_x(points: list) -> tuple[str, str]:
    """The x of a run's evaluations along it: FLOPs where every one has them, else tokens."""
    return ("flops", "training compute (FLOPs)") if all(p.flops for p in points) else ("tokens", "tokens trained on")


def _same_tasks(rows: list[dict], reference: list[dict]) -> bool:
    """The same tasks, each fine-tuned by the same protocol (eval/tables.py's ``same_protocol``)."""
    from cramlm.eval.tables import same_protocol

    by_task = {r.get("task"): r for r in reference}
    return {r.get("task") for r in rows} == set(by_task) and all(same_protocol(r, by_task[r.get("task")]) for r in rows)


def along_lines(run: RunData) -> tuple[str, dict[str, list[tuple[float, float]]], dict[str, float]]:
    """What ``along_figure`` draws: (x label, series, the twin's values). Series ``heldout``, ``zero_shot``
    and ``task_mean`` of (compute, value), ascending; a series joins only the evaluations comparable with
    its last (zero-shot: the same scorer and pairs; tasks: the same tasks and protocol), and the twin's
    value is there only where it is comparable with that last one too."""
    from cramlm.eval.pairs import twin_mismatch

    points = run.along()
    key, xlabel = _along_x(points)
    points = sorted((p for p in points if getattr(p, key)), key=lambda p: getattr(p, key))
    lines = {"heldout": [(getattr(p, key), p.heldout) for p in points if p.heldout is not None]}
    twins: dict[str, float] = {}
    if zero := [p for p in points if p.zero_shot is not None]:
        last = zero[-1].pairs
        lines["zero_shot"] = [(getattr(p, key), p.zero_shot) for p in zero if not twin_mismatch(p.pairs, last)]
        twin = run.untrained_pairs
        accuracy = twin["scores"][twin["headline"]].get("accuracy") if twin and not twin_mismatch(last, twin) else None
        if is_number(accuracy):
            twins["zero_shot"] = 100 * accuracy
    if tasks := [p for p in points if p.task_mean is not None]:
        last = tasks[-1].results
        lines["task_mean"] = [(getattr(p, key), p.task_mean) for p in tasks if _same_tasks(p.results, last)]
        scores = percent_scores(run.untrained_results)
        if scores and _same_tasks(run.untrained_results, last):
            twins["task_mean"] = sum(scores) / len(scores)
    return xlabel, {name: line for name, line in lines.items() if line}, twins


def along_figure(runs: list[RunData], path: Path) -> Path:
    """One run's checkpoints evaluated (and its end) against the compute of their training (FLOPs, else
    tokens, log scale; ``along_lines``): held-out loss on the left axis, the zero-shot macro accuracy and
    the task mean (%) on the right, each with its untrained twin dotted, and the minimal pairs' chance
    (50 %) dashed."""
    from matplotlib.lines import Line2D

    run = runs[0]
    xlabel, lines, twins = along_lines(run)
    headline = next((p.headline for p in reversed(run.along()) if p.headline), None)
    fig, loss_ax = plt.subplots(figsize=(7.5, 4.2))
    score_ax = loss_ax.twinx()
    handles: list = []
    for (name, label, ax), color in zip((("heldout", "held-out loss", loss_ax),
                                         ("zero_shot", f"zero-shot macro % ({headline})", score_ax),
                                         ("task_mean", "task mean %", score_ax)), colors(3)):
        if name in lines:
            handles.extend(ax.plot(*zip(*lines[name]), marker="o", color=color, label=label))
        if name in twins:
            ax.axhline(twins[name], color=color, ls=":", lw=2)
    if "zero_shot" in lines:
        score_ax.axhline(50.0, color="grey", ls="--", lw=1)
    handles.append(Line2D([], [], color="black", ls=":", lw=2, label="untrained twin"))
    loss_ax.set_xscale("log")
    loss_ax.set_xlabel(xlabel)
    loss_ax.set_ylabel(f"held-out {loss_title(run.objective)} loss")
    score_ax.set_ylabel("%")
    loss_ax.grid(alpha=0.3)
    loss_ax.legend(handles=handles, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=len(handles),
                   frameon=False)
    return save(fig, path)


def _along_drawn(runs: list[RunData]) -> bool:
    """One run evaluated at two amounts of compute or more along it (each with a result)."""
    if len(runs) != 1:
        return False
    points = runs[0].along()
    key = _along_x(points)[0]
    return len({getattr(p, key) for p in points if getattr(p, key)
                and any(v is not None for v in (p.heldout, p.zero_shot, p.task_mean))}) >= 2


# name -> (title, draws it?, draw); the report shows the figures whose data exists
FIGURES: dict[str, tuple[str, Callable[[list[RunData]], bool], Callable[[list[RunData], Path], Path]]] = {
    "loss_vs_tokens": ("Loss against tokens", lambda runs: any(r.has("loss") for r in runs),
                       lambda runs, p: loss_figure(runs, "tokens", "tokens (millions)", 1e-6, p)),
    "loss_vs_time": ("Loss against training time", lambda runs: any(r.has("loss") for r in runs),
                     lambda runs, p: loss_figure(runs, "elapsed", "training time (min)", 1 / 60, p)),
    "bpb": ("Bits per byte against tokens (comparable across tokenizers)", lambda runs: any(has_bpb(r) for r in runs),
            bpb_figure),
    "schedule": ("Learning rate and batch size over the budget", lambda runs: any(r.has("lr") for r in runs),
                 schedule_figure),
    "throughput": ("Throughput (and MFU when logged) over time",
                   lambda runs: any(r.has("tokens_per_second") for r in runs), throughput_figure),
    "eval": ("Evaluation", lambda runs: any(r.eval_results for r in runs), eval_figure),
    "along": ("Its checkpoints evaluated, against compute", _along_drawn, along_figure),
}


# a line under a figure's title: what its lines and markers are
NOTES = {
    "schedule": "Lines: the planned schedule and batch ramp, computed from the run's config; markers: the values logged "
                "while training (a step's lr was set before the step; its line records the progress after it).",
    "eval": "Bars: the pretrained model; dotted: its untrained twin; dashed: the majority class.",
    "along": "Markers: each checkpoint evaluated and the end of training (the table below); a line joins those "
             "comparable with its last point (zero-shot: the same scorer and pairs; tasks: the same tasks and protocol); "
             "dotted: the untrained twin's, where comparable; dashed: chance on the minimal pairs.",
    "bpb": "Nats over the scored tokens / ln 2 / the UTF-8 bytes of text they stand for (data/heldout.py). An MLM's and "
           "a causal LM's bits per byte share the unit but not the task (the MLM sees both sides of a masked token).",
}


# added to a comparison's note
COMPARE_NOTES = {
    "schedule": "Each run is drawn narrower than the one before it, so runs with the same schedule all stay visible.",
}


def draw_all(runs: list[RunData], folder: Path) -> dict[str, tuple[str, Path]]:
    """Draw every figure with data into ``folder``; name -> (title, PNG path)."""
    folder.mkdir(parents=True, exist_ok=True)
    return {name: (title, draw(runs, folder / f"{name}.png"))
            for name, (title, wanted, draw) in FIGURES.items() if wanted(runs)}
