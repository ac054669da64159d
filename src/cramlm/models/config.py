"""The transformer's configs (TransformerConfig; CrammedBertConfig, GPT2Config, LlamaConfig) and
its exact FLOP count (``trunk_flops_per_token``); no layers: those are in model.py.

Each architectural choice is one field, so crammed-bert, the original BERT, a ModernBERT-like
encoder, GPT-2 and a llama-like decoder are presets of the same few classes (recipes/arch/).
The configs live here, without torch, so that validating a config (and so the CLI) imports no
torch; the wrappers (crammed_bert.py, gpt.py) register their builders for the types declared here.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, model_validator

from cramlm.config.base import NonNegativeInt, PositiveFloat, PositiveInt
from cramlm.config.registry import declare
from cramlm.models.base import ModelConfig

Dropout = Annotated[float, Field(ge=0, lt=1)]


class TransformerConfig(ModelConfig):
    hidden_size: PositiveInt = Field(768, description="width of the residual stream (and of each token embedding)")
    num_layers: PositiveInt = Field(12, description="transformer blocks (attention + FFN each)")
    num_heads: PositiveInt = Field(12, description="attention heads; must divide hidden_size (head dim = hidden_size / num_heads)")
    num_kv_heads: PositiveInt | None = Field(
        None, description="grouped-query attention: fewer key/value heads (None: = num_heads)"
    )
    intermediate_size: PositiveInt = Field(
        3072,
        description=(
            "FFN up-projection width; with ffn=glu it is split in two halves (gate, value), so the "
            'down-projection reads intermediate_size / 2 (HF\'s "intermediate_size" of a GLU model)'
        ),
    )
    ffn: Literal["glu", "plain"] = Field(
        "plain", description="feed-forward block: plain = up, activation, down (BERT, GPT-2); glu = activation(gate) x "
        "value, then down (cramming's GELU-GLU, llama's SwiGLU)")
    activation: Literal["gelu", "gelu-tanh", "relu", "silu", "relu2"] = Field(
        "gelu", description="FFN nonlinearity (and the MLM head transform's): exact GELU, GPT-2's tanh-approximated "
        "GELU, ReLU, SiLU (SwiGLU with ffn=glu), or relu2: ReLU^2 (Primer, modded-nanogpt; exports as remote code)")
    norm: Literal["layernorm", "rmsnorm"] = Field("layernorm", description="every norm of the model: LayerNorm or RMSNorm")
    norm_eps: PositiveFloat = Field(1e-12, description="epsilon inside every norm (BERT: 1e-12, GPT-2 and llama: 1e-5)")
    norm_scheme: Literal["pre", "post"] = Field(
        "pre", description="pre: x + f(norm(x)) (cramming, GPT-2, llama); post: norm(x + f(x)) (the original BERT)")
    norm_bias: bool = Field(True, description="LayerNorm bias (RMSNorm has none)")
    embedding_norm: bool = Field(False, description="a norm right after token + position embedding")
    first_attn_norm: bool = Field(
        True, description="ModernBERT drops layer 0's attention norm (the embedding norm precedes)"
    )
    final_norm: bool = Field(True, description="a norm after the last block (pre-norm models need it)")
    bias: bool = Field(True, description="biases in linear layers (and in the MLM decoder)")
    positions: Literal["learned", "sinusoidal", "scaled-sinusoidal", "rope", "none"] = Field(
        "learned", description="position information: a learned table, a fixed sinusoidal table, cramming's sinusoidal "
        "table x one learned scalar, rotary embeddings on queries and keys, or none")
    rope_theta: PositiveFloat = Field(10000.0, description="base of the rotary frequencies (positions=rope only)")
    type_vocab_size: NonNegativeInt = Field(0, description="BERT's token-type (segment) embeddings; 0: none")
    tie_embeddings: bool = Field(True, description="output decoder shares the token-embedding matrix")
    dropout: Dropout = Field(0.0, description="dropout probability after embeddings and on each block's residual "
                             "branches, during training (cramming: 0; BERT: 0.1)")
    attention_dropout: Dropout = Field(0.0, description="dropout probability on the attention weights, during training")
    init_std: PositiveFloat = Field(0.02, description="standard deviation of the normal init of linear and embedding weights")
    init: Literal["normal", "scaled-residual"] = Field(
        "normal", description="scaled-residual: GPT-2's std/sqrt(2L) on residual outputs"
    )
    # modern choices (modded-nanogpt's speedrun); off in every preset that reproduces a published model
    qk_norm: bool = Field(False, description="RMSNorm of each query and key head before attention (OLMo 2, "
                          "Qwen 3, modded-nanogpt); exports as remote code")
    zero_init_out: bool = Field(False, description="attention-out and FFN-down projections start at zero "
                                "(each block starts as the identity; modded-nanogpt)")
    logit_softcap: PositiveFloat | None = Field(None, description="output logits -> cap * tanh(logits / cap) "
                                                "(Gemma 2: 30; modded-nanogpt: 15..30); null: off; exports as remote code")
    value_embeddings: NonNegativeInt = Field(
        0, description="k extra token-embedding tables (vocab x key/value width) added into the attention values: "
        "table i, times a learned per-layer scalar, into layers i and num_layers-1-i (modded-nanogpt's value "
        "embeddings, U-net order); no matmul FLOPs; 0: off; exports as remote code")

    @model_validator(mode="after")
    def _shapes(self):
        kv = self.num_kv_heads or self.num_heads
        if self.hidden_size % self.num_heads or self.num_heads % kv:
            raise ValueError(f"hidden_size {self.hidden_size}, num_heads {self.num_heads}, num_kv_heads {kv} do not divide")
        if self.positions == "rope" and (self.hidden_size // self.num_heads) % 2:
            raise ValueError("rope needs an even head dimension")
        if self.ffn == "glu" and self.intermediate_size % 2:
            raise ValueError("ffn=glu needs an even intermediate_size")
        if not self.first_attn_norm and self.norm_scheme == "post":
            raise ValueError("first_attn_norm=false drops layer 0's pre-attention norm (ModernBERT, after its embedding "
                             "norm); under norm_scheme=post it would drop that layer's residual norm: use norm_scheme=pre")
        if 2 * self.value_embeddings > self.num_layers + 1:
            raise ValueError(f"value_embeddings {self.value_embeddings} > (num_layers + 1) / 2: table i feeds layers i "
                             f"and num_layers-1-i, so {self.num_layers} layers take at most {(self.num_layers + 1) // 2}")
        return self


class CrammedBertConfig(TransformerConfig):
    """Defaults are cramming's final architecture (recipes/arch/crammed-bert.yaml). Every run and
    export written by cramlm records every field, ``head_transform`` included; a config without it
    gets cramming's choice (no transform), not BERT's."""

    type: Literal["crammed-bert"] = "crammed-bert"
    num_layers: PositiveInt = 16
    ffn: Literal["glu", "plain"] = "glu"
    norm_scheme: Literal["pre", "post"] = "pre"
    embedding_norm: bool = True
    bias: bool = False
    positions: Literal["learned", "sinusoidal", "scaled-sinusoidal", "rope", "none"] = "scaled-sinusoidal"
    sparse_prediction: bool = Field(True, description="run the MLM head only where labels != -100")
    head_transform: bool = Field(
        False, description="dense + activation + norm before the MLM decoder (BERT, ModernBERT); cramming "
        "skips it (skip_head_transform: True): 591,360 fewer parameters at hidden 768")
    pooler_size: PositiveInt | None = Field(
        None, description="width of the downstream classifier's pooler (first token -> dense -> tanh); "
        "cramming's GLUE-sane head uses 1024 on its 768-wide model. None: hidden_size (BERT's pooler)")


class GPT2Config(TransformerConfig):
    """GPT-2 (Radford et al. 2019); defaults are the 124M model (recipes/arch/gpt2.yaml)."""

    type: Literal["gpt2"] = "gpt2"
    objective: ClassVar[Literal["mlm", "clm"]] = "clm"
    max_seq_length: PositiveInt = 1024
    activation: Literal["gelu", "gelu-tanh", "relu", "silu", "relu2"] = "gelu-tanh"
    norm_eps: PositiveFloat = 1e-5
    init: Literal["normal", "scaled-residual"] = "scaled-residual"


class LlamaConfig(TransformerConfig):
    """A llama-like decoder (Touvron et al. 2023); defaults are a small model (recipes/arch/llama-*.yaml)."""

    type: Literal["llama"] = "llama"
    objective: ClassVar[Literal["mlm", "clm"]] = "clm"
    max_seq_length: PositiveInt = 2048
    intermediate_size: PositiveInt = Field(4096, description="gate + up halves, 2 x 2048")
    ffn: Literal["glu", "plain"] = "glu"
    activation: Literal["gelu", "gelu-tanh", "relu", "silu", "relu2"] = "silu"
    norm: Literal["layernorm", "rmsnorm"] = "rmsnorm"
    norm_eps: PositiveFloat = 1e-5
    bias: bool = False
    positions: Literal["learned", "sinusoidal", "scaled-sinusoidal", "rope", "none"] = "rope"
    tie_embeddings: bool = False


declare("model", "crammed-bert", CrammedBertConfig)
declare("model", "gpt2", GPT2Config)
declare("model", "llama", LlamaConfig)


def trunk_flops_per_token(cfg: TransformerConfig, seq_len: int) -> float:
    """Forward FLOPs per token of embeddings + blocks (2 per multiply-add of every matmul).
    Attention scores and weighted values count the full T x T square, as SDPA's math kernel and
    torch.utils.flop_counter do, also for causal models; norms, softmax and activations are not
    matmuls and count zero."""
    H, N, L = cfg.hidden_size, cfg.num_heads, cfg.num_layers
    D = H // N
    K = cfg.num_kv_heads or N
    inner = cfg.intermediate_size
    qkv = 2 * H * (N + 2 * K) * D
    attention = 2 * 2 * seq_len * N * D  # q.k over T keys, then weights @ v
    out = 2 * H * H
    ffn = 2 * H * inner + 2 * (inner // 2 if cfg.ffn == "glu" else inner) * H
    return float(L * (qkv + attention + out + ffn))
