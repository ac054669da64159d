"""Remote-code export for variants no stock transformers class expresses (e.g. cramming's own
crammed-bert: scaled sinusoidal positions, GELU-GLU, LayerNorms with biases but linear layers
without). The folder gets ``modeling_cramlm.py`` = our layers.py verbatim + the thin wrappers
below, so the exported model runs the very code that was trained; the weights keep our names."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import torch

from cramlm.models import layers
from cramlm.io import save_safetensors
from cramlm.models.base import tied_aliases

CONFIGURATION = '''"""cramlm model config for transformers (written by `cramlm export hf`)."""

from transformers import PretrainedConfig


class CramlmConfig(PretrainedConfig):
    """Holds cramlm's own architecture fields under ``cramlm`` (see cramlm's docs/models.md)."""

    model_type = "cramlm"

    def __init__(self, cramlm=None, objective="mlm", vocab_size=None, **kwargs):
        self.cramlm = dict(cramlm or {})
        self.objective = objective
        self.vocab_size = vocab_size
        kwargs.setdefault("tie_word_embeddings", False)  # config.json says whether the decoder is tied
        super().__init__(**kwargs)
'''

WRAPPERS = '''

# ---- transformers wrappers (written by `cramlm export hf`) ----------------------------------------

from types import SimpleNamespace

from transformers import PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput, MaskedLMOutput

from .configuration_cramlm import CramlmConfig


class CramlmPreTrainedModel(PreTrainedModel):
    config_class = CramlmConfig
    base_model_prefix = "trunk"

    @torch.no_grad()
    def _init_weights(self, module):
        # parameters come from the checkpoint; the fixed tables (not stored) are recomputed here
        if isinstance(module, PositionEmbedding) and module.kind != "learned":
            module.table.copy_(sinusoidal_table(*module.table.shape))
        elif isinstance(module, Rotary):
            module.inv_freq.copy_(module.inverse_frequencies())

    def _build(self, config, causal):
        self.arch = SimpleNamespace(**config.cramlm)
        self.trunk = Trunk(self.arch, config.vocab_size, causal=causal)

    def get_input_embeddings(self):
        return self.trunk.tokens


class CramlmForMaskedLM(CramlmPreTrainedModel):
    # a tied decoder is stored once, as the token embedding (with config.tie_word_embeddings)
    _tied_weights_keys = {"head.decoder.weight": "trunk.tokens.weight"}

    def __init__(self, config):
        super().__init__(config)
        self._build(config, causal=False)
        self.head = MLMHead(self.arch, config.vocab_size)
        if self.arch.tie_embeddings:
            self.head.decoder.weight = self.trunk.tokens.weight
        self.post_init()

    def get_output_embeddings(self):
        return self.head.decoder

    def forward(self, input_ids, attention_mask=None, labels=None, position_ids=None, document_ids=None,
                token_type_ids=None, **kwargs):
        hidden = self.trunk(input_ids, attention_mask, position_ids, document_ids, token_type_ids)
        logits = self.head(hidden)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)
        return MaskedLMOutput(loss=loss, logits=logits)


class CramlmForCausalLM(CramlmPreTrainedModel):
    _tied_weights_keys = {"lm_head.weight": "trunk.tokens.weight"}

    def __init__(self, config):
        super().__init__(config)
        self._build(config, causal=True)
        self.lm_head = nn.Linear(self.arch.hidden_size, config.vocab_size, bias=False)
        if self.arch.tie_embeddings:
            self.lm_head.weight = self.trunk.tokens.weight
        self.post_init()

    def get_output_embeddings(self):
        return self.lm_head

    def forward(self, input_ids, attention_mask=None, labels=None, position_ids=None, document_ids=None, **kwargs):
        logits = self.lm_head(self.trunk(input_ids, attention_mask, position_ids, document_ids))
        loss = None
        if labels is not None:
            shifted = logits[:, :-1].float().flatten(0, 1)
            loss = F.cross_entropy(shifted, labels[:, 1:].flatten(), ignore_index=IGNORE_INDEX)
        return CausalLMOutput(loss=loss, logits=logits)
'''


def export_remote(model: torch.nn.Module, out_dir: Path, special: dict[str, int]) -> str:
    """Write config.json, configuration_cramlm.py, modeling_cramlm.py and model.safetensors."""
    cfg = model.cfg
    mlm = cfg.objective == "mlm"
    cls = "CramlmForMaskedLM" if mlm else "CramlmForCausalLM"
    (out_dir / "configuration_cramlm.py").write_text(CONFIGURATION)
    (out_dir / "modeling_cramlm.py").write_text(inspect.getsource(layers) + WRAPPERS)
    auto = "AutoModelForMaskedLM" if mlm else "AutoModelForCausalLM"
    config = {
        "model_type": "cramlm",
        "architectures": [cls],
        "auto_map": {"AutoConfig": "configuration_cramlm.CramlmConfig", auto: f"modeling_cramlm.{cls}"},
        "objective": cfg.objective,
        "vocab_size": model.vocab_size,
        "pad_token_id": special.get("pad"),
        "bos_token_id": special.get("bos"),
        "eos_token_id": special.get("eos"),
        "tie_word_embeddings": cfg.tie_embeddings,
        "cramlm": cfg.model_dump(),
    }
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    # a tied decoder once, as in the run (the wrapper ties it again on loading); own storage each
    aliases = tied_aliases(model)
    weights = {name: t.detach().contiguous().clone() for name, t in model.state_dict().items() if name not in aliases}
    save_safetensors(weights, out_dir / "model.safetensors", metadata={"format": "pt"})
    return cls
