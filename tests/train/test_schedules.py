"""Every schedule has the right shape as a function of t."""

import math

import pytest

from cramlm.config.registry import config_class, names
from cramlm.train.schedules import build_schedule


def sched(type_: str, **kw):
    return build_schedule(config_class("schedule", type_)(type=type_, **kw))


def grid(f, n=1000):
    return [f(i / n) for i in range(n + 1)]


def test_registered():
    assert {"budget-triangle2", "one-cycle", "cosine", "warmup-stable-decay", "constant", "polynomial"} <= set(names("schedule"))


def test_budget_triangle2_is_cramming():
    f = sched("budget-triangle2")
    assert f(0) == pytest.approx(0.25) and f(0.5) == pytest.approx(0.75)
    assert f(0.75) == pytest.approx(1.0) and f(1.0) == pytest.approx(0.0)
    assert f(0.875) == pytest.approx(0.5)  # linear fall to zero over the last 25%
    ys = grid(f)
    peak = ys.index(max(ys))
    assert all(a <= b for a, b in zip(ys[:peak], ys[1 : peak + 1]))
    assert all(a >= b for a, b in zip(ys[peak:], ys[peak + 1 :]))


def test_warmup_cosine():
    f = sched("cosine", warmup=0.1, min_factor=0.1)
    assert f(0) == 0 and f(0.05) == pytest.approx(0.5) and f(0.1) == pytest.approx(1.0)
    assert f(0.55) == pytest.approx(0.1 + 0.9 * 0.5)  # half-way through the decay
    assert f(1.0) == pytest.approx(0.1)


def test_one_cycle_matches_torch():
    import torch

    steps = 1000  # torch is step-based (peak at step pct*total - 1): equal up to discretisation
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched_t = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1.0, total_steps=steps + 1, pct_start=0.3)
    ours = sched("one-cycle", peak=0.3)
    for i in range(steps + 1):
        assert ours(i / steps) == pytest.approx(opt.param_groups[0]["lr"], abs=1e-2)
        opt.step()
        if i < steps:
            sched_t.step()


def test_warmup_stable_decay():
    f = sched("warmup-stable-decay", warmup=0.1, decay=0.2)
    assert f(0.05) == pytest.approx(0.5)
    assert all(f(t) == 1.0 for t in (0.1, 0.3, 0.5, 0.8))
    assert f(0.9) == pytest.approx(0.5) and f(1.0) == pytest.approx(0.0)
    g = sched("warmup-stable-decay", warmup=0.0, decay=0.5, decay_shape="cosine", min_factor=0.2)
    assert g(0.0) == 1.0 and g(0.75) == pytest.approx(0.6) and g(1.0) == pytest.approx(0.2)


def test_polynomial_bert_original():
    f = sched("polynomial", warmup=0.01, power=1.0)
    assert f(0.005) == pytest.approx(0.5) and f(0.01) == pytest.approx(1.0)
    assert f(0.505) == pytest.approx(0.5) and f(1.0) == 0.0
    g = sched("polynomial", warmup=0.0, power=2.0, end_factor=0.1)
    assert g(0.5) == pytest.approx(0.1 + 0.9 * 0.25)


def test_constant():
    assert grid(sched("constant")) == [1.0] * 1001
    f = sched("constant", warmup=0.2)
    assert f(0.1) == pytest.approx(0.5) and f(0.5) == 1.0


@pytest.mark.parametrize("name", ["budget-triangle2", "one-cycle", "cosine", "warmup-stable-decay", "constant", "polynomial"])
def test_bounded_outside_unit_interval(name):
    f = sched(name)
    for t in (-0.5, 0, 0.3, 1, 1.2, 7):
        assert 0.0 <= f(t) <= 1.0 and math.isfinite(f(t))
