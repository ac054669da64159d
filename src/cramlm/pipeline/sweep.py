"""``cramlm sweep``: pretrain a grid of model sizes x budgets, then plot final loss against training
compute with a fitted power law L = a * C^-alpha (the scaling-law lens of the cramming paper).

Each grid point is an ordinary pipeline run (data + pretrain stages) in
``<base_dir>/<sweep>/<size>-<budget>/``, so an interrupted sweep resumes where it stopped.
Compute is the model's own ``flops_per_token`` times tokens when it has one (or ``flops`` in
summary.json), else 6 * parameters * tokens.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from cramlm.pipeline.run import resolve_recipe, run_pipeline
from cramlm.report.runs import is_number, load_run_data
from cramlm.io import write_json


def size_overrides(spec: str) -> list[str]:
    """'HxL' (hidden x layers) -> crammed-bert width/depth overrides; heads of width 32 below
    hidden 256 and 64 from there (cramming's base: 768 / 12), feed-forward 4x hidden."""
    match = re.fullmatch(r"(\d+)x(\d+)", spec.strip())
    if not match:
        raise ValueError(f"size '{spec}' must look like HIDDENxLAYERS, e.g. 128x4")
    hidden, layers = int(match.group(1)), int(match.group(2))
    heads = max(1, hidden // (32 if hidden < 256 else 64))
    return [f"arch.hidden_size={hidden}", f"arch.num_layers={layers}", f"arch.num_heads={heads}",
            f"arch.intermediate_size={4 * hidden}"]


def final_loss(run_dir: Path) -> tuple[float | None, str]:
    """The last validation loss when the run logged one, else the last train-loss window."""
    run = load_run_data(run_dir)
    val = [m["val_loss"] for m in run.metrics if is_number(m.get("val_loss"))]
    if val:
        return float(val[-1]), "val_loss"
    last = run.summary.get("last_loss")
    return (float(last), "train_loss") if is_number(last) else (None, "none")


def training_flops(run_dir: Path) -> tuple[float, str]:
    summary = json.loads((run_dir / "summary.json").read_text())
    if is_number(summary.get("flops")):
        return float(summary["flops"]), "summary"
    from cramlm.runs import load_run

    model, _, cfg = load_run(run_dir)
    tokens = summary["tokens"]
    if hasattr(model, "flops_per_token"):
        return float(model.flops_per_token(cfg.data.seq_length)) * tokens, "flops_per_token"
    return 6.0 * summary["parameters"] * tokens, "6*params*tokens"


def fit_power_law(compute: list[float], loss: list[float]) -> dict[str, float] | None:
    """Least squares in log-log space: log10 L = log10 a - alpha * log10 C."""
    if len({round(math.log10(c), 6) for c in compute}) < 2:
        return None
    x, y = np.log10(compute), np.log10(loss)
    slope, intercept = np.polyfit(x, y, 1)
    predicted = slope * x + intercept
    ss_res, ss_tot = float(np.sum((y - predicted) ** 2)), float(np.sum((y - y.mean()) ** 2))
    return {"a": float(10**intercept), "alpha": float(-slope), "r2": 1 - ss_res / ss_tot if ss_tot > 0 else 1.0}


def plot_sweep(points: list[dict[str, Any]], fit: dict[str, float] | None, path: Path) -> Path:
    from cramlm.report.plots import colors, save, plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    sizes = list(dict.fromkeys(p["size"] for p in points))
    for size, color in zip(sizes, colors(len(sizes))):
        pts = sorted((p for p in points if p["size"] == size), key=lambda p: p["flops"])
        ax.plot([p["flops"] for p in pts], [p["loss"] for p in pts], "o-", color=color,
                label=f"{size} ({pts[0]['parameters'] / 1e6:.2f}M)")
        for p in pts:
            ax.annotate(p["budget"], (p["flops"], p["loss"]), fontsize=7, xytext=(3, 3), textcoords="offset points")
    if fit:
        xs = np.geomspace(min(p["flops"] for p in points), max(p["flops"] for p in points), 50)
        ax.plot(xs, fit["a"] * xs ** -fit["alpha"], "k--",
                label=f"fit: L = {fit['a']:.3g} C^-{fit['alpha']:.3f} (R² {fit['r2']:.2f})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("training compute C (FLOPs)")
    ax.set_ylabel(f"final {points[0]['loss_kind'].replace('_', ' ')}")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return save(fig, path)


def sweep(recipe: str, sizes: list[str], budgets: list[str], name: str, overrides: list[str],
          report: bool = True) -> dict[str, Any]:
    """Run the grid (finished points are skipped), fit, and write sweep.json, sweep.png and (with
    ``report``) report.html comparing the runs' curves."""
    from cramlm.report import write_report

    base = resolve_recipe(recipe, overrides)
    folder = Path(base.base_dir) / name
    points = []
    for size in sizes:
        for budget in budgets:
            cfg = resolve_recipe(recipe, [*overrides, *size_overrides(size), f"budget={budget}",
                                          f"base_dir={folder}", f"name={size}-{budget}", "stages=[data,pretrain]"])
            print(f"cramlm sweep: {size} for {budget}")
            run_pipeline(cfg)
            loss, kind = final_loss(cfg.run_dir)
            if loss is None:
                continue
            flops, how = training_flops(cfg.run_dir)
            summary = json.loads((cfg.run_dir / "summary.json").read_text())
            points.append({"size": size, "budget": budget, "run": str(cfg.run_dir), "parameters": summary["parameters"],
                           "tokens": summary["tokens"], "flops": flops, "flops_from": how, "loss": loss, "loss_kind": kind})
    if not points:
        raise ValueError("the sweep produced no losses")
    fit = fit_power_law([p["flops"] for p in points], [p["loss"] for p in points])
    result = {"recipe": recipe, "overrides": overrides, "points": points, "fit": fit,
              "law": "loss = a * flops^-alpha, least squares in log10-log10 space"}
    write_json(folder / "sweep.json", result)
    plot_sweep(points, fit, folder / "sweep.png")
    if report:
        write_report(*[p["run"] for p in points], out=folder)
    print(json.dumps({"fit": fit, "points": len(points), "plot": str(folder / "sweep.png")}))
    return result
