"""``cramlm sweep``: pretrain a grid of model sizes x budgets, then fit final loss against training
compute with an irreducible-loss term, L = E + A * C^-alpha (scipy; the scaling-law lens of the
cramming paper), and, when the grid has two sizes and two token counts or more, the Chinchilla law
L(N, D) = E + A/N^a + B/D^b that ``cramlm plan`` uses (pipeline/scaling.py).

Budgets are wall clock ('30s', '2m', '1h') or tokens ('250ktok', '1Mtok': the same on any machine,
so a loaded machine does not bend the curve). Each grid point is an ordinary pipeline run (data +
pretrain stages) in ``<base_dir>/<sweep>/<size>-<budget>/``, so an interrupted sweep resumes where
it stopped. With ``eval.minimal_pairs.paths=[...]`` each point also runs the eval stage scoring the
minimal pairs alone (no fine-tuning): the zero-shot accuracy against compute, beside the loss, in
the table, sweep.json, sweep.png and the report. A grid that cannot determine the fit (fewer than 4 points, or fewer distinct compute
values than the law's 3 parameters) is refused before anything runs.
Compute is the model's own ``flops_per_token`` times tokens when it has one (or ``flops`` in
summary.json), else 6 * parameters * tokens.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from cramlm.pipeline import scaling
from cramlm.pipeline.scaling import FitError, check_compute_fit, compute_law, distinct, fit_chinchilla, fit_compute_law, size_overrides
from cramlm.pipeline.recipe import resolve_recipe, run_pipeline
from cramlm.report.rundata import is_number, load_run_data
from cramlm.io import write_json


TOKEN_BUDGET = re.compile(r"\s*([0-9.]+)\s*([kMG]?)\s*tok(?:ens)?\s*")
_SCALE = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9}


def budget_overrides(spec: str) -> tuple[list[str], str, float]:
    """A grid budget -> (overrides, kind, amount): '2m' -> budget=2m ('clock', hours);
    '250ktok' -> no clock and train.budget.tokens=250000 ('tokens', tokens)."""
    match = TOKEN_BUDGET.fullmatch(spec)
    if match:
        tokens = float(match.group(1)) * _SCALE[match.group(2)]
        if tokens <= 0:
            raise ValueError(f"budget '{spec}': the token count must be positive")
        return ["budget=null", f"train.budget.tokens={int(tokens)}"], "tokens", tokens
    from cramlm.run.config import parse_hours

    hours = parse_hours(spec)
    if not isinstance(hours, float) or hours <= 0:
        raise ValueError(f"budget '{spec}' must be a duration ('90s', '2m', '1h') or a token count ('250ktok', '1Mtok')")
    return [f"budget={spec}"], "clock", hours


def size_flops(spec: str) -> float:
    """Rough training FLOPs per token of a size (6 x 12 L H^2): enough to tell grid points apart."""
    hidden, layers = (int(v) for v in spec.split("x"))
    return 6.0 * 12 * layers * hidden**2


def unique_grid(sizes: list[str], budgets: list[str], say=print) -> tuple[list[str], list[str]]:
    """Sizes and budgets with repeats removed, in their order: a size given twice (``64x2,64x2``),
    or a budget given twice in any spelling (``4ktok,4000tok``), is one grid point, trained once."""
    out = []
    for what, specs, key in (("size", sizes, lambda v: v.strip()), ("budget", budgets, lambda v: budget_overrides(v)[1:])):
        seen: dict = {}
        for spec in specs:
            k = key(spec)
            if k in seen:
                say(f"cramlm sweep: {what} '{spec}' is '{seen[k]}' again: trained once")
            else:
                seen[k] = spec
        out.append(list(seen.values()))
    return out[0], out[1]


def check_grid(sizes: list[str], budgets: list[str], trained: dict[tuple[str, str], float] | None = None) -> bool:
    """Refuse a grid the compute law cannot be fitted to, before anything runs. A clock budget gives
    every size about the same compute (this machine's FLOP/s x seconds); a token budget gives each
    size its own. One clock budget and two sizes or more is a comparison of shapes at equal compute
    (which shape does this budget buy?): allowed, ranked, not fitted. Returns whether to fit.
    ``trained``: the tokens each (size, budget) point will actually train on (train/budget.py
    ``planned_tokens``: at least one step, so ``4ktok`` and ``8ktok`` may both train 8,192), counted
    instead of the budgets' own numbers."""
    for size in sizes:
        size_overrides(size)
    parsed = [budget_overrides(b) for b in budgets]
    kinds = {kind for _, kind, _ in parsed}
    if len(kinds) > 1:
        raise ValueError("--budgets mixes wall-clock and token budgets; use one kind per sweep")
    if kinds == {"clock"} and len(budgets) == 1 and len(sizes) >= 2:
        return False
    if "clock" in kinds:
        estimates = [amount for _, _, amount in parsed]
    else:
        trained = trained or {}
        estimates = [size_flops(s) * trained.get((s, b), amount) for s in sizes for b, (_, _, amount) in zip(budgets, parsed)]
    try:
        check_compute_fit(len(sizes) * len(budgets), distinct(estimates))
    except FitError as e:
        hint = "add budgets" if "clock" in kinds else "add sizes or budgets"
        same = _same_training(sizes, budgets, trained or {})
        raise ValueError(f"grid {len(sizes)} size(s) x {len(budgets)} budget(s): {e}{same}; {hint}") from None
    return True


def _same_training(sizes: list[str], budgets: list[str], trained: dict[tuple[str, str], float]) -> str:
    """'(4ktok and 8ktok train the same 8,192 tokens)' for budgets whose points train alike."""
    groups: dict[tuple, list[str]] = {}
    for b in budgets:
        if all((s, b) in trained for s in sizes):
            groups.setdefault(tuple(trained[(s, b)] for s in sizes), []).append(b)
    same = [f"{' and '.join(g)} train the same {int(k[0]):,} tokens" for k, g in groups.items() if len(g) > 1]
    return f" ({'; '.join(same)}: the one-step minimum is a batch of batch_size x seq_length tokens)" if same else ""


LOSS_WORDS = {"val_loss": "val loss", "train_loss": "train loss", "train_sum": "train loss (several tasks')"}


def final_loss(run_dir: Path) -> tuple[float | None, str]:
    """The last validation loss when the run logged one (val_loss: token-weighted over the first
    train.validate_sequences held-out sequences, data/heldout.py; the grid's points share data and
    recipe, so the same sequences), else the last train-loss window: of the objective's train curve
    (ELECTRA: its generator's MLM, the task of its held-out loss, not the sum it minimises; "train_sum"
    where only a loss of several tasks was logged: that sum, the hybrid's shares)."""
    run = load_run_data(run_dir)
    val = [m["val_loss"] for m in run.metrics if is_number(m.get("val_loss"))]
    if val:
        return float(val[-1]), "val_loss"
    curve, _ = run.train_curve
    if curve != "loss":
        return float(run.series("step", curve)[1][-1]), "train_loss"
    last = run.summary.get("last_loss")
    if not is_number(last):
        return None, "none"
    # what the objective minimised, where that is no one task's loss (ELECTRA's sum before it logged its
    # generator's MLM, the hybrid's masked + causal shares): no point on a task's curve
    return float(last), "train_sum" if run.objective_config.train_loss != "train" else "train_loss"


def final_bpb(run_dir: Path) -> float | None:
    """The last validation bits per byte, when logged (comparable across tokenizers)."""
    val = [m["val_bpb"] for m in load_run_data(run_dir).metrics if is_number(m.get("val_bpb"))]
    return float(val[-1]) if val else None


def training_flops(run_dir: Path) -> tuple[float, str]:
    summary = json.loads((run_dir / "summary.json").read_text())
    if is_number(summary.get("flops")):
        return float(summary["flops"]), "summary"
    from cramlm.run.build import load_run

    model, _, cfg = load_run(run_dir)
    tokens = summary["tokens"]
    if hasattr(model, "flops_per_token"):
        return float(model.flops_per_token(cfg.data.seq_length)) * tokens, "flops_per_token"
    return 6.0 * summary["parameters"] * tokens, "6*params*tokens"


def non_embedding_parameters(run_dir: Path) -> int:
    """Parameters outside the token / position / type embeddings (N of the Chinchilla law),
    counted on the meta device from the run's config and tokenizer."""
    import torch
    from tokenizers import Tokenizer

    from cramlm.config.loader import load_yaml, validate
    from cramlm.models.base import build_model
    from cramlm.run.config import PretrainConfig

    cfg = validate(PretrainConfig, load_yaml(run_dir / "config.yaml", "run config"))
    vocab = Tokenizer.from_file(str(run_dir / "tokenizer.json")).get_vocab_size()
    with torch.device("meta"):
        model = build_model(cfg.arch, vocab)
    return scaling.non_embedding_parameters(model)


def _plain(value: float, _pos=None) -> str:
    """Axis labels as plain numbers (2.5, 1e+12), never '8.85x10^0'."""
    return f"{value:.3g}"


def plot_sweep(points: list[dict[str, Any]], fit: dict[str, float] | None, path: Path) -> Path:
    from matplotlib.ticker import FuncFormatter, NullFormatter

    from cramlm.report.plots import colors, save, plt

    zero_shot = [p for p in points if is_number(p.get("zero_shot"))]
    fig, axes = plt.subplots(1, 2 if zero_shot else 1, figsize=(12 if zero_shot else 7, 4.5), squeeze=False)
    ax = axes[0][0]
    sizes = list(dict.fromkeys(p["size"] for p in points))
    if zero_shot:
        plot_zero_shot(axes[0][1], zero_shot, sizes)
    for size, color in zip(sizes, colors(len(sizes))):
        pts = sorted((p for p in points if p["size"] == size), key=lambda p: p["flops"])
        ax.plot([p["flops"] for p in pts], [p["loss"] for p in pts], "o-", color=color,
                label=f"{size} ({pts[0]['parameters'] / 1e6:.2f}M)")
        for p in pts:
            ax.annotate(p["budget"], (p["flops"], p["loss"]), fontsize=7, xytext=(3, 3), textcoords="offset points")
    if fit:
        xs = np.geomspace(min(p["flops"] for p in points), max(p["flops"] for p in points), 50)
        ax.plot(xs, compute_law(fit, xs), "k--",
                label=f"fit: L = {fit['E']:.3g} + {fit['A']:.3g} C^-{fit['alpha']:.3f} (R² {fit['r2']:.2f})")
    ax.set_xscale("log")  # the loss axis stays linear: with an irreducible term the law is no line in log-log
    ax.xaxis.set_major_formatter(FuncFormatter(_plain))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(FuncFormatter(_plain))
    ax.set_xlabel("training compute C (FLOPs)")
    kinds = sorted({p["loss_kind"] for p in points})
    ax.set_ylabel("final " + " / ".join(LOSS_WORDS.get(k, k) for k in kinds) + (" (kinds differ: do not compare)" if len(kinds) > 1 else ""))
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return save(fig, path)


def plot_zero_shot(ax, points: list[dict[str, Any]], sizes: list[str]) -> None:
    """Minimal-pair accuracy (%) against training compute, one line per size, chance dotted."""
    from cramlm.report.plots import colors

    for size, color in zip(sizes, colors(len(sizes))):
        pts = sorted((p for p in points if p["size"] == size), key=lambda p: p["flops"])
        if pts:
            ax.plot([p["flops"] for p in pts], [100 * p["zero_shot"] for p in pts], "o-", color=color, label=size)
    ax.axhline(50, color="gray", ls=":", lw=1, label="chance (ties half)")
    ax.set_xscale("log")
    ax.set_xlabel("training compute C (FLOPs)")
    ax.set_ylabel(f"minimal pairs, % ({points[0]['zero_shot_scorer']})")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)


def table(points: list[dict[str, Any]], fit: dict[str, float] | None) -> str:
    """The grid as an aligned text table, with the fitted loss per point."""
    header = ["size", "budget", "params", "non-emb", "tokens", "compute", "loss", "bits/byte", "fit"]
    mixed = len({p["loss_kind"] for p in points}) > 1  # each loss then says its kind
    rows = [[p["size"], p["budget"], f"{p['parameters']:,}", f"{p['non_embedding_parameters']:,}",
             f"{p['tokens']:,}", f"{p['flops']:.3g}", f"{p['loss']:.4f}" + (f" ({p['loss_kind']})" if mixed else ""),
             f"{p['bpb']:.4f}" if is_number(p.get("bpb")) else "-",
             f"{float(compute_law(fit, p['flops'])):.4f}" if fit else "-"] for p in points]
    if scored := [p for p in points if is_number(p.get("zero_shot"))]:  # minimal pairs, % (ties half); one scorer
        header.append(f"zero-shot % ({scored[0]['zero_shot_scorer']})")
        for row, p in zip(rows, points):
            row.append(f"{100 * p['zero_shot']:.1f}" if is_number(p.get("zero_shot")) else "-")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) if i >= 2 else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in [header, *rows]]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def point_config(recipe: str, overrides: list[str], folder: Path, size: str, budget: str, zero_shot: bool = False):
    """The resolved config of one grid point, trained in ``folder``/<size>-<budget>; ``zero_shot``:
    its eval stage scores the minimal pairs alone (eval.tasks=[]: no fine-tuning)."""
    stages = ["stages=[data,pretrain,eval]", "eval.tasks=[]"] if zero_shot else ["stages=[data,pretrain]"]
    return resolve_recipe(recipe, [*overrides, *size_overrides(size), *budget_overrides(budget)[0],
                                   f"base_dir={json.dumps(str(folder))}", f"name={size}-{budget}", *stages])


def run_point(cfg, size: str, budget: str, zero_shot: bool = False) -> dict[str, Any] | None:
    """Pretrain one grid point (skipped when finished); its point, or None without a loss. ``zero_shot``:
    the sweep scores minimal pairs, so the point's eval.json holds this sweep's (without it, an eval.json
    left by an earlier sweep of other settings is not read)."""
    print(f"cramlm sweep: {size} for {budget}")
    run_pipeline(cfg)
    loss, kind = final_loss(cfg.run_dir)
    if loss is None:
        return None
    flops, how = training_flops(cfg.run_dir)
    summary = json.loads((cfg.run_dir / "summary.json").read_text())
    return {"size": size, "budget": budget, "run": str(cfg.run_dir), "parameters": summary["parameters"],
            "non_embedding_parameters": non_embedding_parameters(cfg.run_dir),
            "tokens": summary["tokens"], "flops": flops, "flops_from": how, "loss": loss, "loss_kind": kind,
            "bpb": final_bpb(cfg.run_dir), **(zero_shot_of(cfg.run_dir) if zero_shot else {})}


def zero_shot_of(run_dir: Path) -> dict[str, Any]:
    """The run's minimal-pair accuracy (eval.json, headline scorer, macro over paradigms) and tie
    rate, {} when it was not scored."""
    pairs = load_run_data(run_dir).pairs
    if not pairs:
        return {}
    head = pairs["scores"][pairs["headline"]]
    return {"zero_shot": head["accuracy"], "zero_shot_ties": head["tie_rate"], "zero_shot_scorer": pairs["headline"],
            "zero_shot_pairs": sum(r["pairs"] for r in head["paradigms"].values()), "zero_shot_paradigms": len(head["paradigms"])}


def zero_shot_mismatch(points: list[dict[str, Any]]) -> str | None:
    """Why the points' zero-shot accuracies are not one curve (scored by other scorers or on other pairs:
    pair files changed between sweeps), None when they are."""
    tests = {(p["zero_shot_scorer"], p.get("zero_shot_pairs"), p.get("zero_shot_paradigms")): p for p in points if "zero_shot" in p}
    if len(tests) < 2:
        return None
    return ("the points were scored by other scorers or on other pairs ("
            + ", ".join(f"{p['size']}-{p['budget']} {scorer} on {n} pairs in {k} paradigms" for (scorer, n, k), p in tests.items())
            + "): not shown against compute; re-run their eval stage with one eval.minimal_pairs")


def fit_points(points: list[dict[str, Any]], fitting: bool) -> tuple[dict | None, dict | None, dict[str, str]]:
    """(compute-law fit, L(N, D) fit, why a fit is missing). One wall-clock budget (``fitting``
    false) is a comparison at equal compute: each point gets its distance to the best instead."""
    fit, fit_nd, errors = None, None, {}
    if len(kinds := {p["loss_kind"] for p in points}) > 1:  # e.g. a point of an older sweep without val_loss
        why = ("the points' final losses are of different kinds ("
               + ", ".join(f"{p['size']}-{p['budget']} {p['loss_kind']}" for p in points) + "): not fitted or ranked; "
               + "train them again so each logs one kind (a finished point is skipped: delete the odd points' folders, "
               + "or add force=[pretrain] for every point; train.validate_sequences > 0 logs val_loss)")
        return None, None, {"fit": why, "fit_nd": why, "loss_kinds": ", ".join(sorted(kinds))}
    if not fitting:
        errors["fit"] = "one wall-clock budget: a comparison of shapes at equal compute, not fitted"
        best = min(points, key=lambda p: p["loss"])
        for p in points:
            p["vs_best"] = round(p["loss"] / best["loss"] - 1, 4)
    try:
        if fitting:
            fit = fit_compute_law([p["flops"] for p in points], [p["loss"] for p in points])
    except FitError as e:
        errors["fit"] = str(e)
    try:
        fit_nd = fit_chinchilla([p["non_embedding_parameters"] for p in points], [p["tokens"] for p in points],
                                [p["loss"] for p in points])
    except FitError as e:
        errors["fit_nd"] = str(e)
    return fit, fit_nd, errors


def sweep(recipe: str, sizes: list[str], budgets: list[str], name: str, overrides: list[str],
          report: bool = True) -> dict[str, Any]:
    """Run the grid (finished points are skipped), fit, and write sweep.json, sweep.png and (with
    ``report``) report.html comparing the runs' curves."""
    from cramlm.report import write_report
    from cramlm.train.budget import planned_tokens

    from cramlm.config.base import _safe_name
    from cramlm.run.folder import held_run

    try:
        _safe_name(name)
    except ValueError as e:
        raise ValueError(f"--name {name!r}: {e}") from None
    sizes, budgets = unique_grid(sizes, budgets)
    check_grid(sizes, budgets)  # the specs themselves, before any config is resolved
    base = resolve_recipe(recipe, overrides)
    folder = Path(base.base_dir) / name
    if held := [f for f in held_run(folder) if f != "report.html"]:  # its report and plots would land in a run's folder
        raise ValueError(f"--name {name}: {folder} holds a run ({', '.join(held[:3])}): give the sweep a folder of its own")
    zero_shot = bool(base.eval.minimal_pairs.paths)  # eval.minimal_pairs.paths=[...]: each point scores them
    grid = {(size, budget): point_config(recipe, overrides, folder, size, budget, zero_shot)
            for size in sizes for budget in budgets}
    trained = {point: tokens for point, cfg in grid.items()
               if (tokens := planned_tokens(cfg.train, cfg.impl.microbatch_size, cfg.data.seq_length, hours=cfg.budget)) is not None}
    fitting = check_grid(sizes, budgets, trained)  # the compute the points will train, before anything runs
    points = [p for (size, budget), cfg in grid.items() if (p := run_point(cfg, size, budget, zero_shot)) is not None]
    if not points:
        raise ValueError("the sweep produced no losses")
    if why := zero_shot_mismatch(points):
        for p in points:
            for key in ("zero_shot", "zero_shot_ties"):
                p.pop(key, None)
    best = min(points, key=lambda p: p["loss"])
    fit, fit_nd, errors = fit_points(points, fitting)
    result = {"recipe": recipe, "overrides": overrides, "sizes": sizes, "budgets": budgets, "points": points,
              "fit": fit, "law": "loss = E + A * flops^-alpha (scipy curve_fit, E >= 0)",
              "fit_nd": fit_nd, "law_nd": "loss = E + A / N^a + B / D^b (N non-embedding parameters, D tokens)",
              "fit_errors": errors, **({"zero_shot_error": why} if why else {}), "data": {  # what the points were trained with (cramlm plan --law reads it)
                  "recipe": recipe, "vocab_size": base.data.tokenizer.vocab_size, "seq_length": base.data.seq_length,
                  "batch_size": base.train.batch_size, "optimizer": base.train.optim.type,
                  "lr": base.train.optim.lr, "mlm_probability": base.train.mlm_probability}}
    write_json(folder / "sweep.json", result)
    plot_sweep(points, fit, folder / "sweep.png")
    if report:
        write_report(*[p["run"] for p in points], out=folder)
    print(table(points, fit))
    if why:
        print(f"zero-shot: {why}")
    if fit:
        print(f"fit: L = {fit['E']:.4g} + {fit['A']:.4g} * C^-{fit['alpha']:.4f}  (R^2 {fit['r2']:.3f}, {fit['points']} points)")
    if fit_nd:
        print(f"fit: L(N, D) = {fit_nd['E']:.4g} + {fit_nd['A']:.4g} / N^{fit_nd['a']:.4f} + {fit_nd['B']:.4g} / D^{fit_nd['b']:.4f}"
              f"  (R^2 {fit_nd['r2']:.3f})")
    print(f"written: {folder / 'sweep.json'}, {folder / 'sweep.png'}" + (f", {folder / 'report.html'}" if report else ""))
    if "loss_kinds" in errors:
        raise FitError(f"no fit: {errors['fit']} (the points are in {folder / 'sweep.json'})")
    if not fitting:
        print(f"best for {budgets[0]}: {best['size']} (loss {best['loss']:.4f}); "
              + ", ".join(f"{p['size']} {100 * p['vs_best']:+.1f}%" for p in sorted(points, key=lambda p: p["loss"])[1:]))
    elif fit is None:
        raise FitError(f"no fit: {errors['fit']} (the points are in {folder / 'sweep.json'})")
    return result
