"""Building blocks shared by the models. Shapes: B batch, T tokens, H hidden, N heads, D head dim."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS = {"gelu": F.gelu, "relu": F.relu, "silu": F.silu}


def make_norm(kind: str, dim: int, eps: float, bias: bool = True) -> nn.Module:
    if kind == "layernorm":
        return nn.LayerNorm(dim, eps=eps, bias=bias)
    if kind == "rmsnorm":
        return nn.RMSNorm(dim, eps=eps)
    raise ValueError(f"unknown norm '{kind}'")


def sinusoidal_table(length: int, dim: int) -> torch.Tensor:
    """(length, dim) table of Vaswani et al.: sin on even, cos on odd channels."""
    position = torch.arange(length, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(length, dim)
    table[:, 0::2] = torch.sin(position * freq)
    table[:, 1::2] = torch.cos(position * freq[: dim // 2])
    return table


class PositionEmbedding(nn.Module):
    """Absolute positions added to token embeddings: learned, sinusoidal, or scaled-sinusoidal
    (cramming: a fixed sinusoidal table times one learned scalar, initialised to 1/sqrt(H))."""

    def __init__(self, kind: str, max_length: int, dim: int):
        super().__init__()
        self.kind = kind
        if kind == "learned":
            self.table = nn.Parameter(torch.zeros(max_length, dim))
        elif kind in ("sinusoidal", "scaled-sinusoidal"):
            self.register_buffer("table", sinusoidal_table(max_length, dim), persistent=False)
            if kind == "scaled-sinusoidal":
                self.scale = nn.Parameter(torch.tensor(1.0 / math.sqrt(dim)))
        else:
            raise ValueError(f"unknown positions '{kind}'")

    def forward(self, seq_len: int) -> torch.Tensor:  # -> (T, H)
        table = self.table[:seq_len]
        return table * self.scale if self.kind == "scaled-sinusoidal" else table


class SelfAttention(nn.Module):
    """Multi-head self-attention with a fused QKV projection, through SDPA (flash kernels on GPU)."""

    def __init__(self, dim: int, num_heads: int, bias: bool, dropout: float):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"hidden size {dim} is not divisible by {num_heads} heads")
        self.num_heads = num_heads
        self.dropout = dropout
        self.qkv = nn.Linear(dim, 3 * dim, bias=bias)
        self.out = nn.Linear(dim, dim, bias=bias)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        B, T, H = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.num_heads, H // self.num_heads).permute(2, 0, 3, 1, 4)
        # q, k, v: (B, N, T, D); attn_mask: (B, 1, 1 or T, T) bool, True = may attend
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=self.dropout if self.training else 0.0
        )
        return self.out(y.transpose(1, 2).reshape(B, T, H))


class FeedForward(nn.Module):
    """Plain MLP (H -> I -> H) or gated (H -> I, split in halves, a * act(b), I/2 -> H), the
    latter being cramming's GELU-GLU."""

    def __init__(self, dim: int, inner: int, kind: str, activation: str, bias: bool):
        super().__init__()
        self.gated = kind == "glu"
        self.act = ACTIVATIONS[activation]
        self.up = nn.Linear(dim, inner, bias=bias)
        self.down = nn.Linear(inner // 2 if self.gated else inner, dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x)
        if self.gated:
            gate, value = h.chunk(2, dim=-1)  # cramming: value * act(gate)
            h = value * self.act(gate)
        else:
            h = self.act(h)
        return self.down(h)


def init_weights(module: nn.Module, std: float) -> None:
    """normal(0, std) for linear and embedding weights, zeros for biases (BERT's scheme)."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=std)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
