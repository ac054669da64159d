"""Task metrics, from scikit-learn and scipy."""

from __future__ import annotations

import numpy as np
from scipy.stats import pearsonr, spearmanr
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
    if metric == "pearson":
        return float(pearsonr(predictions, labels)[0]) if np.std(predictions) > 0 else 0.0
    if metric == "spearman":
        return float(spearmanr(predictions, labels)[0]) if np.std(predictions) > 0 else 0.0
    raise ValueError(f"unknown metric '{metric}'; known: {', '.join(METRICS)}")
