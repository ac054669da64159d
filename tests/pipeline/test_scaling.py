"""The compute multiplier and the frontier it is read from (pipeline/scaling.py): pure functions of
a baseline's curve or frontier and a candidate's final point."""

import math

import pytest

from cramlm.pipeline.scaling import best_lr_frontier, compute_multiplier, frontier_multiplier

# a baseline whose loss falls by 1 per factor 10 of compute: loss = 10 - log10(x)
X = [1e3, 1e4, 1e5, 1e6]
L = [7.0, 6.0, 5.0, 4.0]


def test_interpolated_in_log_compute():
    m = compute_multiplier(X, L, cand_x=1e4, cand_loss=5.5)  # the baseline reaches 5.5 at 10^4.5
    assert m["baseline_x"] == pytest.approx(10**4.5) and m["multiplier"] == pytest.approx(10**0.5)
    assert m["bound"] is None and not m["extrapolated"]
    assert compute_multiplier(X, L, 1e5, 5.0)["multiplier"] == pytest.approx(1.0)  # on a point: equal
    assert compute_multiplier(X, L, 1e6, 5.0)["multiplier"] == pytest.approx(0.1)  # a worse candidate: < 1
    assert compute_multiplier(list(reversed(X)), list(reversed(L)), 1e4, 5.5)["multiplier"] == pytest.approx(10**0.5)


def test_first_crossing_of_a_noisy_curve():
    m = compute_multiplier([1, 10, 100, 1000], [5.0, 3.0, 3.5, 2.0], cand_x=10, cand_loss=3.2)
    assert m["baseline_x"] == pytest.approx(10 ** (1.8 / 2.0))  # between 1 and 10, not after the bump


def test_beyond_the_curve_is_a_bound_unless_extrapolated():
    m = compute_multiplier(X, L, cand_x=1e5, cand_loss=3.5)  # better than the baseline's end
    assert m["bound"] == "lower" and m["multiplier"] == pytest.approx(10.0) and not m["extrapolated"]
    e = compute_multiplier(X, L, cand_x=1e5, cand_loss=3.5, extrapolate=True)
    assert e["extrapolated"] and e["bound"] is None and e["multiplier"] == pytest.approx(10**1.5)
    up = compute_multiplier(X, L, cand_x=1e4, cand_loss=8.0)  # worse than the baseline's start
    assert up["bound"] == "upper" and up["multiplier"] == pytest.approx(0.1)
    back = compute_multiplier(X, L, cand_x=1e4, cand_loss=8.0, extrapolate=True)
    assert back["extrapolated"] and back["multiplier"] == pytest.approx(0.01)
    flat = compute_multiplier([1, 10], [3.0, 3.0], cand_x=10, cand_loss=2.0, extrapolate=True)
    assert flat["bound"] == "lower" and not flat["extrapolated"]  # a flat end says nothing about later


def test_bad_curves_are_refused():
    with pytest.raises(ValueError):
        compute_multiplier([0, 10], [3.0, 2.0], 1, 2.5)
    with pytest.raises(ValueError):
        compute_multiplier([], [], 1, 2.5)
    assert math.isfinite(compute_multiplier([5], [2.0], 5, 3.0)["multiplier"])


def test_each_budget_of_the_frontier_keeps_its_lowest_loss():
    """best_lr_frontier: the 1x point, then per larger budget the lr with the lowest final loss (a
    point's budget multiple from its FLOPs where it does not say), in budget order."""
    first = {"flops": 1e4, "val_loss": 6.0, "lr": 1e-3}
    larger = [{"flops": 4e4, "val_loss": 4.5, "lr": 1e-3}, {"flops": 2e4, "val_loss": 5.5, "lr": 1e-3},
              {"flops": 2e4, "val_loss": 5.0, "lr": 2e-3}, {"flops": 4e4, "val_loss": None, "lr": 4e-3},
              {"flops": 4.1e4, "val_loss": 4.0, "lr": 4e-3, "times": 4}]
    front = best_lr_frontier(first, larger)
    assert [(f["flops"], f["val_loss"], f["lr"]) for f in front] == [(1e4, 6.0, 1e-3), (2e4, 5.0, 2e-3), (4.1e4, 4.0, 4e-3)]
    m = frontier_multiplier(front, 1e4, 5.0)  # the frontier reaches 5.0 at 2e4
    assert m["multiplier"] == pytest.approx(2.0) and m["bound"] is None
    seconds = [{**f, "seconds": f["flops"] / 1e3} for f in front]
    assert frontier_multiplier(seconds, 10.0, 5.0, axis="seconds")["multiplier"] == pytest.approx(2.0)
