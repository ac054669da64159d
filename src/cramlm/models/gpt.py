"""Decoder-only language models: GPT-2 (learned positions, LayerNorm, GELU, biases) and a
llama-like decoder (RMSNorm, SwiGLU, RoPE, grouped-query attention, no biases). Both are the
same class; the registered types only change the defaults. The layers are in model.py, the
configs in config.py; this file is the registered causal-LM wrapper."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cramlm.config.registry import register
from cramlm.models.config import GPT2Config, LlamaConfig, TransformerConfig, trunk_flops_per_token  # configs: torch-free there
from cramlm.models.lm import TransformerLM
from cramlm.models.model import IGNORE_INDEX


class CausalLM(TransformerLM):
    """Decoder (model.Trunk, causal) + LM head (one linear layer). Forward arguments and outputs
    are CrammedBert's (see ``forward``); ``labels`` are the input ids themselves (or -100 where
    unscored): the model shifts them, so position t is scored on predicting token t + 1."""

    causal = True

    def __init__(self, cfg: TransformerConfig, vocab_size: int):
        super().__init__(cfg, vocab_size)
        self.lm_head = nn.Linear(cfg.hidden_size, vocab_size, bias=False)
        self.init_and_tie(self.lm_head)

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T)
        attention_mask: torch.Tensor | None = None,  # (B, T) 1 = token, 0 = padding
        labels: torch.Tensor | None = None,  # (B, T) unshifted: input_ids, -100 where unscored
        position_ids: torch.Tensor | None = None,  # (B, T); default: from document_ids, else 0..T-1
        document_ids: torch.Tensor | None = None,  # (B, T) packed documents: attention stays inside one
        token_type_ids: torch.Tensor | None = None,  # (B, T) when type_vocab_size > 0
    ) -> dict[str, torch.Tensor | None]:
        """{"loss", "logits"}: loss = mean next-token cross-entropy over the scored positions (None
        without labels); logits (B, T, V), always."""
        hidden = self.encode(input_ids, attention_mask, position_ids, document_ids, token_type_ids)  # (B, T, H)
        logits = self.lm_head(hidden)  # (B, T, V)
        loss = None
        if labels is not None:
            shifted = logits[:, :-1].float().reshape(-1, self.vocab_size)  # (B*(T-1), V)
            loss = F.cross_entropy(shifted, labels[:, 1:].reshape(-1), ignore_index=IGNORE_INDEX)
        return {"loss": loss, "logits": logits}

    def forward_flops_per_token(self, seq_len: int, predicted_fraction: float = 1.0) -> float:
        """Forward FLOPs per token; the LM head runs on every position, so ``predicted_fraction``
        (what MLMs score) changes nothing here."""
        return trunk_flops_per_token(self.cfg, seq_len) + 2 * self.hidden_size * self.vocab_size


@register("model", "gpt2", GPT2Config)
def build_gpt2(cfg: GPT2Config, vocab_size: int) -> CausalLM:
    return CausalLM(cfg, vocab_size)


@register("model", "llama", LlamaConfig)
def build_llama(cfg: LlamaConfig, vocab_size: int) -> CausalLM:
    return CausalLM(cfg, vocab_size)
