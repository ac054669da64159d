"""Optimizers, built from registered configs, with no weight decay on biases and norms."""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
from torch import nn

from cramlm.config.base import ComponentConfig
from cramlm.config.registry import register


class OptimizerConfig(ComponentConfig):
    kind: ClassVar[str] = "optimizer"
    lr: float = 1e-3
    weight_decay: float = 0.01
    decay_embeddings: bool = True  # apply weight decay to embedding matrices too


def param_groups(model: nn.Module, cfg: OptimizerConfig) -> list[dict]:
    """Decay matrices; never biases, norm weights or scalars (any parameter with ndim < 2)."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    decay, no_decay, seen = [], [], set()
    for p in model.parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        skip = p.ndim < 2 or (id(p) in embeddings and not cfg.decay_embeddings)
        (no_decay if skip else decay).append(p)
    return [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


class AdamWConfig(OptimizerConfig):
    type: Literal["adamw"] = "adamw"
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-12


@register("optimizer", "adamw", AdamWConfig)
def build_adamw(cfg: AdamWConfig, model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(param_groups(model, cfg), lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)


def build_optimizer(cfg: OptimizerConfig, model: nn.Module) -> torch.optim.Optimizer:
    from cramlm.config.registry import build

    return build("optimizer", cfg, model)
