"""Optimizers, built from registered configs, with no weight decay on biases and norms.

AdamW (fused kernel on CPU and GPU), Adam, Lion, Adafactor and SGD. Adding one = a config class and a
registered builder that takes the parameter groups."""

from __future__ import annotations

import torch
from torch import nn

from cramlm.config.registry import register
# the configs live torch-free in train/config.py (validating a config imports no torch)
from cramlm.train.config import AdafactorConfig, AdamConfig, AdamWConfig, LionConfig, OptimizerConfig, SGDConfig


def param_groups(model: nn.Module, cfg: OptimizerConfig) -> list[dict]:
    """Decay matrices; never biases, norm weights or scalars (any parameter with ndim < 2).
    Tied parameters (decoder = embedding) appear once."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    decay, no_decay, seen = [], [], set()
    for p in model.parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        skip = p.ndim < 2 or (id(p) in embeddings and not cfg.decay_embeddings)
        (no_decay if skip else decay).append(p)
    return [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _fused_supported(groups: list[dict]) -> bool:
    """torch's fused Adam(W) kernels run on CPU and CUDA (on a CPU about 8x faster than the default
    per-tensor loop); sharded (DTensor) parameters keep torch's default implementation."""
    from torch.distributed.tensor import DTensor

    params = [p for g in groups for p in g["params"]]
    return all(p.device.type in ("cpu", "cuda") and p.is_floating_point() and not isinstance(p, DTensor) for p in params)


@register("optimizer", "adamw", AdamWConfig)
def build_adamw(cfg: AdamWConfig, groups: list[dict]) -> torch.optim.Optimizer:
    return _adam(torch.optim.AdamW, cfg, groups)


def _adam(cls, cfg, groups: list[dict]) -> torch.optim.Optimizer:
    fused = _fused_supported(groups) if cfg.fused is None else cfg.fused
    return cls(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, fused=fused or None)


@register("optimizer", "adam", AdamConfig)
def build_adam(cfg: AdamConfig, groups: list[dict]) -> torch.optim.Optimizer:
    return _adam(torch.optim.Adam, cfg, groups)


@register("optimizer", "sgd", SGDConfig)
def build_sgd(cfg: SGDConfig, groups: list[dict]) -> torch.optim.Optimizer:
    return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov)


@register("optimizer", "adafactor", AdafactorConfig)
def build_adafactor(cfg: AdafactorConfig, groups: list[dict]) -> torch.optim.Optimizer:
    return torch.optim.Adafactor(groups, lr=cfg.lr, beta2_decay=cfg.beta2_decay, eps=cfg.eps)


class Lion(torch.optim.Optimizer):
    """Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"): the update is the
    sign of an interpolation of momentum and gradient; decoupled weight decay. Use ~3-10x smaller
    lr than AdamW."""

    def __init__(self, params, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99), weight_decay: float = 0.0):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p)
                m = state["exp_avg"]
                p.mul_(1 - group["lr"] * group["weight_decay"])
                update = (m * beta1 + p.grad * (1 - beta1)).sign_()
                p.add_(update, alpha=-group["lr"])
                m.mul_(beta2).add_(p.grad, alpha=1 - beta2)
        return loss


@register("optimizer", "lion", LionConfig)
def build_lion(cfg: LionConfig, groups: list[dict]) -> torch.optim.Optimizer:
    return Lion(groups, lr=cfg.lr, betas=cfg.betas)


def build_optimizer(cfg: OptimizerConfig, model: nn.Module) -> torch.optim.Optimizer:
    from cramlm.config.registry import build

    return build("optimizer", cfg, param_groups(model, cfg))
