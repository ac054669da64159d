"""Mixed precision on the GPU: a bf16 autocast step and an fp16 step with GradScaler, both as a
bare step and through the trainer (`cramlm pretrain`), and the fused AdamW kernel."""

from __future__ import annotations

import json

import pytest
import torch

from cramlm.train.config import AdamWConfig
from cramlm.train.optim import build_optimizer
from cramlm.train.impl import autocast
from tests.gpu.helpers import WIDE, run_overrides
from tests.models.helpers import VOCAB, random_ids, tiny_model
from tests.train.helpers import losses, run_inprocess

pytestmark = pytest.mark.cuda


def mlm_batch(device: torch.device, B: int = 4, T: int = 32) -> dict[str, torch.Tensor]:
    ids = random_ids(B, T)
    labels = torch.full_like(ids, -100)
    labels[:, ::4] = ids[:, ::4]
    return {"input_ids": ids.to(device), "labels": labels.to(device)}


def test_bf16_autocast_step(device):
    model = tiny_model("crammed-bert-tiny", **WIDE).train().to(device)
    opt = build_optimizer(AdamWConfig(lr=1e-3), model)
    seen = []
    hook = model.trunk.blocks[0].attn.qkv.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    batch = mlm_batch(device)
    before = model.trunk.blocks[0].ffn.up.weight.detach().clone()
    with autocast(device, torch.bfloat16):
        loss = model(**batch)["loss"]
    hook.remove()
    assert seen == [torch.bfloat16]  # the matmuls ran in bf16 ...
    assert loss.dtype == torch.float32 and torch.isfinite(loss)  # ... the loss in fp32 (logits.float())
    loss.backward()
    assert all(p.grad.dtype == torch.float32 for p in model.parameters() if p.grad is not None)  # fp32 master weights
    opt.step()
    assert model.trunk.blocks[0].ffn.up.weight.dtype == torch.float32
    assert not torch.equal(before, model.trunk.blocks[0].ffn.up.weight)


def test_fp16_step_with_grad_scaler(device):
    model = tiny_model("crammed-bert-tiny", **WIDE).train().to(device)
    opt = build_optimizer(AdamWConfig(lr=1e-3), model)
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**16)
    batch = mlm_batch(device)
    before = [p.detach().clone() for p in model.parameters()]
    for _ in range(3):
        with autocast(device, torch.float16):
            loss = model(**batch)["loss"]
        assert torch.isfinite(loss)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        finite = all(torch.isfinite(g).all() for g in grads)
        scaler.step(opt)  # skipped, and the scale halved, when the scaled gradients overflowed
        scaler.update()
        opt.zero_grad(set_to_none=True)
    assert finite and scaler.get_scale() > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_pretrain_in_mixed_precision(precision, device, tmp_path):
    name = f"run-{precision}"
    summary = run_inprocess(tmp_path, name, *run_overrides(device, f"impl.precision={precision}"), "budget=null",
                            "train.budget.steps=6", "train.optim.lr=3e-3")
    got = losses(tmp_path / name)
    assert sorted(got) == [1, 2, 3, 4, 5, 6] and all(l == l and l < 20 for l in got.values())  # finite, not NaN
    assert summary["val_loss"] is not None and summary["val_loss"] < got[1]  # it learned something
    config = (tmp_path / name / "config.yaml").read_text()
    assert f"precision: {precision}" in config
    training = torch.load(tmp_path / name / "checkpoints" / "step-00000006" / "training.pt", weights_only=True)
    if precision == "fp16":
        assert training["scaler"] and training["scaler"]["scale"] > 0  # GradScaler on, its state checkpointed
    else:
        assert not training["scaler"]  # bf16 needs no loss scaling
    if device.type == "cuda":
        assert summary["peak_flops"] and summary["mfu"] is not None
        assert json.loads((tmp_path / name / "summary.json").read_text())["steps"] == 6


def test_fused_adamw_on_the_device(device):
    torch.manual_seed(0)
    model = tiny_model("llama-tiny", **WIDE).train().to(device)
    reference = tiny_model("llama-tiny", **WIDE).train().to(device)
    reference.load_state_dict(model.state_dict())
    fused = build_optimizer(AdamWConfig(lr=1e-2, weight_decay=0.1), model)
    assert fused.defaults["fused"] is True  # the default (fused=None) picks the fused kernel
    plain = build_optimizer(AdamWConfig(lr=1e-2, weight_decay=0.1, fused=False), reference)
    assert not plain.defaults["fused"]
    ids = random_ids(4, 16).to(device)
    for _ in range(3):
        for m, opt in ((model, fused), (reference, plain)):
            m(ids, labels=ids)["loss"].backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    for (n, a), b in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=n)
    state = fused.state[next(iter(model.parameters()))]
    assert state["exp_avg"].device.type == device.type and state["step"].device.type == device.type
