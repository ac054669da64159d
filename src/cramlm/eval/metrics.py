"""Task metrics from scikit-learn and scipy, and the means over tasks that tables report.

scikit-learn, scipy and numpy are imported where a score is computed, not at import: the task
and config modules import the metric names from here, and the command line's ``--help``, config
errors and ``config show`` must not pay for them (about 2 s of scipy.stats + sklearn.metrics)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

METRICS = ("accuracy", "f1", "matthews", "pearson", "spearman")
REGRESSION_METRICS = ("pearson", "spearman")


def score(metric: str, predictions: np.ndarray, labels: np.ndarray) -> float:
    """``predictions`` are class indices (or values for regression). F1 is binary, positive class 1."""
    import numpy as np
    from scipy.stats import pearsonr, spearmanr
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

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
    import numpy as np

    return float(np.mean(values)) if values else float("nan")


def harmonic_mean(values: list[float]) -> float | None:
    """Harmonic mean, or None where it is undefined: no values, or a score at or below 0 (accuracy
    or F1 of 0, Matthews and Pearson correlations, which can be negative). Reporting 0 there would
    read as a measured mean; the tables say "undefined" instead."""
    if not values or min(values) <= 0:
        return None
    from scipy.stats import hmean

    return float(hmean(values))
