"""Decoder-only language models: GPT-2 (learned positions, LayerNorm, GELU, biases) and a
llama-like decoder (RMSNorm, SwiGLU, RoPE, grouped-query attention, no biases). Both are the
same class; the registered types only change the defaults."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cramlm.config.registry import register
from cramlm.models.layers import IGNORE_INDEX, Trunk, init_weights
from cramlm.models.transformer import GPT2Config, LlamaConfig, TransformerConfig, trunk_flops_per_token  # noqa: F401  (configs: torch-free there)


class CausalLM(nn.Module):
    """Decoder + LM head. ``labels`` are the input ids themselves (or -100 where unscored): the
    model shifts them, so position t is scored on predicting token t + 1.

    Batch keys: input_ids (B, T); optional labels (B, T); attention_mask (B, T) 1 = token,
    0 = padding; position_ids / document_ids (B, T) for packed documents (see docs/models.md)."""

    def __init__(self, cfg: TransformerConfig, vocab_size: int):
        super().__init__()
        self.cfg = cfg
        self.hidden_size = cfg.hidden_size
        self.vocab_size = vocab_size
        self.trunk = Trunk(cfg, vocab_size, causal=True)
        self.lm_head = nn.Linear(cfg.hidden_size, vocab_size, bias=False)
        init_weights(self, cfg.init_std, cfg.init, cfg.num_layers)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.trunk.tokens.weight

    @property
    def tokens(self) -> nn.Embedding:
        return self.trunk.tokens

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **positions) -> torch.Tensor:
        return self.trunk(input_ids, attention_mask, **positions)  # (B, T, H)

    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        **positions,
    ) -> dict[str, torch.Tensor]:
        logits = self.lm_head(self.encode(input_ids, attention_mask, **positions))  # (B, T, V)
        out = {"logits": logits}
        if labels is not None:
            shifted = logits[:, :-1].float().reshape(-1, self.vocab_size)
            out["loss"] = F.cross_entropy(shifted, labels[:, 1:].reshape(-1), ignore_index=IGNORE_INDEX)
        return out

    def forward_flops_per_token(self, seq_len: int) -> float:
        return trunk_flops_per_token(self.cfg, seq_len) + 2 * self.hidden_size * self.vocab_size

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token, forward + backward (= 3 x forward)."""
        return 3 * self.forward_flops_per_token(seq_len)


@register("model", "gpt2", GPT2Config)
def build_gpt2(cfg: GPT2Config, vocab_size: int) -> CausalLM:
    return CausalLM(cfg, vocab_size)


@register("model", "llama", LlamaConfig)
def build_llama(cfg: LlamaConfig, vocab_size: int) -> CausalLM:
    return CausalLM(cfg, vocab_size)
