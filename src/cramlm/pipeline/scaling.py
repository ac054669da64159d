"""Scaling laws with an irreducible-loss term, fitted with scipy (used by ``cramlm sweep`` and the
budget planner, ``cramlm plan``), and the compute multiplier of one recipe over another.

- compute law:    L(C) = E + A * C^-alpha                  (3 parameters)
- Chinchilla law: L(N, D) = E + A / N^a + B / D^b          (5 parameters; Hoffmann et al. 2022)
- multiplier law: log m = k + b log N + c log(D / N)       (a recipe's compute multiplier over a
  baseline against size and tokens per parameter; least squares, with a prediction interval)
- compute multiplier m: the baseline needs m times the candidate's compute to reach the
  candidate's held-out loss, read off the baseline's curve or its frontier of final losses at
  several budgets (``compute_multiplier``, ``best_lr_frontier``, ``frontier_multiplier``; the
  recipe ablations of benchmarks/ measure with them)

C is training FLOPs, N non-embedding parameters, D training tokens. Fits are bounded least squares
(E >= 0 and below the lowest observed loss, exponents in [0, 3]) from several starting points, in
units normalised by the data's geometric mean so the optimiser sees numbers near 1; the constants
are returned in the original units.
"""

from __future__ import annotations

import math
import re
from typing import Sequence

import numpy as np

COMPUTE_PARAMETERS = 3
CHINCHILLA_PARAMETERS = 5


class FitError(ValueError):
    """The data cannot determine the law (too few points or distinct values)."""


def distinct(values: Sequence[float], digits: int = 3) -> int:
    """Distinct positive values, counted on a log scale (0.1% apart counts as equal)."""
    return len({round(math.log10(v), digits) for v in values if v > 0})


def check_compute_fit(n_points: int, n_compute: int) -> None:
    """Raise FitError unless ``n_points`` points at ``n_compute`` distinct compute values can fit
    the 3-parameter compute law (at least 4 points, at least 3 distinct compute values)."""
    if n_points < COMPUTE_PARAMETERS + 1:
        raise FitError(f"{n_points} point(s): fitting L = E + A*C^-alpha ({COMPUTE_PARAMETERS} parameters) "
                       f"needs at least {COMPUTE_PARAMETERS + 1}")
    if n_compute < COMPUTE_PARAMETERS:
        raise FitError(f"{n_compute} distinct compute value(s): fitting L = E + A*C^-alpha needs at least "
                       f"{COMPUTE_PARAMETERS} (as many as it has parameters)")


def r_squared(y: np.ndarray, predicted: np.ndarray) -> float:
    ss_res, ss_tot = float(np.sum((y - predicted) ** 2)), float(np.sum((y - y.mean()) ** 2))
    return 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0


def _best_fit(f, x, y, starts, bounds) -> np.ndarray:
    from scipy.optimize import curve_fit

    best, best_err = None, math.inf
    for p0 in starts:
        try:
            params, _ = curve_fit(f, x, y, p0=p0, bounds=bounds, maxfev=20000)
        except (RuntimeError, ValueError):
            continue
        err = float(np.sum((f(x, *params) - y) ** 2))
        if err < best_err:
            best, best_err = params, err
    if best is None:
        raise FitError("the least-squares fit did not converge from any starting point")
    return best


def fit_compute_law(compute: Sequence[float], loss: Sequence[float]) -> dict[str, float]:
    """L(C) = E + A * C^-alpha. Returns E, A, alpha, r2, points."""
    C, L = np.asarray(compute, float), np.asarray(loss, float)
    check_compute_fit(len(C), distinct(C))
    ref = float(np.exp(np.mean(np.log(C))))
    x = C / ref

    def law(c, E, a, alpha):
        return E + a * c ** (-alpha)

    lo = float(L.min())
    starts = [(e * lo, max(L.max() - e * lo, 1e-3), alpha) for e in (0.0, 0.5, 0.9) for alpha in (0.05, 0.3, 1.0)]
    E, a, alpha = _best_fit(law, x, L, starts, ([0.0, 0.0, 0.0], [lo, np.inf, 3.0]))
    return {"E": float(E), "A": float(a * ref**alpha), "alpha": float(alpha),
            "r2": r_squared(L, law(x, E, a, alpha)), "points": len(C)}


def compute_law(fit: dict[str, float], compute: float | np.ndarray):
    return fit["E"] + fit["A"] * np.asarray(compute, float) ** (-fit["alpha"])


def fit_chinchilla(params: Sequence[float], tokens: Sequence[float], loss: Sequence[float]) -> dict[str, float]:
    """L(N, D) = E + A / N^a + B / D^b. Needs 6 points or more, 2 distinct N and 2 distinct D."""
    N, D, L = (np.asarray(v, float) for v in (params, tokens, loss))
    if len(L) < CHINCHILLA_PARAMETERS + 1:
        raise FitError(f"{len(L)} point(s): fitting L = E + A/N^a + B/D^b ({CHINCHILLA_PARAMETERS} parameters) "
                       f"needs at least {CHINCHILLA_PARAMETERS + 1}")
    if distinct(N) < 2 or distinct(D) < 2:
        raise FitError(f"{distinct(N)} distinct model size(s) and {distinct(D)} distinct token count(s): "
                       "fitting L(N, D) needs at least 2 of each")
    n_ref, d_ref = float(np.exp(np.mean(np.log(N)))), float(np.exp(np.mean(np.log(D))))
    x = np.vstack([N / n_ref, D / d_ref])

    def law(nd, E, A, a, B, b):
        return E + A * nd[0] ** (-a) + B * nd[1] ** (-b)

    lo, span = float(L.min()), float(L.max() - L.min()) + 1e-3
    starts = [(e * lo, span, a, span, b) for e in (0.0, 0.7) for a in (0.1, 0.5) for b in (0.1, 0.5)]
    E, A, a, B, b = _best_fit(law, x, L, starts, ([0.0, 0.0, 0.0, 0.0, 0.0], [lo, np.inf, 3.0, np.inf, 3.0]))
    return {"E": float(E), "A": float(A * n_ref**a), "a": float(a), "B": float(B * d_ref**b), "b": float(b),
            "r2": r_squared(L, law(x, E, A, a, B, b)), "points": len(L)}


def chinchilla_law(fit: dict[str, float], params: float | np.ndarray, tokens: float | np.ndarray):
    N, D = np.asarray(params, float), np.asarray(tokens, float)
    return fit["E"] + fit["A"] * N ** (-fit["a"]) + fit["B"] * D ** (-fit["b"])


TERMS = ("size", "ratio")


def fit_multiplier_law(params: Sequence[float], tokens: Sequence[float], multiplier: Sequence[float],
                       terms: Sequence[str] = TERMS, groups: Sequence[str] | None = None) -> dict:
    """log m = k + b log(N / 1e6) + c log(D / N): ordinary least squares, N non-embedding parameters,
    D training tokens; ``terms`` keeps the size term, the tokens-per-parameter term or both (a term
    left out has coefficient 0). Without ``groups`` every observation (a seed each) is a point.
    ``groups`` (a label per observation, e.g. its size and budget): the seeds of a group are read on
    one baseline frontier, so their errors are not independent; the law is fitted on each group's
    mean of log m, log N and log D, with the groups' degrees of freedom, and the seeds' scatter about
    their group's mean (``sigma2_within``) is added to a prediction's (one seed's multiplier).
    Returns the coefficients, their covariance and the residual variance (for ``multiplier_law``'s
    interval), r2, the points, and the correlation of the two regressors (near -1 or 1: the data
    cannot tell them apart)."""
    N, D, m = (np.asarray(v, float) for v in (params, tokens, multiplier))
    sigma2_within, seeds, inverse_n = 0.0, len(m), 0.0
    if groups is not None:
        if len(groups) != len(m):
            raise FitError(f"{len(groups)} group labels for {len(m)} observations")
        labels = list(dict.fromkeys(groups))
        members = [np.array([i for i, g in enumerate(groups) if g == label]) for label in labels]
        logs = {name: np.log(v) for name, v in (("N", N), ("D", D), ("m", m))}
        for label, i in zip(labels, members):  # a group is one size at one budget: its seeds' N and D / N agree
            if np.ptp(logs["N"][i]) > 1e-6 or np.ptp(logs["D"][i] - logs["N"][i]) > 0.1:
                raise FitError(f"group '{label}' holds observations of other sizes or tokens per parameter")
        within_dof = sum(len(i) - 1 for i in members)
        sigma2_within = float(sum(((logs["m"][i] - logs["m"][i].mean()) ** 2).sum() for i in members) / within_dof) if within_dof else 0.0
        inverse_n = float(np.mean([1 / len(i) for i in members]))
        N, D, m = (np.exp([logs[name][i].mean() for i in members]) for name in ("N", "D", "m"))
    need = 2 + len(terms)
    if len(m) < need or ("size" in terms and distinct(N) < 2) or ("ratio" in terms and distinct(D / N) < 2):
        raise FitError(f"{len(m)} point(s), {distinct(N)} size(s), {distinct(D / N)} tokens-per-parameter value(s): "
                       f"the multiplier law ({1 + len(terms)} coefficients) needs at least {need} points and 2 values of each term")
    X = _multiplier_features(N, D, terms)
    y = np.log(m)
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    dof = len(y) - X.shape[1]
    resid = y - X @ coef
    sigma2 = float(resid @ resid / dof)
    named = dict(zip(("k", *terms), coef.tolist()))
    return {"k": named["k"], "b": named.get("size", 0.0), "c": named.get("ratio", 0.0), "terms": list(terms),
            "cov": (sigma2 * np.linalg.pinv(X.T @ X)).tolist(), "sigma2": sigma2, "dof": dof,
            "sigma2_within": sigma2_within, "inverse_n": inverse_n, "grouped": groups is not None, "observations": seeds,
            "r2": r_squared(y, X @ coef), "points": len(y),
            "regressor_correlation": float(np.corrcoef(np.log(N), np.log(D / N))[0, 1]) if distinct(N) > 1 and distinct(D / N) > 1 else None}


def _multiplier_features(N: np.ndarray, D: np.ndarray, terms: Sequence[str]) -> np.ndarray:
    columns = {"size": np.log(N / 1e6), "ratio": np.log(D / N)}
    return np.column_stack([np.ones_like(N), *(columns[t] for t in terms)])


def multiplier_law(fit: dict, params: float, tokens: float, level: float = 0.9) -> dict[str, float]:
    """The law's multiplier at (N, D) and its ``level`` prediction interval (Student t with the fit's
    degrees of freedom: the coefficients' uncertainty plus one observation's scatter; a grouped fit's
    plus the seeds' within a group)."""
    from scipy.stats import t

    terms = fit["terms"]
    x = _multiplier_features(np.asarray([params], float), np.asarray([tokens], float), terms)[0]
    coef = np.array([fit["k"], *({"size": fit["b"], "ratio": fit["c"]}[t] for t in terms)])
    centre = float(x @ coef)
    # one observation's scatter: the group means' holds the seeds' divided by a group's seeds; one seed, all of it
    within = fit.get("sigma2_within", 0.0)
    scatter = max(fit["sigma2"] - within * fit.get("inverse_n", 0.0), 0.0) + within
    spread = math.sqrt(float(x @ np.asarray(fit["cov"]) @ x) + scatter)
    q = float(t.ppf(0.5 + level / 2, fit["dof"]))
    return {"multiplier": math.exp(centre), "low": math.exp(centre - q * spread), "high": math.exp(centre + q * spread),
            "level": level}


def compute_multiplier(base_x: Sequence[float], base_loss: Sequence[float], cand_x: float, cand_loss: float,
                       extrapolate: bool = False) -> dict:
    """How many times the candidate's compute ``cand_x`` the baseline needs to reach ``cand_loss``
    on its curve (``base_x`` positive, in any order; ``base_loss`` at those points).

    The baseline's compute at that loss: the first point of its curve (by compute) at or below
    ``cand_loss``, interpolated linearly in log x with the point before it. Outside the curve: below
    its last point (the candidate ended better than the baseline did) the last segment is continued
    in log x when ``extrapolate`` (flagged), else the multiplier is a lower bound (``bound:
    "lower"``: the baseline's final x over the candidate's, it needs at least that); above its first
    point an upper bound (``bound: "upper"``). Returns {multiplier, baseline_x, bound, extrapolated}."""
    pts = sorted(zip(base_x, base_loss))
    if not pts or any(x <= 0 for x, _ in pts) or cand_x <= 0:
        raise ValueError("curves need positive compute values")
    xs, ys = [math.log(x) for x, _ in pts], [y for _, y in pts]

    def result(x: float, bound: str | None = None, extrapolated: bool = False) -> dict:
        return {"multiplier": x / cand_x, "baseline_x": x, "bound": bound, "extrapolated": extrapolated}

    def along(i: int) -> float:  # x where the segment (i - 1, i), a line in log x, meets cand_loss
        (x0, x1), (y0, y1) = xs[i - 1 : i + 1], ys[i - 1 : i + 1]
        return math.exp(x0 + (cand_loss - y0) * (x1 - x0) / (y1 - y0))

    if ys[0] <= cand_loss:  # the baseline's first point is already as good
        if ys[0] < cand_loss and extrapolate and len(ys) > 1 and ys[1] < ys[0]:
            return result(along(1), extrapolated=True)  # the first segment, continued backwards
        return result(pts[0][0], None if ys[0] == cand_loss else "upper")
    i = next((j for j in range(1, len(ys)) if ys[j] <= cand_loss), None)
    if i is not None:
        return result(along(i))
    if extrapolate and len(ys) > 1 and ys[-1] < ys[-2]:
        return result(along(len(ys) - 1), extrapolated=True)  # the last segment, continued
    return result(pts[-1][0], "lower")


def best_lr_frontier(first: dict, larger: Sequence[dict]) -> list[dict]:
    """A baseline's frontier of final losses (one seed): ``first``, its final point at 1x the budget
    (at its sweep's best lr), then at each larger budget the lowest final ``val_loss`` of the lrs
    trained there (the best lr at 1x is not the best at 4x: a longer run takes a larger lr). Points
    are dicts with ``flops`` and ``val_loss`` (and their ``lr``); a point's budget multiple is its
    ``times``, else its FLOPs over ``first``'s, to one decimal."""
    by_times: dict[float, dict] = {}
    for f in larger:
        times = f.get("times") or round(f["flops"] / first["flops"], 1)  # stored points carry no multiple
        if f.get("val_loss") is not None and (times not in by_times or f["val_loss"] < by_times[times]["val_loss"]):
            by_times[times] = f
    return [first, *(by_times[t] for t in sorted(by_times))]


def frontier_multiplier(frontier: Sequence[dict], x: float, loss: float, axis: str = "flops",
                        extrapolate: bool = False) -> dict:
    """``compute_multiplier`` of a candidate at ``x`` (its ``axis``: flops or seconds) and final
    ``loss`` on a frontier's points (dicts with ``axis`` and ``val_loss``)."""
    return compute_multiplier([f[axis] for f in frontier], [f["val_loss"] for f in frontier], x, loss, extrapolate)


EMBEDDINGS = ("trunk.tokens.", "trunk.positions.", "trunk.token_types.", "trunk.value_embeds.")


def non_embedding_parameters(model) -> int:
    """N of the Chinchilla law: parameters outside the token / position / type embeddings (a tied
    decoder shares the token embedding and is not counted either)."""
    return sum(p.numel() for name, p in model.named_parameters() if not name.startswith(EMBEDDINGS))


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
