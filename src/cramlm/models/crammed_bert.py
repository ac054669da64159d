"""crammed-bert (Geiping & Goldstein, 2022): a pre-norm BERT without biases, with a GELU-GLU
feed-forward, scaled sinusoidal positions and an MLM head evaluated only at masked positions.
Every architectural choice is a config field, so the original BERT is a preset away."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from cramlm.config.registry import register
from cramlm.models.base import ModelConfig
from cramlm.models.layers import FeedForward, PositionEmbedding, SelfAttention, init_weights, make_norm

IGNORE_INDEX = -100  # label value of positions that carry no MLM target


class CrammedBertConfig(ModelConfig):
    type: Literal["crammed-bert"] = "crammed-bert"
    hidden_size: int = 768
    num_layers: int = 16
    num_heads: int = 12
    intermediate_size: int = 3072  # FFN up-projection width; with ffn=glu the gated half is 1536
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    norm_eps: float = 1e-12
    norm_scheme: Literal["pre", "post"] = "pre"
    final_norm: bool = True  # a norm after the last block (pre-norm models need it)
    embedding_norm: bool = True  # a norm right after token + position embedding
    ffn: Literal["glu", "plain"] = "glu"
    activation: Literal["gelu", "relu", "silu"] = "gelu"
    bias: bool = False  # biases in linear layers
    positions: Literal["scaled-sinusoidal", "sinusoidal", "learned"] = "scaled-sinusoidal"
    tie_embeddings: bool = True  # MLM decoder shares the token-embedding matrix
    sparse_prediction: bool = True  # run the MLM head only where labels != -100
    dropout: float = 0.0  # cramming pretrains without dropout; fine-tuning sets it
    attention_dropout: float = 0.0
    init_std: float = 0.02


class Block(nn.Module):
    def __init__(self, cfg: CrammedBertConfig):
        super().__init__()
        self.pre_norm = cfg.norm_scheme == "pre"
        self.norm1 = make_norm(cfg.norm, cfg.hidden_size, cfg.norm_eps, cfg.bias)
        self.attn = SelfAttention(cfg.hidden_size, cfg.num_heads, cfg.bias, cfg.attention_dropout)
        self.norm2 = make_norm(cfg.norm, cfg.hidden_size, cfg.norm_eps, cfg.bias)
        self.ffn = FeedForward(cfg.hidden_size, cfg.intermediate_size, cfg.ffn, cfg.activation, cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        if self.pre_norm:
            x = x + self.dropout(self.attn(self.norm1(x), attn_mask))
            return x + self.dropout(self.ffn(self.norm2(x)))
        x = self.norm1(x + self.dropout(self.attn(x, attn_mask)))
        return self.norm2(x + self.dropout(self.ffn(x)))


class CrammedBert(nn.Module):
    """Encoder + MLM head. ``encode`` gives hidden states for downstream heads."""

    def __init__(self, cfg: CrammedBertConfig, vocab_size: int):
        super().__init__()
        self.cfg = cfg
        self.hidden_size = cfg.hidden_size
        self.vocab_size = vocab_size
        H = cfg.hidden_size
        self.tokens = nn.Embedding(vocab_size, H)
        self.positions = PositionEmbedding(cfg.positions, cfg.max_seq_length, H)
        self.embedding_norm = make_norm(cfg.norm, H, cfg.norm_eps, cfg.bias) if cfg.embedding_norm else nn.Identity()
        self.embedding_dropout = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.final_norm = make_norm(cfg.norm, H, cfg.norm_eps, cfg.bias) if cfg.final_norm else nn.Identity()
        # MLM head: dense -> activation -> norm -> decoder to the vocabulary
        self.head_dense = nn.Linear(H, H, bias=cfg.bias)
        self.head_norm = make_norm(cfg.norm, H, cfg.norm_eps, cfg.bias)
        self.decoder = nn.Linear(H, vocab_size, bias=cfg.bias)
        init_weights(self, cfg.init_std)
        if cfg.tie_embeddings:
            self.decoder.weight = self.tokens.weight

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        B, T = input_ids.shape
        if T > self.cfg.max_seq_length:
            raise ValueError(f"sequence of {T} tokens exceeds arch.max_seq_length={self.cfg.max_seq_length}")
        x = self.tokens(input_ids) + self.positions(T)  # (B, T, H)
        x = self.embedding_dropout(self.embedding_norm(x))
        # padding mask (B, T) -> (B, 1, 1, T); None keeps SDPA on its fastest path
        mask = None if attention_mask is None else attention_mask[:, None, None, :].bool()
        for block in self.blocks:
            x = block(x, mask)
        return self.final_norm(x)

    def mlm_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # (..., H) -> (..., V)
        h = self.head_norm(F.gelu(self.head_dense(hidden)))
        return self.decoder(h)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        hidden = self.encode(input_ids, attention_mask)  # (B, T, H)
        if labels is None:
            return {"logits": self.mlm_logits(hidden)}
        if self.cfg.sparse_prediction:
            # only the masked positions (about 25%) go through the head and the V-wide decoder
            targets = labels.view(-1)
            picked = targets != IGNORE_INDEX
            logits = self.mlm_logits(hidden.view(-1, self.hidden_size)[picked])  # (M, V)
            loss = F.cross_entropy(logits.float(), targets[picked])
            return {"loss": loss}
        logits = self.mlm_logits(hidden)  # (B, T, V)
        loss = F.cross_entropy(logits.float().view(-1, self.vocab_size), labels.view(-1), ignore_index=IGNORE_INDEX)
        return {"loss": loss, "logits": logits}


@register("model", "crammed-bert", CrammedBertConfig)
def build_crammed_bert(cfg: CrammedBertConfig, vocab_size: int) -> CrammedBert:
    return CrammedBert(cfg, vocab_size)
