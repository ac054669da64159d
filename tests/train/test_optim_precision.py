"""Optimizers and parameter groups, non-finite losses (skip / roll back / raise), activation
checkpointing and precision settings."""

import json

import pytest
import torch
from torch import nn

from cramlm.config.registry import config_class
from cramlm.train.optim import build_optimizer, param_groups
from cramlm.train.impl import ImplConfig, autocast_dtype
from cramlm.train.parallelize import compile_model

from .helpers import CAUSAL, losses, records, run_inprocess


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.lin = nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)
        self.out = nn.Linear(16, 50, bias=False)
        self.out.weight = self.emb.weight  # tied

    def forward(self, x):
        return self.out(self.norm(torch.relu(self.lin(self.emb(x)))))


def test_no_decay_on_norms_biases_and_optional_embeddings():
    net = Net()
    cfg = config_class("optimizer", "adamw")(type="adamw", weight_decay=0.1)
    decay, no_decay = param_groups(net, cfg)
    assert {id(p) for p in decay["params"]} == {id(net.emb.weight), id(net.lin.weight)}  # tied matrix once
    assert {id(p) for p in no_decay["params"]} == {id(net.lin.bias), id(net.norm.weight), id(net.norm.bias)}
    cfg.decay_embeddings = False
    decay, no_decay = param_groups(net, cfg)
    assert [id(p) for p in decay["params"]] == [id(net.lin.weight)] and no_decay["weight_decay"] == 0.0
    # a learned position table is an embedding too (was: decayed under decay_embeddings=false)
    from tests.models.helpers import tiny_model

    gpt = tiny_model("gpt2-tiny")
    assert gpt.trunk.positions.kind == "learned"
    decay, _ = param_groups(gpt, cfg)
    assert not {id(gpt.trunk.positions.table), id(gpt.trunk.tokens.weight)} & {id(p) for p in decay["params"]}
    cfg.decay_embeddings = True
    decay, _ = param_groups(gpt, cfg)
    assert {id(gpt.trunk.positions.table), id(gpt.trunk.tokens.weight)} <= {id(p) for p in decay["params"]}


@pytest.mark.parametrize("name,lr", [("adamw", 1e-2), ("adam", 1e-2), ("lion", 1e-3), ("adafactor", 1e-2), ("sgd", 0.5)])
def test_each_optimizer_learns(name, lr):
    torch.manual_seed(0)
    net = Net()
    opt = build_optimizer(config_class("optimizer", name)(type=name, lr=lr), net)
    x = torch.randint(0, 50, (64,))
    first = None
    for _ in range(30):
        loss = nn.functional.cross_entropy(net(x), x)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.9 * first, (name, first, loss.item())


def test_nonfinite_skip_rollback_raise(tmp_path):
    base = [*CAUSAL, "budget=null", "train.budget.steps=6", "train.checkpoint_every=2", "arch.nan_at=[5]"]  # call 5 = step 4
    clean = losses(run_inprocess(tmp_path, "clean", *base[:-1]) and tmp_path / "clean")
    skipped = run_inprocess(tmp_path, "skip", *base)
    assert skipped["skipped_steps"] == 1 and skipped["steps"] == 6
    event = records(tmp_path / "skip", "event")[0]
    assert event["event"] == "nonfinite" and "step 4" in event["message"] and "skipped" in event["message"]
    assert sorted(losses(tmp_path / "skip")) == [1, 2, 3, 5, 6]  # step 4 logged as an event, not a loss
    assert all(losses(tmp_path / "skip")[s] == clean[s] for s in (1, 2, 3))
    rolled = run_inprocess(tmp_path, "rollback", *base, "train.on_nonfinite=rollback")
    assert rolled["rollbacks"] == 1 and "rolled back" in records(tmp_path / "rollback", "event")[0]["message"]
    with pytest.raises(FloatingPointError, match="step 4"):
        run_inprocess(tmp_path, "raise", *base, "train.on_nonfinite=raise")


def test_a_rollback_skips_a_damaged_checkpoint_as_resume_auto_does(tmp_path, monkeypatch, capsys):
    """The rollback's checkpoint is verified like a resume's: a damaged newest one is set aside and
    the next older one is loaded (was: loaded unchecked)."""
    from cramlm.train import checkpoint as ckpt

    drop = ckpt.drop_old_checkpoints

    def damage_step_3(root, keep):  # after each write: step 3's weights get one byte changed
        if (root / "step-00000003").is_dir() and not (root / "damaged-once").exists():
            weights = root / "step-00000003" / "model.safetensors"
            data = bytearray(weights.read_bytes())
            data[-1] ^= 1
            weights.write_bytes(bytes(data))
            (root / "damaged-once").touch()
        return drop(root, keep)

    monkeypatch.setattr(ckpt, "drop_old_checkpoints", damage_step_3)
    base = [*CAUSAL, "budget=null", "train.budget.steps=6", "train.checkpoint_every=1", "train.keep_checkpoints=5",
            "arch.nan_at=[5]", "train.on_nonfinite=rollback"]  # call 5 = step 4
    rolled = run_inprocess(tmp_path, "rb", *base)
    assert rolled["rollbacks"] == 1
    assert "rolled back weights and optimizer to step-00000002" in records(tmp_path / "rb", "event")[0]["message"]
    assert (tmp_path / "rb" / "checkpoints" / "step-00000003.damaged").is_dir()
    assert "checkpoint step-00000003 is damaged" in capsys.readouterr().out


def test_activation_checkpointing_changes_nothing_but_memory(tmp_path):
    args = ["budget=null", "train.budget.steps=3"]
    plain = losses(run_inprocess(tmp_path, "plain", *args) and tmp_path / "plain")
    ac = losses(run_inprocess(tmp_path, "ac", *args, "impl.activation_checkpointing=true") and tmp_path / "ac")
    assert ac == plain


def test_precision_and_compile_options():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert autocast_dtype(ImplConfig(precision="fp32"), cpu) is None  # auto: tests/train/test_hardware.py
    assert autocast_dtype(ImplConfig(precision="bf16"), cuda) is torch.bfloat16
    assert autocast_dtype(ImplConfig(precision="fp16"), cuda) is torch.float16
    import torch._inductor.config as inductor

    old = inductor.coordinate_descent_tuning
    try:
        compiled = compile_model(nn.Linear(2, 2), ImplConfig(compile=True, inductor={"coordinate_descent_tuning": not old}))
        assert inductor.coordinate_descent_tuning is (not old) and hasattr(compiled, "_orig_mod")
    finally:
        inductor.coordinate_descent_tuning = old
    with pytest.raises(ValueError, match="no such"):
        compile_model(nn.Linear(2, 2), ImplConfig(inductor={"not_an_option": 1}))


def test_tensorboard_and_wandb_sinks(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    extra = ["budget=null", "train.budget.steps=2", "impl.tensorboard=true"]
    try:
        import wandb  # noqa: F401

        monkeypatch.setenv("WANDB_SILENT", "true")
        extra.append("impl.wandb=true")  # offline by default
    except ImportError:
        wandb = None
    run_inprocess(tmp_path, "tb", *extra)
    events = EventAccumulator(str(tmp_path / "tb"))  # event files in the run folder itself
    events.Reload()
    assert {"train/loss", "train/tokens_per_second", "val/val_loss"} <= set(events.Tags()["scalars"])
    if wandb is not None:
        assert list((tmp_path / "tb" / "wandb").glob("offline-run-*"))


def test_an_fp16_loss_scale_overflow_is_not_a_nonfinite_step(tmp_path, monkeypatch):
    """fp16's GradScaler overflows now and then by design (it grows the scale until it does): the
    scaler skips that update and backs off. With on_nonfinite=raise such a run must go on (it stopped
    at the first overflow: a finite loss, an infinite gradient norm). On the CPU, fp16 autocast and
    the GradScaler are real; a huge initial scale makes the first steps overflow."""
    import functools

    import cramlm.train.step as step_module

    monkeypatch.setattr(step_module.torch.amp, "GradScaler", functools.partial(torch.amp.GradScaler, init_scale=2.0**40))
    summary = run_inprocess(tmp_path, "fp16", *CAUSAL, "budget=null", "train.budget.steps=40", "impl.precision=fp16",
                            "train.on_nonfinite=raise", "train.grad_clip=1.0", "train.log_every=1")
    assert summary["steps"] == 40 and not summary.get("skipped_steps")

    def strict(constant):
        raise ValueError(f"metrics.jsonl holds {constant}: not JSON")

    logged = [json.loads(line, parse_constant=strict) for line in (tmp_path / "fp16" / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("kind") == "train" and r["grad_norm"] is None for r in logged)  # an overflow step's norm: null
    assert not [r for r in records(tmp_path / "fp16", "event") if r["event"] == "nonfinite"]
    import torch as _torch

    scale = _torch.load(tmp_path / "fp16" / "checkpoints" / "step-00000040" / "training.pt", weights_only=True)["scaler"]["scale"]
    assert scale < 2.0**40  # it overflowed and backed off
