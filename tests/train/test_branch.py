"""One warmup-stable-decay run gives every budget: a cooldown branched from its stable-phase
checkpoint (``resume=<that checkpoint>`` with the shorter budget and the same warm-up in absolute
terms, both allowed changes) is bit for bit the run trained at that budget from the start
(Hagele et al. 2024; benchmarks/results/bridge/ uses it for 1x-8x the CPU hour)."""

import json

import torch
from safetensors.torch import load_file

from .helpers import losses, run_inprocess

# warm-up 2 steps, decay over the last quarter; powers of two so that the long run's t / warmup
# and the short run's are the same floats (t = steps / budget)
WSD = ["budget=null", "train.schedule.type=warmup-stable-decay", "train.schedule.decay=0.25",
       "train.checkpoint_every=4", "train.keep_checkpoints=20", "train.validate_every=0", "train.optim.lr=3e-3"]


def final_state(run_dir):
    summary = json.loads((run_dir / "summary.json").read_text())
    return load_file(f"{summary['final_checkpoint']}/model.safetensors")


def test_a_cooldown_branched_from_the_long_run_is_the_run_at_that_budget(tmp_path):
    run_inprocess(tmp_path, "long", *WSD, "train.budget.steps=32", "train.schedule.warmup=0.0625")
    run_inprocess(tmp_path, "short", *WSD, "train.budget.steps=16", "train.schedule.warmup=0.125")
    stable_end = tmp_path / "long" / "checkpoints" / "step-00000012"  # 16 x (1 - 0.25): the decay starts after it
    branch = run_inprocess(tmp_path, "branch", *WSD, "train.budget.steps=16", "train.schedule.warmup=0.125",
                           f"resume={stable_end}", "allow_change=[train.budget.steps,train.schedule.warmup]")
    assert branch["steps"] == 16
    a, b = final_state(tmp_path / "short"), final_state(tmp_path / "branch")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    short, long = losses(tmp_path / "short"), losses(tmp_path / "long")
    assert losses(tmp_path / "branch") == {s: v for s, v in short.items() if s > 12}
    assert {s: long[s] for s in range(1, 13)} == {s: short[s] for s in range(1, 13)}  # one run up to the branch
    assert long[16] != short[16]  # ... then the long run stays at the peak lr where the short one decays
    history = [json.loads(line) for line in (tmp_path / "branch" / "config-history.jsonl").read_text().splitlines()]
    assert history[-1]["step"] == 12 and "train.budget.steps" in history[-1]["changes"]
