"""Budgets end the run at the right step; the batch plan ramps and keeps a minimum of updates."""

import json
import math

import pytest

from cramlm.config.loader import ConfigError
from cramlm.train.budget import BatchPlan, Budget, BudgetConfig, Usage
from cramlm.train.config import TrainConfig

from .helpers import records, run_inprocess

TOKENS_PER_STEP = 8 * 32  # train.batch_size x data.seq_length in helpers.TINY


def test_token_budget_stops_at_the_right_step(tmp_path):
    s = run_inprocess(tmp_path, "tok", "budget=null", "train.budget.tokens=1000")
    assert s["steps"] == math.ceil(1000 / TOKENS_PER_STEP) == 4  # stops within one step of the budget
    assert s["tokens"] == 4 * TOKENS_PER_STEP and s["t"] == pytest.approx(1024 / 1000)
    assert [r["step"] for r in records(tmp_path / "tok")] == [1, 2, 3, 4]
    assert (tmp_path / "tok" / "checkpoints" / "step-00000004" / "model.safetensors").is_file()  # final checkpoint
    assert json.loads((tmp_path / "tok" / "summary.json").read_text())["steps"] == 4
    lr = [r["lr"] for r in records(tmp_path / "tok")]  # budget-triangle2 over t = tokens / budget
    assert lr[0] == pytest.approx(0.25e-3) and lr[1] == pytest.approx((0.25 + 0.256) * 1e-3)

    # the same run measured in FLOPs (the model's count per token) stops at the same step
    flops = s["flops_per_token"] * 1000
    s2 = run_inprocess(tmp_path, "flops", "budget=null", f"train.budget.flops={flops}")
    assert s2["steps"] == 4 and s2["flops"] == pytest.approx(4 * TOKENS_PER_STEP * s["flops_per_token"])


def test_step_budget_and_min_updates(tmp_path):
    assert run_inprocess(tmp_path, "steps", "budget=null", "train.budget.steps=3")["steps"] == 3
    # 2560 tokens at batch 64 would be 2 updates; min_updates=10 caps the batch to one microbatch
    common = ["budget=null", f"train.budget.tokens={10 * TOKENS_PER_STEP}", "train.batch_size=64", "train.batch_ramp=0"]
    assert run_inprocess(tmp_path, "big", *common, "train.min_updates=0")["steps"] == 2
    capped = run_inprocess(tmp_path, "capped", *common, "train.min_updates=10")
    assert capped["steps"] == 10 and {r["batch_size"] for r in records(tmp_path / "capped")} == {8}


def test_wall_clock_budget(tmp_path):
    s = run_inprocess(tmp_path, "clock", "budget=2s", "train.validate_every=0")
    assert 2.0 <= s["train_seconds"] and s["t"] >= 1.0
    # it stopped at the first step past the budget (log_every=1: every step has its clock reading),
    # however long that step took on a loaded machine
    elapsed = [r["elapsed"] for r in records(tmp_path / "clock")]
    assert elapsed[-1] == pytest.approx(s["train_seconds"], abs=1e-3) and all(e <= 2.0 for e in elapsed[:-1])  # (rounded to ms)
    assert s["budget_counts"] == {"compile": True, "eval": False, "setup": False, "checkpoints": True}


def test_what_counts_against_the_hours_is_set_beside_them(tmp_path):
    s = run_inprocess(tmp_path, "counts", "budget=null", "train.budget.steps=2", "count_compile=false", "count_eval=true")
    assert s["budget_counts"] == {"compile": False, "eval": True, "setup": False, "checkpoints": True}
    with pytest.raises(Exception, match="train.budget.count_compile: unknown key"):  # one home: the root
        run_inprocess(tmp_path, "old", "train.budget.count_compile=false")


def test_no_budget_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no budget"):
        run_inprocess(tmp_path, "none", "budget=null")
    with pytest.raises((ConfigError, SystemExit, Exception), match="positive"):
        run_inprocess(tmp_path, "neg", "budget=-1")


def plan(world=1, **kw):
    budget = Budget(BudgetConfig(**kw.pop("budget", {})), kw.pop("hours", None), flops_per_token=1.0)
    cfg = TrainConfig(**kw)
    return BatchPlan(cfg, micro=8, world=world, seq_len=32, budget=budget), budget


def test_batch_ramp_is_a_function_of_t():
    p, _ = plan(batch_size=64, batch_ramp=0.5, min_updates=0, budget={"steps": 100})
    assert [p.microbatches(t, Usage(), None) for t in (0.0, 0.1, 0.25, 0.5, 0.9)] == [1, 2, 4, 8, 8]
    p2, _ = plan(world=2, batch_size=64, batch_ramp=0.5, min_updates=0, budget={"steps": 100})
    assert [p2.microbatches(t, Usage(), None) for t in (0.0, 0.1, 0.25, 0.5)] == [2, 2, 4, 8]  # whole rounds of processes
    with pytest.raises(ValueError, match="multiple"):
        plan(world=3, batch_size=64, budget={"steps": 1})


def test_auto_batch_from_measured_throughput():
    # one hour at a measured 10k tokens/s = 36M tokens; 1000 updates -> 36k tokens/step -> 140 microbatches of 8x32
    p, _ = plan(batch_size="auto", max_batch_size=8192, batch_ramp=0, min_updates=1000, hours=1.0)
    assert p.microbatches(0.0, Usage(), None) == 1  # probing until throughput is measured
    assert p.microbatches(0.1, Usage(), 10_000.0) == 36_000_000 // (1000 * 8 * 32)
    assert p.microbatches(0.1, Usage(), 1e9) == 8192 // 8  # fast hardware: the full batch


def test_the_plan_reads_the_agreed_clock_so_every_process_sizes_its_step_alike():
    """Two processes of one run book the same steps on the agreed (slowest) clock, each with its own
    step time; the rate the plan reads is the agreed one, so under a seconds budget with min_updates
    both cut the last steps to the same microbatch count (their own rates would not: a hang)."""
    from cramlm.train.budget import Costs, Meter

    p, budget = plan(batch_size="auto", max_batch_size=8192, batch_ramp=0, min_updates=1000, hours=1.0)
    meters = [Meter(budget, Costs(flops_per_token=1.0, flops_source="test", peak=None, peak_source="test")) for _ in range(2)]
    for meter, own in zip(meters, (0.020, 0.027)):  # each process's own step seconds
        meter.start()
        assert meter.agreed_tokens_per_second is None  # nothing booked yet
        for step in range(1, 40):
            meter.record(tokens=36_000, step_seconds=own, agreed_seconds=3500 * step / 39)
    a, b = meters
    assert a.tokens_per_second != b.tokens_per_second  # measured here: they differ
    assert a.agreed_tokens_per_second == b.agreed_tokens_per_second == pytest.approx(36_000 * 38 / (3500 * 38 / 39))
    sizes = {p.microbatches(m.t, m.used, m.agreed_tokens_per_second) for m in meters}
    assert len(sizes) == 1 and sizes.pop() < 8192 // 8  # the budget's end cuts both alike
    own = {p.microbatches(m.t, m.used, m.tokens_per_second) for m in meters}
    assert len(own) == 2  # what each process's own rate would have planned
