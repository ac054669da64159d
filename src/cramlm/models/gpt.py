"""Decoder-only language models: GPT-2 (learned positions, LayerNorm, GELU, biases) and a
llama-like decoder (RMSNorm, SwiGLU, RoPE, grouped-query attention, no biases). Both are the
same class; the registered types only change the defaults. The layers are in model.py, the
configs in config.py; this file is the registered causal-LM wrapper."""

from __future__ import annotations

import torch
from torch import nn

from cramlm.config.registry import register
from cramlm.models.config import GPT2Config, LlamaConfig, TransformerConfig, trunk_flops_per_token  # configs: torch-free there
from cramlm.models.lm import TransformerLM
from cramlm.models.model import IGNORE_INDEX, linear_cross_entropy, soft_cap


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
        """{"loss", "logits"}, as CrammedBert's: without labels, loss None and logits (B, T, V); with
        labels, loss = mean next-token cross-entropy over the scored positions and logits None: the
        head and the loss are fused (model.linear_cross_entropy) over the scored positions, so the
        (B, T, V) logits (and a float copy) never exist."""
        hidden = self.encode(input_ids, attention_mask, position_ids, document_ids, token_type_ids)  # (B, T, H)
        if labels is None:
            return {"loss": None, "logits": soft_cap(self.lm_head(hidden), self.cfg.logit_softcap)}  # (B, T, V)
        targets = labels[:, 1:].reshape(-1)  # (B*(T-1),) position t predicts token t + 1
        scored = targets != IGNORE_INDEX
        hidden = hidden[:, :-1].reshape(-1, self.hidden_size)[scored]  # (M, H)
        loss = linear_cross_entropy(hidden, self.lm_head.weight, None, targets[scored], softcap=self.cfg.logit_softcap)
        return {"loss": loss, "logits": None}

    def forward_flops_per_token(self, seq_len: int, predicted_fraction: float = 1.0) -> float:
        """Forward FLOPs per token: the trunk, and the head on the T - 1 positions that predict a
        next token (the last one has none; unscored padding is counted too). ``predicted_fraction``
        (what MLMs score) changes nothing here."""
        head = 2 * self.hidden_size * self.vocab_size * (seq_len - 1) / seq_len
        return trunk_flops_per_token(self.cfg, seq_len) + head


@register("model", "gpt2", GPT2Config)
def build_gpt2(cfg: GPT2Config, vocab_size: int) -> CausalLM:
    return CausalLM(cfg, vocab_size)


@register("model", "llama", LlamaConfig)
def build_llama(cfg: LlamaConfig, vocab_size: int) -> CausalLM:
    return CausalLM(cfg, vocab_size)
