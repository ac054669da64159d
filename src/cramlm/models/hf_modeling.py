"""transformers wrappers around model.py for remote-code exports (written by `cramlm export hf`).

The exported ``modeling_cramlm.py`` is model.py's source followed by this file's source, with the
cramlm imports marked ``# export:`` rewritten (model.py's names are then defined above, heads.py's
``pool`` is copied in; the config comes from ``configuration_cramlm.py`` beside it). So the exported
model runs the very code that was trained, and the weights keep our names. Forward arguments are
the cramlm models' own (crammed_bert.py, gpt.py) plus transformers' ``**kwargs``.

Besides the LM classes, the fine-tuning classes transformers' Auto classes, ``pipeline`` and
``Trainer`` look for: ``CramlmForSequenceClassification`` (cramlm's eval head, heads.py) and, for
masked LMs, ``CramlmForTokenClassification``; their head weights are new (initialised here).
An ELECTRA (rtd) run exports ``CramlmForPreTraining`` (the discriminator with its trained detector
head) and, in ``generator/``, ``CramlmGeneratorForMaskedLM`` (its generator, the masked LM it trained);
a hybrid (GPT-BERT) run ``CramlmHybridForMaskedLM`` and ``CramlmHybridForCausalLM`` over the same weights."""

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput, MaskedLMOutput, SequenceClassifierOutput, TokenClassifierOutput

from cramlm.models.heads import pool  # export: copied in
from cramlm.models.hf_configuration import CramlmConfig  # export: from .configuration_cramlm import CramlmConfig
from cramlm.models.model import ACTIVATIONS, IGNORE_INDEX, MLMHead, PositionEmbedding, Rotary, Trunk, make_norm, sinusoidal_table, soft_cap  # export: above


def masked_loss(logits, labels):
    """Cross-entropy of ``logits[:, t]`` against token t's label (IGNORE_INDEX where none: a token not
    masked, or not labelled)."""
    return None if labels is None else F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)


def causal_loss(logits, labels):
    """Cross-entropy of ``logits[:, t]`` against token t + 1's label (transformers' causal convention)."""
    if labels is None:
        return None
    return F.cross_entropy(logits[:, :-1].float().flatten(0, 1), labels[:, 1:].flatten(), ignore_index=IGNORE_INDEX)


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
        elif isinstance(module, nn.Linear) and any(module is getattr(self, n, None) for n in ("pooler", "classifier")):
            # a fine-tuning head (not in the pretrained checkpoint): as heads.py initialises it
            nn.init.normal_(module.weight, std=self.arch.init_std)
            nn.init.zeros_(module.bias)

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
        return MaskedLMOutput(loss=masked_loss(logits, labels), logits=logits)


class NoCacheGeneration(GenerationMixin):
    """``generate`` and the text-generation pipeline without a key-value cache: the trunk keeps no keys
    and values, so each new token runs the whole sequence again (fine at the sizes cramlm trains)."""

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, **kwargs):
        return {"input_ids": input_ids, "attention_mask": attention_mask}


class CramlmForCausalLM(CramlmPreTrainedModel, NoCacheGeneration):
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
        return CausalLMOutput(loss=causal_loss(logits, labels), logits=logits)


class CramlmHybridForMaskedLM(CramlmForMaskedLM):
    """GPT-BERT's masked mode (cramlm's hybrid objective): bidirectional attention, the token at i
    predicted at position i - 1 (masked next-token prediction); ``logits`` are shifted so that
    ``logits[:, i]`` are token i's, as any masked LM's (fill-mask works). Position 0 (the [CLS]
    token, never masked) keeps its own."""

    def forward(self, input_ids, attention_mask=None, labels=None, position_ids=None, document_ids=None,
                token_type_ids=None, **kwargs):
        hidden = self.trunk(input_ids, attention_mask, position_ids, document_ids, token_type_ids)  # (B, T, H)
        logits = self.head(hidden)  # (B, T, V): at t, token t + 1's
        logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)  # at t, token t's
        return MaskedLMOutput(loss=masked_loss(logits, labels), logits=logits)


class CramlmHybridForCausalLM(CramlmForMaskedLM, NoCacheGeneration):
    """GPT-BERT's causal mode (cramlm's hybrid objective): the same weights with causal attention;
    ``logits[:, t]`` are token t + 1's."""

    def __init__(self, config):
        super().__init__(config)
        self.trunk.causal = True

    def forward(self, input_ids, attention_mask=None, labels=None, position_ids=None, document_ids=None,
                token_type_ids=None, **kwargs):
        hidden = self.trunk(input_ids, attention_mask, position_ids, document_ids, token_type_ids)  # (B, T, H)
        logits = self.head(hidden)  # (B, T, V)
        return CausalLMOutput(loss=causal_loss(logits, labels), logits=logits)


class CramlmForPreTraining(CramlmPreTrainedModel):
    """ELECTRA's discriminator (cramlm's models/objectives/rtd.py): the encoder and its replaced-token detector
    (dense, GELU, dense -> 1), as trained. ``logits`` (B, T): > 0 where a token looks replaced;
    ``labels`` (B, T): 1 replaced, 0 original (binary cross-entropy over the attended positions)."""

    def __init__(self, config):
        super().__init__(config)
        self._build(config, causal=False)
        H = self.arch.hidden_size
        self.detector = nn.Sequential(nn.Linear(H, H), nn.GELU(), nn.Linear(H, 1))
        self.post_init()

    def forward(self, input_ids, attention_mask=None, labels=None, position_ids=None, document_ids=None,
                token_type_ids=None, **kwargs):
        hidden = self.trunk(input_ids, attention_mask, position_ids, document_ids, token_type_ids)  # (B, T, H)
        logits = self.detector(hidden).squeeze(-1)  # (B, T)
        loss = None
        if labels is not None:
            counted = attention_mask.bool() if attention_mask is not None else torch.ones_like(labels, dtype=torch.bool)
            loss = F.binary_cross_entropy_with_logits(logits[counted].float(), labels[counted].float())
        return TokenClassifierOutput(loss=loss, logits=logits)


class CramlmGeneratorForMaskedLM(CramlmPreTrainedModel):
    """ELECTRA's generator (cramlm's models/objectives/rtd.py Generator): a narrow masked LM on the discriminator's
    token embedding of width ``config.embedding_size``: embedding -> (H -> h) -> trunk of width h ->
    (h -> H) dense + activation + norm -> logits against the same embedding."""

    def __init__(self, config):
        super().__init__(config)
        self._build(config, causal=False)
        H, h = config.embedding_size, self.arch.hidden_size
        self.trunk.tokens = nn.Sequential(nn.Embedding(config.vocab_size, H), nn.Linear(H, h, bias=False))
        self.dense = nn.Linear(h, H, bias=self.arch.bias)
        self.act = ACTIVATIONS[self.arch.activation]
        self.norm = make_norm(self.arch.norm, H, self.arch.norm_eps, self.arch.norm_bias)
        self.post_init()

    def get_input_embeddings(self):
        return self.trunk.tokens[0]

    def forward(self, input_ids, attention_mask=None, labels=None, position_ids=None, document_ids=None,
                token_type_ids=None, **kwargs):
        hidden = self.trunk(input_ids, attention_mask, position_ids, document_ids, token_type_ids)  # (B, T, h)
        logits = self.norm(self.act(self.dense(hidden))) @ self.trunk.tokens[0].weight.T  # (B, T, V)
        return MaskedLMOutput(loss=masked_loss(logits, labels), logits=logits)


def classification_loss(config, logits, labels):
    """transformers' convention: regression for one label, else single- or multi-label by ``problem_type``
    (inferred from the labels' dtype when unset)."""
    if config.problem_type is None:
        if config.num_labels == 1:
            config.problem_type = "regression"
        elif labels.dtype in (torch.long, torch.int):
            config.problem_type = "single_label_classification"
        else:
            config.problem_type = "multi_label_classification"
    if config.problem_type == "regression":
        return F.mse_loss(logits.squeeze(-1).float(), labels.float().view(-1)) if config.num_labels == 1 else \
            F.mse_loss(logits.float(), labels.float())
    if config.problem_type == "single_label_classification":
        return F.cross_entropy(logits.float().view(-1, config.num_labels), labels.view(-1), ignore_index=IGNORE_INDEX)
    return F.binary_cross_entropy_with_logits(logits.float(), labels.float())


class CramlmForSequenceClassification(CramlmPreTrainedModel):
    """cramlm's eval head (heads.py's SequenceClassifier, cramming's GLUE head): pooled state -> dense
    -> tanh -> dropout -> linear. ``config.classifier_pooling``: ``first`` token (cramming, BERT; the
    default of a masked LM), ``mean`` over non-padding tokens (cramlm's ``default`` eval preset), or
    ``last`` real token (the default of a causal LM: the only position that has seen the whole input).
    The dense width is the architecture's ``pooler_size`` (crammed-bert: 1024), else the hidden size."""

    def __init__(self, config):
        super().__init__(config)
        self.num_labels = config.num_labels
        self._build(config, causal=config.objective == "clm")
        H = self.arch.hidden_size
        width = getattr(self.arch, "pooler_size", None) or H
        self.pooler = nn.Linear(H, width)
        self.dropout = nn.Dropout(config.classifier_dropout)
        self.classifier = nn.Linear(width, config.num_labels)
        self.post_init()

    def forward(self, input_ids, attention_mask=None, labels=None, position_ids=None, document_ids=None,
                token_type_ids=None, **kwargs):
        hidden = self.trunk(input_ids, attention_mask, position_ids, document_ids, token_type_ids)  # (B, T, H)
        pooling = self.config.classifier_pooling or ("last" if self.config.objective == "clm" else "first")
        pooled = torch.tanh(self.pooler(pool(hidden, attention_mask, pooling)))  # (B, W)
        logits = self.classifier(self.dropout(pooled))  # (B, C)
        loss = None if labels is None else classification_loss(self.config, logits, labels)
        return SequenceClassifierOutput(loss=loss, logits=logits)


class CramlmForTokenClassification(CramlmPreTrainedModel):
    """A label per token (NER, POS): hidden state -> dropout -> linear, as BertForTokenClassification."""

    def __init__(self, config):
        super().__init__(config)
        self.num_labels = config.num_labels
        self._build(config, causal=config.objective == "clm")
        self.dropout = nn.Dropout(config.classifier_dropout)
        self.classifier = nn.Linear(self.arch.hidden_size, config.num_labels)
        self.post_init()

    def forward(self, input_ids, attention_mask=None, labels=None, position_ids=None, document_ids=None,
                token_type_ids=None, **kwargs):
        hidden = self.trunk(input_ids, attention_mask, position_ids, document_ids, token_type_ids)  # (B, T, H)
        logits = self.classifier(self.dropout(hidden))  # (B, T, C)
        return TokenClassifierOutput(loss=masked_loss(logits, labels), logits=logits)
