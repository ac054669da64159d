"""Decoder-only language models: GPT-2 (learned positions, LayerNorm, GELU, biases) and a
llama-like decoder (RMSNorm, SwiGLU, RoPE, grouped-query attention, no biases). Both are the
same class; the registered types only change the defaults. The layers are in model.py, the
configs in config.py; this file is the registered causal-LM wrapper."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cramlm.config.registry import register
from cramlm.models.model import IGNORE_INDEX, Trunk, init_weights
from cramlm.models.config import GPT2Config, LlamaConfig, TransformerConfig, trunk_flops_per_token  # noqa: F401  (configs: torch-free there)


class CausalLM(nn.Module):
    """Decoder (model.Trunk, causal) + LM head (one linear layer). Forward arguments and outputs
    are CrammedBert's (see ``forward``); ``labels`` are the input ids themselves (or -100 where
    unscored): the model shifts them, so position t is scored on predicting token t + 1."""

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

    def encode(self, input_ids, attention_mask=None, position_ids=None, document_ids=None, token_type_ids=None) -> torch.Tensor:
        """(B, T) -> (B, T, H): the trunk's last hidden states."""
        return self.trunk(input_ids, attention_mask, position_ids, document_ids, token_type_ids)

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
