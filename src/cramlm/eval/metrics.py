"""Task metrics from scikit-learn and scipy, and the means over tasks that tables report."""

from __future__ import annotations

import numpy as np
from scipy.stats import hmean, pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

METRICS = ("accuracy", "f1", "matthews", "pearson", "spearman")
REGRESSION_METRICS = ("pearson", "spearman")


def score(metric: str, predictions: np.ndarray, labels: np.ndarray) -> float:
    """``predictions`` are class indices (or values for regression). F1 is binary, positive class 1."""
    if metric == "accuracy":
        return float(accuracy_score(labels, predictions))
    if metric == "f1":
        return float(f1_score(labels, predictions, pos_label=1, average="binary", zero_division=0.0))
    if metric == "matthews":
        return float(matthews_corrcoef(labels, predictions))
    # a constant prediction has no correlation; scipy would return nan with a warning
    if metric == "pearson":
        return float(pearsonr(predictions, labels)[0]) if np.std(predictions) > 0 else 0.0
    if metric == "spearman":
        return float(spearmanr(predictions, labels)[0]) if np.std(predictions) > 0 else 0.0
    raise ValueError(f"unknown metric '{metric}'; known: {', '.join(METRICS)}")


def score_all(metrics: list[str], predictions: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    return {m: score(m, predictions, labels) for m in metrics}


def arithmetic_mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else float("nan")


def harmonic_mean(values: list[float]) -> float | None:
    """Harmonic mean, or None where it is undefined: no values, or a score at or below 0 (accuracy
    or F1 of 0, Matthews and Pearson correlations, which can be negative). Reporting 0 there would
    read as a measured mean; the tables say "undefined" instead."""
    if not values or min(values) <= 0:
        return None
    return float(hmean(values))
