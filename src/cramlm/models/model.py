"""The transformer: one file, read top to bottom (config, trunk, block, attention, FFN, heads,
init). crammed_bert.py and gpt.py wrap it into the registered models; heads.py adds task heads.

Shapes: B batch, T tokens, H hidden, N query heads, K key/value heads, D head dim (H / N),
I FFN inner width, V vocabulary, M scored positions.

This file imports nothing from cramlm: `cramlm export hf` copies it verbatim into the remote-code
package of variants that no stock transformers class matches (then hf_modeling.py's wrappers), so
exported and trained models run the very same code.
"""

from __future__ import annotations

import math
from functools import cache, partial

import torch
import torch.nn.functional as F
from torch import nn

try:  # FlexAttention (torch >= 2.5): document masks as block masks, no dense (B, 1, T, T) tensor
    from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention
except ImportError:  # older torch: packed documents use the dense SDPA mask
    BlockMask = create_block_mask = flex_attention = None

# = cramlm.constants.IGNORE_INDEX, restated: this file is copied verbatim into remote-code exports
IGNORE_INDEX = -100  # label value of positions that carry no target


# ---- config --------------------------------------------------------------------------------------
# The config: ``cfg`` everywhere below is anything with the fields of
# ``cramlm.models.config.TransformerConfig`` (the torch-free pydantic configs; in a remote-code
# export a SimpleNamespace of the same fields). Every architectural choice is one of those fields.


# ---- trunk: embeddings -> blocks -> final norm ---------------------------------------------------

class Trunk(nn.Module):
    """Embeddings -> blocks -> final norm, for encoders (bidirectional) and decoders (causal)."""

    def __init__(self, cfg, vocab_size: int, causal: bool):
        super().__init__()
        self.cfg, self.causal = cfg, causal
        # How attention keeps packed documents apart (``document_ids``), set from outside
        # (impl.document_attention_kernel, train/parallelize.py). "auto": FlexAttention with a block mask on
        # CUDA past one 128-token block (a dense boolean mask forfeits SDPA's flash kernel; the block mask
        # skips the blocks between documents; see flex_pays), the dense SDPA mask elsewhere; "flex" /
        # "dense" force one ("flex" on a CPU runs torch's unfused reference: for tests, not for speed).
        self.document_kernel = "auto"
        H = cfg.hidden_size
        self.tokens = nn.Embedding(vocab_size, H)
        self.token_types = nn.Embedding(cfg.type_vocab_size, H) if cfg.type_vocab_size else None
        rope = cfg.positions == "rope"
        self.positions = None if rope or cfg.positions == "none" else PositionEmbedding(cfg.positions, cfg.max_seq_length, H)
        self.rotary = Rotary(H // cfg.num_heads, cfg.rope_theta) if rope else None
        self.embedding_norm = make_norm(cfg.norm, H, cfg.norm_eps, cfg.norm_bias) if cfg.embedding_norm else nn.Identity()
        self.embedding_dropout = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.num_layers))
        k = getattr(cfg, "value_embeddings", 0)  # (configs from before the field: none)
        kv_width = (cfg.num_kv_heads or cfg.num_heads) * (H // cfg.num_heads)
        self.value_embeds = nn.ModuleList(nn.Embedding(vocab_size, kv_width) for _ in range(k)) if k else None
        self.value_table = value_tables(cfg)
        self.final_norm = make_norm(cfg.norm, H, cfg.norm_eps, cfg.norm_bias) if cfg.final_norm else nn.Identity()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        document_ids: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        causal: bool | torch.Tensor | None = None,  # this forward's attention where not the trunk's own; (B,) bool: per row
    ) -> torch.Tensor:  # (B, T) -> (B, T, H)
        B, T = input_ids.shape
        if T > self.cfg.max_seq_length:
            raise ValueError(f"sequence of {T} tokens exceeds arch.max_seq_length={self.cfg.max_seq_length}")
        if position_ids is None:
            if document_ids is not None:
                position_ids = positions_from_documents(document_ids)
            else:
                position_ids = torch.arange(T, device=input_ids.device)[None]  # (1, T)
        x = self.tokens(input_ids)  # (B, T, H)
        if self.positions is not None:
            x = x + self.positions(position_ids)
        if self.token_types is not None:
            x = x + self.token_types(torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids)
        x = self.embedding_dropout(self.embedding_norm(x))
        rotary = self.rotary(position_ids) if self.rotary is not None else None
        dropout = self.cfg.attention_dropout if self.training else 0.0
        flex = use_block_mask(document_ids, self.cfg.hidden_size // self.cfg.num_heads, dropout, self.document_kernel)
        if isinstance(causal, torch.Tensor):  # causal rows beside bidirectional ones (GPT-BERT's two modes)
            mask, is_causal = row_causal_mask(causal, attention_mask, document_ids, T), False
        else:
            causal = self.causal if causal is None else causal
            mask, is_causal = attention_mask_for(attention_mask, document_ids, causal, T, block_mask=flex)
        values = [table(input_ids) for table in self.value_embeds] if self.value_embeds is not None else []  # (B, T, K*D) each
        for block, table in zip(self.blocks, self.value_table):
            x = block(x, mask, rotary, is_causal, None if table is None else values[table])
        return self.final_norm(x)


def value_tables(cfg) -> list[int | None]:
    """Per layer, the value-embedding table it adds to its attention values, or None: table i feeds
    layers i and L-1-i (modded-nanogpt's U-net order)."""
    k, L = getattr(cfg, "value_embeddings", 0), cfg.num_layers
    return [i if i < k else (L - 1 - i if L - 1 - i < k else None) for i in range(L)]


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

    def reset_buffers(self) -> None:
        """The sinusoid table again, in place (after ``to_empty``: a model built on the meta device)."""
        if self.kind != "learned":
            with torch.no_grad():
                self.table.copy_(sinusoidal_table(*self.table.shape))

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:  # (B or 1, T) -> (B or 1, T, H)
        table = F.embedding(position_ids, self.table)
        return table * self.scale if self.kind == "scaled-sinusoidal" else table


def sinusoidal_table(length: int, dim: int) -> torch.Tensor:
    """(length, dim) table of Vaswani et al.: sin on even, cos on odd channels."""
    position = torch.arange(length, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(length, dim)
    table[:, 0::2] = torch.sin(position * freq)
    table[:, 1::2] = torch.cos(position * freq[: dim // 2])
    return table


def positions_from_documents(document_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) document ids -> (B, T) position of each token inside its document (restarts at 0
    wherever the id changes)."""
    T = document_ids.shape[1]
    index = torch.arange(T, device=document_ids.device).expand_as(document_ids)
    starts = torch.ones_like(document_ids, dtype=torch.bool)
    starts[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]
    first = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values
    return index - first


def attention_mask_for(
    attention_mask: torch.Tensor | None, document_ids: torch.Tensor | None, causal: bool, T: int,
    block_mask: bool = False,
) -> tuple[torch.Tensor | BlockMask | None, bool]:
    """(bool mask for SDPA, a FlexAttention BlockMask or None; is_causal). Padding mask (B, T)
    1 = token, 0 = padding; document ids (B, T) confine attention to the own document
    (``block_mask``: as a BlockMask, see ``use_block_mask``). None + is_causal when nothing but
    causality applies, so SDPA keeps its fastest kernels."""
    if attention_mask is None and document_ids is None:
        return None, causal
    if block_mask and document_ids is not None:
        return document_block_mask(attention_mask, document_ids, causal, T), False
    mask = None
    if attention_mask is not None:
        mask = attention_mask[:, None, None, :].bool()  # (B, 1, 1, T) keys
    if document_ids is not None:
        same = document_ids[:, None, :, None] == document_ids[:, None, None, :]  # (B, 1, T, T)
        mask = same if mask is None else mask & same
    if causal:
        mask = mask & torch.ones(T, T, dtype=torch.bool, device=mask.device).tril()
    if causal or document_ids is not None:
        # with left padding (causal) or a padding document (packed blocks) a padding query may see
        # no key at all; SDPA before torch 2.5 (and some kernels) give NaN there, and 0 * NaN
        # spreads it through later layers. Letting each query see itself changes only padding rows
        # (real tokens already see themselves).
        mask = mask | torch.eye(T, dtype=torch.bool, device=mask.device)
    return mask, False


def row_causal_mask(rows: torch.Tensor, attention_mask: torch.Tensor | None, document_ids: torch.Tensor | None,
                    T: int) -> torch.Tensor:
    """(B, 1, T, T) bool SDPA mask: causal attention in the rows where ``rows`` (B,) is True,
    bidirectional in the others, within the padding and document masks (each query sees itself)."""
    mask, _ = attention_mask_for(attention_mask, document_ids, False, T)
    allowed = ~rows.bool()[:, None, None, None] | torch.ones(T, T, dtype=torch.bool, device=rows.device).tril()
    if mask is None:
        return allowed
    return (mask & allowed) | torch.eye(T, dtype=torch.bool, device=rows.device)


def use_block_mask(document_ids: torch.Tensor | None, head_dim: int, dropout: float, kernel: str = "auto") -> bool:
    """Whether packed documents go through FlexAttention (``kernel``: see Trunk.document_kernel): it
    has no attention dropout, and torch 2.5 takes only power-of-two head dims of at least 16."""
    if document_ids is None or BlockMask is None or dropout > 0 or kernel == "dense":
        return False
    if head_dim < 16 or head_dim & (head_dim - 1):
        return False
    return kernel == "flex" or flex_pays(document_ids.device.type, document_ids.shape[-1])


FLEX_BLOCK = 128  # the query and key tiles of the BlockMask (document_block_mask)


def flex_pays(device_type: str, T: int) -> bool:
    """``auto``'s choice: FlexAttention on CUDA when the block mask can skip anything, i.e. the sequence
    spans more than one block. At T = 128 the whole score matrix is one block, so flex saves nothing
    and costs its mask: on an H200 (crammed-bert base, bf16, eager, 4 documents a row) it ran at 0.80x
    the dense SDPA mask (benchmarks/results/gpu/README.md)."""
    return device_type == "cuda" and T > FLEX_BLOCK


def document_block_mask(
    attention_mask: torch.Tensor | None, document_ids: torch.Tensor, causal: bool, T: int
) -> BlockMask:
    """The block mask of exactly the dense mask ``attention_mask_for`` builds (same document, key
    not padding, causal; each query sees itself), for FlexAttention. Built once per forward and
    shared by all layers; whole blocks between documents are skipped by the kernel."""
    docs = document_ids
    keys = attention_mask.bool() if attention_mask is not None else None

    def mask_mod(b, h, q, kv):
        allowed = docs[b, q] == docs[b, kv]
        if keys is not None:
            allowed = allowed & keys[b, kv]
        if causal:
            allowed = allowed & (q >= kv)
        return allowed | (q == kv)  # as the dense mask: no query without a key

    return create_block_mask(mask_mod, docs.shape[0], None, T, T, device=docs.device, BLOCK_SIZE=FLEX_BLOCK)


# ---- block ---------------------------------------------------------------------------------------

class Block(nn.Module):
    """One transformer layer. Pre-norm: x + f(norm(x)); post-norm (original BERT): norm(x + f(x))."""

    def __init__(self, cfg, index: int):
        super().__init__()
        self.pre_norm = cfg.norm_scheme == "pre"
        # ModernBERT leaves out the first layer's attention norm: the embedding norm precedes it
        skip = index == 0 and not cfg.first_attn_norm
        self.norm1 = nn.Identity() if skip else make_norm(cfg.norm, cfg.hidden_size, cfg.norm_eps, cfg.norm_bias)
        kv_heads = cfg.num_kv_heads or cfg.num_heads
        qk_norm = cfg.norm_eps if getattr(cfg, "qk_norm", False) else None  # (configs from before the field: off)
        self.attn = SelfAttention(cfg.hidden_size, cfg.num_heads, kv_heads, cfg.bias, cfg.attention_dropout, qk_norm,
                                  value_embedding=value_tables(cfg)[index] is not None)
        self.norm2 = make_norm(cfg.norm, cfg.hidden_size, cfg.norm_eps, cfg.norm_bias)
        self.ffn = FeedForward(cfg.hidden_size, cfg.intermediate_size, cfg.ffn, cfg.activation, cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x, attn_mask=None, rotary=None, is_causal=False, value_embed=None) -> torch.Tensor:  # (B, T, H) -> (B, T, H)
        if self.pre_norm:
            x = x + self.dropout(self.attn(self.norm1(x), attn_mask, rotary, is_causal, value_embed))
            return x + self.dropout(self.ffn(self.norm2(x)))
        x = self.norm1(x + self.dropout(self.attn(x, attn_mask, rotary, is_causal, value_embed)))
        return self.norm2(x + self.dropout(self.ffn(x)))


def make_norm(kind: str, dim: int, eps: float, bias: bool = True) -> nn.Module:
    if kind == "layernorm":
        return nn.LayerNorm(dim, eps=eps, bias=bias)
    if kind == "rmsnorm":
        return nn.RMSNorm(dim, eps=eps)
    raise ValueError(f"unknown norm '{kind}'")


# ---- attention -----------------------------------------------------------------------------------

class SelfAttention(nn.Module):
    """Multi-head (or grouped-query: fewer key/value heads) self-attention with a fused QKV
    projection, through SDPA (flash kernels on GPU). The fused output is [q heads | k heads | v heads].
    ``qk_norm`` (an eps; None: off): RMSNorm of each query and key head over D before rotary, one
    learned (D,) gain for q and one for k shared by the heads (OLMo 2, Qwen 3, modded-nanogpt).
    ``value_embedding``: the values get a token embedding added (``forward``'s ``value_embed``, from the
    trunk's tables) times one learned scalar, ``value_gate`` (starts at 0.5)."""

    def __init__(self, dim: int, num_heads: int, num_kv_heads: int, bias: bool, dropout: float, qk_norm: float | None = None,
                 value_embedding: bool = False):
        super().__init__()
        if dim % num_heads or num_heads % num_kv_heads:
            raise ValueError(f"hidden size {dim}, {num_heads} heads and {num_kv_heads} key/value heads do not divide")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, dim // num_heads
        self.dropout = dropout
        self.qkv = nn.Linear(dim, (num_heads + 2 * num_kv_heads) * self.head_dim, bias=bias)
        self.out = nn.Linear(dim, dim, bias=bias)
        # the fused weight's row blocks (q | k | v): an optimizer may treat them as separate matrices
        self.fused_rows = {"qkv": [num_heads * self.head_dim, num_kv_heads * self.head_dim, num_kv_heads * self.head_dim]}
        if qk_norm is not None:
            self.q_norm, self.k_norm = nn.RMSNorm(self.head_dim, eps=qk_norm), nn.RMSNorm(self.head_dim, eps=qk_norm)
        else:
            self.q_norm = self.k_norm = None
        self.value_gate = nn.Parameter(torch.tensor(0.5)) if value_embedding else None

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
        is_causal: bool = False,
        value_embed: torch.Tensor | None = None,  # (B, T, K*D): this layer's value embedding, or None
    ) -> torch.Tensor:
        B, T, H = x.shape
        N, K = self.num_heads, self.num_kv_heads
        qkv = self.qkv(x).view(B, T, N + 2 * K, self.head_dim).transpose(1, 2)
        q, k, v = qkv.split([N, K, K], dim=1)  # (B, N, T, D), (B, K, T, D), (B, K, T, D)
        if self.value_gate is not None:
            v = v + self.value_gate * value_embed.view(B, T, K, self.head_dim).transpose(1, 2).to(v.dtype)
        if self.q_norm is not None:
            # each head's vector to RMS 1 (times a gain): bounded logits. In float32, as autocast runs the
            # other norms: under bf16 autocast q and k arrive in bf16, and RMSNorm with a bf16 input and a
            # float gain falls back from its fused kernel to a slower path (torch warns)
            q, k = self.q_norm(q.float()).to(q.dtype), self.k_norm(k.float()).to(k.dtype)
        if rotary is not None:
            q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
        extra = {"enable_gqa": True} if K != N else {}
        if BlockMask is not None and isinstance(attn_mask, BlockMask):  # packed documents (Trunk decides)
            # autocast does not cover flex_attention: q, k, v must share one dtype (they do, unless
            # something upcasts one of them; the cast is then what SDPA's autocast would do)
            y = _flex(q.device)(q, k.to(q.dtype), v.to(q.dtype), block_mask=attn_mask, **extra)
        else:
            # attn_mask: (B, 1, 1 or T, T) bool, True = may attend; None + is_causal keeps the fast path
            if extra and attn_mask is not None and q.is_cuda:
                # SDPA's grouped-query mode runs only in the flash and math kernels on CUDA (its docs), and
                # flash takes no mask: repeating the key/value heads keeps a masked batch on the
                # memory-efficient kernel instead of the math one (the same function: SDPA's reference)
                k, v, extra = k.repeat_interleave(N // K, dim=1), v.repeat_interleave(N // K, dim=1), {}
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, is_causal=is_causal, dropout_p=self.dropout if self.training else 0.0, **extra
            )
        return self.out(y.transpose(1, 2).reshape(B, T, H))  # (B, N, T, D) -> (B, T, H)


class Rotary(nn.Module):
    """Rotary position embedding (Su et al.), the "rotate half" layout of GPT-NeoX, Llama and
    ModernBERT: channel i is paired with channel i + D/2. Angles are computed in float32."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        self.head_dim, self.theta = head_dim, theta
        self.register_buffer("inv_freq", self.inverse_frequencies(), persistent=False)

    def reset_buffers(self) -> None:
        """The inverse frequencies again, in place (after ``to_empty``: a model built on the meta device)."""
        with torch.no_grad():
            self.inv_freq.copy_(self.inverse_frequencies())

    def inverse_frequencies(self) -> torch.Tensor:  # (D/2,)
        return 1.0 / (self.theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim))

    def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        angles = position_ids[..., None].float() * self.inv_freq  # (B or 1, T, D/2)
        angles = torch.cat((angles, angles), dim=-1)[:, None]  # (B or 1, 1, T, D)
        return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:  # x: (B, N, T, D)
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    return (xf * cos + torch.cat((-x2, x1), dim=-1) * sin).to(x.dtype)


@cache
def _compiled_flex():
    # flex_attention is fast only compiled (eagerly it materialises the scores); dynamic=False: one
    # kernel per shape, as training has few shapes
    return torch.compile(flex_attention, dynamic=False)


def _flex(device: torch.device):
    """flex_attention as it should be called here: traced as is inside a compiled model, compiled
    on its own on CUDA, torch's unfused reference on a CPU (tests)."""
    if device.type != "cuda" or torch.compiler.is_compiling():
        return flex_attention
    return _compiled_flex()


# ---- feed-forward --------------------------------------------------------------------------------

ACTIVATIONS = {
    "gelu": F.gelu,  # exact (erf) GELU: BERT, cramming, ModernBERT
    "gelu-tanh": partial(F.gelu, approximate="tanh"),  # GPT-2's "gelu_new"
    "relu": F.relu,
    "silu": F.silu,  # with ffn=glu: SwiGLU (llama)
    "relu2": lambda x: F.relu(x).square(),  # ReLU^2 (So et al. 2021, Primer; modded-nanogpt)
}


class FeedForward(nn.Module):
    """Plain MLP (H -> I -> H) or gated (H -> I, split in halves, act(a) * b, I/2 -> H): cramming's
    GELU-GLU, ModernBERT's GeGLU and llama's SwiGLU (a = gate_proj, b = up_proj) alike."""

    def __init__(self, dim: int, inner: int, kind: str, activation: str, bias: bool):
        super().__init__()
        self.gated = kind == "glu"
        self.act = ACTIVATIONS[activation]
        self.up = nn.Linear(dim, inner, bias=bias)
        self.down = nn.Linear(inner // 2 if self.gated else inner, dim, bias=bias)
        self.fused_rows = {"up": [inner // 2, inner // 2]} if self.gated else {}  # gate | value

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, T, H)
        h = self.up(x)  # (B, T, I)
        if self.gated:
            gate, value = h.chunk(2, dim=-1)
            h = self.act(gate) * value  # (B, T, I/2)
        else:
            h = self.act(h)
        return self.down(h)


# ---- heads: MLM (the causal LM head is one nn.Linear, in gpt.py) ---------------------------------

def soft_cap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """Logit soft-capping (Gemma 2, modded-nanogpt): cap * tanh(logits / cap), smooth and within
    (-cap, cap); None: the logits as they are."""
    return logits if not cap else cap * torch.tanh(logits / cap)


class MLMHead(nn.Module):
    """[dense -> activation -> norm ->] decoder to the vocabulary. BERT's head has the transform in
    brackets; cramming's final crammed-bert skips it (``skip_head_transform``: the tied decoder
    alone), which ``cfg.head_transform = False`` selects."""

    def __init__(self, cfg, vocab_size: int):
        super().__init__()
        self.transform = cfg.head_transform
        if self.transform:
            self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=cfg.bias)
            self.act = ACTIVATIONS[cfg.activation]
            self.norm = make_norm(cfg.norm, cfg.hidden_size, cfg.norm_eps, cfg.norm_bias)
        self.decoder = nn.Linear(cfg.hidden_size, vocab_size, bias=cfg.bias)
        self.softcap = getattr(cfg, "logit_softcap", None)
        self.loss_rows: int | None = None  # rows of the fused loss's chunks (None: chunk_rows, by device)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # (..., H) -> (..., V)
        if self.transform:
            hidden = self.norm(self.act(self.dense(hidden)))
        return soft_cap(self.decoder(hidden), self.softcap)

    def loss(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of (M, H) hidden states against (M,) targets (no ignored ones), the
        decoder and the loss fused: eager, the (M, V) logits never exist at once (linear_cross_entropy;
        M, the masked tokens, changes every batch, so a compiled graph takes plain ops)."""
        if self.transform:
            hidden = self.norm(self.act(self.dense(hidden)))
        return linear_cross_entropy(hidden, self.decoder.weight, self.decoder.bias, targets, rows=self.loss_rows,
                                    softcap=self.softcap, rows_vary=True)


def linear_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor, rows: int | None = None,
    softcap: float | None = None, rows_vary: bool = False,
) -> torch.Tensor:
    """``F.cross_entropy(soft_cap(hidden @ weight.T + bias, softcap), targets)`` (mean; every target scored), computed
    ``rows`` rows at a time. When gradients are wanted they are computed in the same pass, while a
    chunk's logits are still in cache: softmax - one-hot is formed in place of the logits and
    multiplied out at once. Against logits -> log_softmax -> nll_loss this leaves out writing and
    re-reading the (M, V) logits, their gradient and its zero fill, which on a CPU costs a small
    model (hidden 128, vocab 32768) about a third of its head time; the matmuls are the same three
    (FLOPs unchanged). Under autocast the matmuls run in the autocast dtype and the softmax in fp32,
    as F.linear + logits.float() would."""
    if rows_vary and torch.compiler.is_compiling():
        # ``rows_vary``: M changes from call to call (the masked tokens of a batch). Traced, the chunk
        # loop below would specialise on M: one recompilation per count. Plain ops keep M symbolic
        # (inductor fuses them; the (M, V) logits then exist). Callers whose M is fixed per shape leave
        # rows_vary False and stay chunked (gpt.py).
        logits = soft_cap(F.linear(hidden, weight, bias).float(), softcap)  # (M, V)
        return F.cross_entropy(logits, targets)
    V = weight.shape[0]
    rows = rows or chunk_rows(V, hidden.device.type)
    wants_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad))
    return _LinearCrossEntropy.apply(hidden, weight, bias, targets, rows, wants_grad, softcap)


# logits per chunk of linear_cross_entropy: on a CPU about 16 MB in fp32, which stays in cache; on a
# GPU about 256 MB, a few chunks for a batch's masked tokens (2,048 rows of a 32768 vocabulary; a 16 MB
# chunk is 128 rows: dozens of small kernels per chunk, launch-bound), with the softmax's temporaries
# well inside a small GPU's memory. benchmarks/model_step.py times both on CUDA.
CHUNK_FLOATS = {"cpu": 1 << 22, "cuda": 1 << 26}


def chunk_rows(vocab_size: int, device_type: str) -> int:
    if device_type == "cuda":
        return max(16, CHUNK_FLOATS["cuda"] // vocab_size)
    return max(16, min(1024, CHUNK_FLOATS["cpu"] // vocab_size))


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, rows: int, wants_grad: bool, softcap: float | None = None):
        device = hidden.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
        M = hidden.shape[0]
        need_h, need_w, need_b = (wants_grad and n for n in ctx.needs_input_grad[:3])
        with torch.autocast(device, enabled=False):
            h, w = hidden.to(dtype), weight.to(dtype)
            grad_h = torch.empty_like(hidden) if need_h else None
            grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
            grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_b else None
            total = torch.zeros((), dtype=torch.float32, device=hidden.device)
            for start in range(0, M, rows):
                hc, tc = h[start : start + rows], targets[start : start + rows]
                logits = (hc @ w.T).float()  # (m, V)
                if bias is not None:
                    logits += bias.float()
                if softcap:  # z -> cap tanh(z / cap); its derivative 1 - tanh^2 is applied to the gradient below
                    tanh = logits.div_(softcap).tanh_()
                    logits = tanh * softcap
                picked = logits.gather(1, tc[:, None])  # (m, 1)
                top = logits.amax(dim=-1, keepdim=True)
                g = logits.sub_(top).exp_()  # exp(logits - max), in place of the logits
                norm = g.sum(dim=-1, keepdim=True)
                total += (top + norm.log() - picked).sum()  # log-sum-exp - the target's logit
                if not (need_h or need_w or need_b):
                    continue
                g.mul_(1.0 / (norm * M))  # softmax / M ...
                g[torch.arange(len(tc), device=g.device), tc] -= 1.0 / M  # ... - one-hot / M = d(mean loss) / d(logits)
                if softcap:
                    g.mul_(1 - tanh.square_())  # through the cap: d(capped) / d(logits)
                if need_b:
                    grad_b += g.sum(0)
                gd = g.to(dtype)
                if need_h:
                    grad_h[start : start + rows] = gd @ w
                if need_w:
                    if dtype == torch.float32:  # accumulate in place (out=, not addmm_: FLOP counters see it)
                        torch.addmm(grad_w, gd.T, hc, out=grad_w)
                    else:
                        grad_w += (gd.T @ hc).float()
        ctx.save_for_backward(grad_h, grad_w, grad_b)
        ctx.dtypes = (weight.dtype, bias.dtype if bias is not None else None)
        return total / M

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w, grad_b = ctx.saved_tensors
        w_dtype, b_dtype = ctx.dtypes
        return (
            grad_h * grad_out if grad_h is not None else None,
            (grad_w * grad_out).to(w_dtype) if grad_w is not None else None,
            (grad_b * grad_out).to(b_dtype) if grad_b is not None else None,
            None, None, None, None,
        )


# ---- init ----------------------------------------------------------------------------------------

def init_weights(module: nn.Module, std: float, scheme: str = "normal", num_layers: int = 1, zero_out: bool = False) -> None:
    """normal(0, std) for linear and embedding weights (learned position tables too), zeros for
    biases (BERT's scheme). ``scaled-residual`` (GPT-2): the projections that write into the
    residual stream (attention out, FFN down) get std / sqrt(2 * layers); ``zero_out``
    (modded-nanogpt): those projections start at zero, so every block starts as the identity."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=std)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, PositionEmbedding) and m.kind == "learned":
            nn.init.normal_(m.table, mean=0.0, std=std)
    if scheme == "scaled-residual":
        for m in module.modules():
            if isinstance(m, (SelfAttention, FeedForward)):
                residual_out = m.out if isinstance(m, SelfAttention) else m.down
                nn.init.normal_(residual_out.weight, mean=0.0, std=std / math.sqrt(2 * num_layers))
    if zero_out:
        for m in module.modules():
            if isinstance(m, (SelfAttention, FeedForward)):
                nn.init.zeros_(m.out.weight if isinstance(m, SelfAttention) else m.down.weight)
