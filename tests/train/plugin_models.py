"""A tiny causal LM registered from a test module through the plugin mechanism
(``plugins=[tests.train.plugin_models] arch.type=tiny-causal``), with fault injection:
``fail_rank``/``fail_after`` make one process raise, ``nan_at`` makes chosen forward calls
return a NaN loss."""

from __future__ import annotations

import os
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import nn

from cramlm.config.registry import register
from cramlm.models.base import ModelConfig


class TinyCausalConfig(ModelConfig):
    type: Literal["tiny-causal"] = "tiny-causal"
    objective: ClassVar[str] = "clm"
    hidden_size: int = 32
    num_layers: int = 2
    num_heads: int = 2
    intermediate_size: int = 64
    fail_rank: int | None = None  # this RANK raises after `fail_after` forward calls
    fail_after: int = 3
    nan_at: list[int] = []  # training-mode forward calls (1-based; the FLOP count is call 1) whose loss is NaN


class TinyCausal(nn.Module):
    def __init__(self, cfg: TinyCausalConfig, vocab_size: int):
        super().__init__()
        self.cfg = cfg
        self.calls = 0
        H = cfg.hidden_size
        self.tokens = nn.Embedding(vocab_size, H)
        self.positions = nn.Parameter(torch.zeros(cfg.max_seq_length, H))
        # a non-persistent buffer and no reset_buffers(), as many a plugin's (e.g. transformers' position_ids)
        self.register_buffer("one", torch.ones(()), persistent=False)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(H, cfg.num_heads, cfg.intermediate_size, dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(cfg.num_layers)
        )
        self.norm = nn.LayerNorm(H)
        self.head = nn.Linear(H, vocab_size, bias=False)
        nn.init.normal_(self.tokens.weight, std=0.02)
        self.head.weight = self.tokens.weight  # tied: stored once in safetensors

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None, attention_mask=None):
        self.calls += self.training  # validation forwards do not count
        if self.cfg.fail_rank is not None and int(os.environ.get("RANK", "0")) == self.cfg.fail_rank:
            if self.calls > self.cfg.fail_after:
                raise RuntimeError(f"injected failure on rank {self.cfg.fail_rank}")
        B, T = input_ids.shape
        x = (self.tokens(input_ids) + self.positions[:T]) * self.one  # (B, T, H)
        mask = nn.Transformer.generate_square_subsequent_mask(T, device=x.device)
        for block in self.blocks:
            x = block(x, src_mask=mask, is_causal=True)
        logits = self.head(self.norm(x))  # (B, T, V)
        out = {"logits": logits}
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)).float(), labels[:, 1:].reshape(-1))
            if self.calls in self.cfg.nan_at:
                loss = loss * float("nan")
            out["loss"] = loss
        return out


@register("model", "tiny-causal", TinyCausalConfig)
def build_tiny_causal(cfg: TinyCausalConfig, vocab_size: int) -> TinyCausal:
    return TinyCausal(cfg, vocab_size)


class TinyMaskedConfig(TinyCausalConfig):
    """The same blocks as a masked LM's config (``arch.type=tiny-masked``): an encoder that is not
    crammed-bert, for the objectives that build on crammed-bert alone (rtd, hybrid)."""

    type: Literal["tiny-masked"] = "tiny-masked"  # type: ignore[assignment]
    objective: ClassVar[str] = "mlm"


@register("model", "tiny-masked", TinyMaskedConfig)
def build_tiny_masked(cfg: TinyMaskedConfig, vocab_size: int) -> TinyCausal:
    return TinyCausal(cfg, vocab_size)  # bidirectional use is the caller's: configs are what the tests check
