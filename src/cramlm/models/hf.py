"""Hugging Face export: cramlm checkpoints as transformers folders.

Export: a model whose choices match a stock transformers class exactly is written as that class
(weights renamed and split, config.json in its terms): bert-original -> BertForMaskedLM, the
ModernBERT-like crammed variant -> ModernBertForMaskedLM, GPT-2 -> GPT2LMHeadModel, llama-like ->
LlamaForCausalLM. Any other variant becomes a remote-code package (our own model.py beside the
weights, loaded with ``trust_remote_code=True``). (HF checkpoints are evaluated through transformers:
eval/checkpoints.py.)

A name table per architecture lists (HF name, our name, how): ``None`` copies, ``("part", i, sizes)``
takes the i-th slice of our fused tensor along dim 0 (fused QKV, fused GLU up-projection), "T"
transposes (GPT-2's Conv1D stores weights as (in, out)).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import torch
from tokenizers import Tokenizer

from cramlm.data.tokenizer import EOT
from cramlm.models.config import TransformerConfig
from cramlm.io import save_safetensors

HF_ACTIVATIONS = {"gelu": "gelu", "gelu-tanh": "gelu_new", "relu": "relu", "silu": "silu"}
STOCK_CLASSES = {
    "bert": "BertForMaskedLM",
    "modernbert": "ModernBertForMaskedLM",
    "gpt2": "GPT2LMHeadModel",
    "llama": "LlamaForCausalLM",
}

# the choices each stock class hard-codes; anything else needs the remote-code package
_COMMON = {"num_kv_heads_equal": True, "type_vocab_size": 0, "first_attn_norm": True,
           "qk_norm": False, "value_embeddings": 0}  # (and no logit_softcap; zero_init_out changes only the init)
_MLM_HEAD = {"head_transform": True}  # BERT's and ModernBERT's heads always have the dense + act + norm transform
REQUIREMENTS: dict[str, dict] = {
    "bert": dict(_COMMON, **_MLM_HEAD, objective="mlm", norm="layernorm", norm_scheme="post", norm_bias=True, bias=True,
                 embedding_norm=True, final_norm=False, ffn="plain", positions="learned", type_vocab_size=None),
    "modernbert": dict(_COMMON, **_MLM_HEAD, objective="mlm", norm="layernorm", norm_scheme="pre", norm_bias=False, bias=False,
                       embedding_norm=True, first_attn_norm=False, final_norm=True, ffn="glu", positions="rope"),
    "gpt2": dict(_COMMON, objective="clm", norm="layernorm", norm_scheme="pre", norm_bias=True, bias=True,
                 embedding_norm=False, final_norm=True, ffn="plain", positions="learned"),
    "llama": dict(_COMMON, objective="clm", norm="rmsnorm", norm_scheme="pre", bias=False, num_kv_heads_equal=None,
                  embedding_norm=False, final_norm=True, ffn="glu", positions="rope"),
}


def mismatches(cfg: TransformerConfig, arch: str) -> list[str]:
    """Choices of ``cfg`` that the stock class of ``arch`` cannot express (empty: exact)."""
    out = []
    for key, want in REQUIREMENTS[arch].items():
        if want is None:
            continue
        have = (cfg.num_kv_heads or cfg.num_heads) == cfg.num_heads if key == "num_kv_heads_equal" else getattr(cfg, key, None)
        if have != want:
            out.append(f"{key}={have} (needs {want})")
    if getattr(cfg, "logit_softcap", None):
        out.append(f"logit_softcap={cfg.logit_softcap} (needs null)")
    if cfg.activation not in HF_ACTIVATIONS:
        out.append(f"activation={cfg.activation} (needs one of {', '.join(HF_ACTIVATIONS)})")
    if arch == "bert" and not cfg.type_vocab_size:
        out.append("type_vocab_size=0 (needs token types)")
    return out


def stock_architecture(cfg: TransformerConfig) -> str | None:
    """The stock transformers architecture that ``cfg`` matches exactly, or None."""
    return next((arch for arch in REQUIREMENTS if not mismatches(cfg, arch)), None)


# the preset family each stock class stands for (the names a person picked with arch=...)
FAMILIES = {"bert": "bert-original", "modernbert": "crammed-bert-modern", "gpt2": "gpt2", "llama": "llama"}


def architecture_name(cfg) -> str:
    """What to call a model in messages: the preset family whose choices ``cfg`` has exactly
    (``arch=bert-original-tiny`` is type crammed-bert with BERT's choices: "bert-original"), else its type."""
    arch = stock_architecture(cfg) if isinstance(cfg, TransformerConfig) else None
    return FAMILIES[arch] if arch else cfg.type


# ---- name tables ------------------------------------------------------------------------------


def _qkv(cfg: TransformerConfig) -> list[int]:
    D = cfg.hidden_size // cfg.num_heads
    return [cfg.num_heads * D, (cfg.num_kv_heads or cfg.num_heads) * D, (cfg.num_kv_heads or cfg.num_heads) * D]


def _halves(cfg: TransformerConfig) -> list[int]:
    return [cfg.intermediate_size // 2] * 2


def names(cfg: TransformerConfig, arch: str) -> Iterator[tuple[str, str, object]]:
    """(HF name, our name, how) of every weight of ``arch``'s stock class, in its order."""
    if arch not in _NAMES:
        raise ValueError(f"unknown architecture '{arch}'")
    return _NAMES[arch](cfg.num_layers, _qkv(cfg), _halves(cfg))


def _bert_names(L: int, qkv, halves) -> Iterator[tuple[str, str, object]]:
    e = "bert.embeddings."
    yield e + "word_embeddings.weight", "trunk.tokens.weight", None
    yield e + "position_embeddings.weight", "trunk.positions.table", None
    yield e + "token_type_embeddings.weight", "trunk.token_types.weight", None
    for s in ("weight", "bias"):
        yield e + f"LayerNorm.{s}", f"trunk.embedding_norm.{s}", None
        for i in range(L):
            h, o = f"bert.encoder.layer.{i}.", f"trunk.blocks.{i}."
            for j, name in enumerate(("query", "key", "value")):
                yield h + f"attention.self.{name}.{s}", o + f"attn.qkv.{s}", ("part", j, qkv)
            yield h + f"attention.output.dense.{s}", o + f"attn.out.{s}", None
            yield h + f"attention.output.LayerNorm.{s}", o + f"norm1.{s}", None
            yield h + f"intermediate.dense.{s}", o + f"ffn.up.{s}", None
            yield h + f"output.dense.{s}", o + f"ffn.down.{s}", None
            yield h + f"output.LayerNorm.{s}", o + f"norm2.{s}", None
        yield f"cls.predictions.transform.dense.{s}", f"head.dense.{s}", None
        yield f"cls.predictions.transform.LayerNorm.{s}", f"head.norm.{s}", None
    yield "cls.predictions.decoder.weight", "head.decoder.weight", None
    yield "cls.predictions.bias", "head.decoder.bias", None
    # the decoder's own name too: BertForMaskedLM ties it to cls.predictions.bias only when it ties the
    # embeddings, and an untied export without it loaded a zero bias (logits off by the bias)
    yield "cls.predictions.decoder.bias", "head.decoder.bias", None


def _modernbert_names(L: int, qkv, halves) -> Iterator[tuple[str, str, object]]:
    yield "model.embeddings.tok_embeddings.weight", "trunk.tokens.weight", None
    yield "model.embeddings.norm.weight", "trunk.embedding_norm.weight", None
    for i in range(L):
        h, o = f"model.layers.{i}.", f"trunk.blocks.{i}."
        if i > 0:
            yield h + "attn_norm.weight", o + "norm1.weight", None
        yield h + "attn.Wqkv.weight", o + "attn.qkv.weight", None
        yield h + "attn.Wo.weight", o + "attn.out.weight", None
        yield h + "mlp_norm.weight", o + "norm2.weight", None
        yield h + "mlp.Wi.weight", o + "ffn.up.weight", None
        yield h + "mlp.Wo.weight", o + "ffn.down.weight", None
    yield "model.final_norm.weight", "trunk.final_norm.weight", None
    yield "head.dense.weight", "head.dense.weight", None
    yield "head.norm.weight", "head.norm.weight", None
    yield "decoder.weight", "head.decoder.weight", None


def _gpt2_names(L: int, qkv, halves) -> Iterator[tuple[str, str, object]]:
    yield "transformer.wte.weight", "trunk.tokens.weight", None
    yield "transformer.wpe.weight", "trunk.positions.table", None
    for i in range(L):
        h, o = f"transformer.h.{i}.", f"trunk.blocks.{i}."
        for ours, theirs in (("norm1", "ln_1"), ("norm2", "ln_2")):
            for s in ("weight", "bias"):
                yield h + f"{theirs}.{s}", o + f"{ours}.{s}", None
        for ours, theirs in (("attn.qkv", "attn.c_attn"), ("attn.out", "attn.c_proj"), ("ffn.up", "mlp.c_fc"), ("ffn.down", "mlp.c_proj")):
            yield h + f"{theirs}.weight", o + f"{ours}.weight", "T"
            yield h + f"{theirs}.bias", o + f"{ours}.bias", None
    for s in ("weight", "bias"):
        yield f"transformer.ln_f.{s}", f"trunk.final_norm.{s}", None
    yield "lm_head.weight", "lm_head.weight", None


def _llama_names(L: int, qkv, halves) -> Iterator[tuple[str, str, object]]:
    yield "model.embed_tokens.weight", "trunk.tokens.weight", None
    for i in range(L):
        h, o = f"model.layers.{i}.", f"trunk.blocks.{i}."
        yield h + "input_layernorm.weight", o + "norm1.weight", None
        for j, name in enumerate(("q_proj", "k_proj", "v_proj")):
            yield h + f"self_attn.{name}.weight", o + "attn.qkv.weight", ("part", j, qkv)
        yield h + "self_attn.o_proj.weight", o + "attn.out.weight", None
        yield h + "post_attention_layernorm.weight", o + "norm2.weight", None
        yield h + "mlp.gate_proj.weight", o + "ffn.up.weight", ("part", 0, halves)
        yield h + "mlp.up_proj.weight", o + "ffn.up.weight", ("part", 1, halves)
        yield h + "mlp.down_proj.weight", o + "ffn.down.weight", None
    yield "model.norm.weight", "trunk.final_norm.weight", None
    yield "lm_head.weight", "lm_head.weight", None


_NAMES = {"bert": _bert_names, "modernbert": _modernbert_names, "gpt2": _gpt2_names, "llama": _llama_names}


# the output embedding each stock class ties to its input embedding when tie_word_embeddings is set
TIED_OUTPUT = {"bert": "cls.predictions.decoder.weight", "modernbert": "decoder.weight", "gpt2": "lm_head.weight",
               "llama": "lm_head.weight"}


def to_hf_state_dict(model: torch.nn.Module, arch: str) -> dict[str, torch.Tensor]:
    """The weights under transformers' names; a tied output embedding is left out (the class ties
    it to the input embedding on loading, so it is stored once, as in the run)."""
    ours = model.state_dict()
    out = {}
    for theirs, name, how in names(model.cfg, arch):
        if model.cfg.tie_embeddings and theirs == TIED_OUTPUT[arch]:
            continue
        t = ours[name]
        if how == "T":
            t = t.t()
        elif how is not None:
            _, j, sizes = how
            t = t.split(sizes, dim=0)[j]
        out[theirs] = t.detach().contiguous().clone()  # own storage each: safetensors refuses shared tensors
    return out


# ---- configs ----------------------------------------------------------------------------------


def hf_config(cfg: TransformerConfig, arch: str, vocab_size: int, special: dict[str, int]) -> dict:
    """config.json for the stock class of ``arch`` (transformers' own field names)."""
    common = {
        "architectures": [STOCK_CLASSES[arch]],
        "vocab_size": vocab_size,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "max_position_embeddings": cfg.max_seq_length,
        "initializer_range": cfg.init_std,
        "tie_word_embeddings": cfg.tie_embeddings,
        "pad_token_id": special.get("pad"),
    }
    if arch == "bert":
        return {**common, "model_type": "bert", "intermediate_size": cfg.intermediate_size,
                "hidden_act": HF_ACTIVATIONS[cfg.activation], "layer_norm_eps": cfg.norm_eps,
                "type_vocab_size": cfg.type_vocab_size, "hidden_dropout_prob": cfg.dropout,
                "attention_probs_dropout_prob": cfg.attention_dropout, "position_embedding_type": "absolute"}
    if arch == "modernbert":
        rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
        return {**common, "model_type": "modernbert", "intermediate_size": cfg.intermediate_size // 2,
                "hidden_activation": HF_ACTIVATIONS[cfg.activation], "classifier_activation": HF_ACTIVATIONS[cfg.activation],
                "norm_eps": cfg.norm_eps, "norm_bias": False, "attention_bias": False, "mlp_bias": False,
                "decoder_bias": False, "classifier_bias": False, "layer_types": ["full_attention"] * cfg.num_layers,
                "global_attn_every_n_layers": 1, "rope_parameters": {"full_attention": rope, "sliding_attention": dict(rope)},
                "embedding_dropout": cfg.dropout, "mlp_dropout": cfg.dropout, "attention_dropout": cfg.attention_dropout,
                "sparse_prediction": False, "cls_token_id": special.get("cls"), "sep_token_id": special.get("sep"),
                "bos_token_id": special.get("cls"), "eos_token_id": special.get("sep")}
    if arch == "gpt2":
        return {**common, "model_type": "gpt2", "n_embd": cfg.hidden_size, "n_layer": cfg.num_layers,
                "n_head": cfg.num_heads, "n_positions": cfg.max_seq_length, "n_inner": cfg.intermediate_size,
                "activation_function": HF_ACTIVATIONS[cfg.activation], "layer_norm_epsilon": cfg.norm_eps,
                "resid_pdrop": cfg.dropout, "embd_pdrop": cfg.dropout, "attn_pdrop": cfg.attention_dropout,
                "bos_token_id": special.get("bos"), "eos_token_id": special.get("eos")}
    if arch == "llama":
        return {**common, "model_type": "llama", "intermediate_size": cfg.intermediate_size // 2,
                "num_key_value_heads": cfg.num_kv_heads or cfg.num_heads, "head_dim": cfg.hidden_size // cfg.num_heads,
                "hidden_act": HF_ACTIVATIONS[cfg.activation], "rms_norm_eps": cfg.norm_eps,
                "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
                "attention_bias": False, "mlp_bias": False, "attention_dropout": cfg.attention_dropout,
                "bos_token_id": special.get("bos"), "eos_token_id": special.get("eos")}
    raise ValueError(f"unknown architecture '{arch}'")


# ---- tokenizer --------------------------------------------------------------------------------

# our special tokens and the roles transformers gives them
SPECIAL_ROLES = {"[PAD]": "pad", "[UNK]": "unk", "[CLS]": "cls", "[SEP]": "sep", "[MASK]": "mask",
                 "<|endoftext|>": "eos", "<s>": "bos", "</s>": "eos", "<pad>": "pad", "<unk>": "unk", "<mask>": "mask"}


def special_tokens(tok: Tokenizer) -> dict[str, str]:
    """role -> token for the special tokens the tokenizer has (pad, unk, cls, sep, mask, bos, eos)."""
    roles = {}
    for token, role in SPECIAL_ROLES.items():
        if tok.token_to_id(token) is not None:
            roles.setdefault(role, token)
    return roles


def default_eos(tok: Tokenizer) -> str | None:
    """The end-of-document token of a causal LM's tokenizer (cramlm's causal tokenizers: <|endoftext|>)."""
    return next((t for t in (EOT, "</s>", "<eos>", "<|end_of_text|>", "[SEP]") if tok.token_to_id(t) is not None), None)


def write_tokenizer(tok: Tokenizer, out_dir: Path, max_length: int, eos: str | None = None) -> dict[str, int]:
    """tokenizer.json + tokenizer_config.json + special_tokens_map.json; AutoTokenizer then gives
    our ids (including the [CLS] ... [SEP] template of a masked LM's tokenizer). ``eos``: a causal
    LM's end-of-document token, which is then its bos, eos and pad (GPT-2's convention) and the only
    special roles besides unk. Returns role -> id."""
    tok = Tokenizer.from_str(tok.to_str())
    tok.no_padding()
    tok.no_truncation()
    tok.save(str(out_dir / "tokenizer.json"))
    roles = special_tokens(tok)
    if eos is not None:
        roles = {"bos": eos, "eos": eos, "pad": eos, **({"unk": roles["unk"]} if "unk" in roles else {})}
    tokens_map = {f"{role}_token": token for role, token in roles.items()}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_length,
              "clean_up_tokenization_spaces": False, **tokens_map}
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out_dir / "special_tokens_map.json").write_text(json.dumps(tokens_map, indent=2) + "\n")
    return {role: tok.token_to_id(token) for role, token in roles.items()}


# ---- export / import --------------------------------------------------------------------------


def write_generation_config(out_dir: Path, special: dict[str, int]) -> None:
    """generation_config.json: generate() and pipeline('text-generation') stop at eos and pad with it."""
    config = {key: special[role] for key, role in (("bos_token_id", "bos"), ("eos_token_id", "eos"), ("pad_token_id", "pad"))
              if role in special}
    (out_dir / "generation_config.json").write_text(json.dumps(config, indent=2) + "\n")


def segments_as_trained(model: torch.nn.Module) -> None:
    """Copy segment 0's token-type embedding into the other rows of every token-type table of
    ``model``. cramlm pretrains and fine-tunes with every token in segment 0
    (packed text, no next-sentence task), so the other rows keep their random init; a tokenizer's
    sentence pairs (segment 1 after the first [SEP]) then compute what the run computes."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(table := getattr(m, "token_types", None), torch.nn.Embedding):
                table.weight[1:] = table.weight[:1]


def export_hf(model: torch.nn.Module, tok: Tokenizer, out_dir: str | Path, eos: str | None = None) -> str:
    """Write ``model`` and ``tok`` as an HF folder; returns the class that loads it. ``eos``: a
    causal LM's end-of-document token (default: <|endoftext|>, </s>, ... whichever the tokenizer has).
    (An objective whose trained model is not the arch alone writes its own: models/objectives/.)"""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = model.cfg
    causal = cfg.objective == "clm"
    special = write_tokenizer(tok, out_dir, cfg.max_seq_length, (eos or default_eos(tok)) if causal else None)
    if causal:
        write_generation_config(out_dir, special)
    arch = stock_architecture(cfg)
    if arch is None:
        from cramlm.models.hf_remote import export_remote

        return export_remote(model, out_dir, special)
    save_safetensors(to_hf_state_dict(model, arch), out_dir / "model.safetensors", metadata={"format": "pt"})
    config = hf_config(cfg, arch, model.vocab_size, special)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return STOCK_CLASSES[arch]


__all__ = ["export_hf", "segments_as_trained", "stock_architecture", "mismatches", "to_hf_state_dict"]
