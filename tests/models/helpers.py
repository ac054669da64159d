"""Tiny model builders shared by the model tests."""

from __future__ import annotations

import torch

from cramlm.config.loader import load_preset
from cramlm.config.registry import config_class
from cramlm.models import build_model
from cramlm.models.config import TransformerConfig

VOCAB = 300
# small widths applied to every preset: same choices, seconds on 2 cores
TINY = dict(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, max_seq_length=64, dropout=0.0, attention_dropout=0.0)


def preset(name: str, **overrides) -> TransformerConfig:
    data = dict(load_preset("arch", name))
    data.update(TINY)
    if data.get("num_kv_heads"):
        data["num_kv_heads"] = 2
    data.update(overrides)
    return config_class("model", data["type"]).model_validate(data)


def tiny_model(name: str, seed: int = 0, **overrides) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = build_model(preset(name, **overrides), VOCAB).eval()
    # perturb norms and biases away from 1/0 so that a wrongly mapped one shows up in comparisons
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.ndim == 1 or n.endswith("scale"):
                p.add_(0.1 * torch.randn_like(p))
    return model


def random_ids(B: int = 2, T: int = 16, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(5, VOCAB, (B, T), generator=g)
