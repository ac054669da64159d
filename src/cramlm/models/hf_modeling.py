"""transformers wrappers around model.py for remote-code exports (written by `cramlm export hf`).

The exported ``modeling_cramlm.py`` is model.py's source followed by this file's source, with the
two cramlm imports marked ``# export:`` rewritten (model.py's names are then defined above; the
config comes from ``configuration_cramlm.py`` beside it). So the exported model runs the very code
that was trained, and the weights keep our names. Forward arguments are the cramlm models' own
(crammed_bert.py, gpt.py) plus transformers' ``**kwargs``."""

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput, MaskedLMOutput

from cramlm.models.hf_configuration import CramlmConfig  # export: from .configuration_cramlm import CramlmConfig
from cramlm.models.model import IGNORE_INDEX, MLMHead, PositionEmbedding, Rotary, Trunk, sinusoidal_table, soft_cap  # export: above


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
        hidden = self.trunk(input_ids, attention_mask, position_ids, document_ids, token_type_ids)  # (B, T, H)
        logits = self.head(hidden)  # (B, T, V)
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

    def forward(self, input_ids, attention_mask=None, labels=None, position_ids=None, document_ids=None,
                token_type_ids=None, **kwargs):
        hidden = self.trunk(input_ids, attention_mask, position_ids, document_ids, token_type_ids)  # (B, T, H)
        logits = soft_cap(self.lm_head(hidden), getattr(self.arch, "logit_softcap", None))  # (B, T, V)
        loss = None
        if labels is not None:
            shifted = logits[:, :-1].float().flatten(0, 1)
            loss = F.cross_entropy(shifted, labels[:, 1:].flatten(), ignore_index=IGNORE_INDEX)
        return CausalLMOutput(loss=loss, logits=logits)
