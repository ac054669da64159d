"""cramlm model config for transformers (written by `cramlm export hf`).

``cramlm export hf`` copies this file verbatim as ``configuration_cramlm.py`` into remote-code
exports (see hf_remote.py), so it imports nothing from cramlm."""

from transformers import PretrainedConfig


class CramlmConfig(PretrainedConfig):
    """Holds cramlm's own architecture fields under ``cramlm`` (see cramlm's docs/models.md)."""

    model_type = "cramlm"

    def __init__(self, cramlm=None, objective="mlm", vocab_size=None, classifier_pooling=None, classifier_dropout=0.1,
                 **kwargs):
        self.cramlm = dict(cramlm or {})
        self.objective = objective
        self.vocab_size = vocab_size
        # the sequence-classification head (CramlmForSequenceClassification): "first", "mean" or "last"
        # (None: "first" for a masked LM, "last" for a causal LM) and its dropout
        self.classifier_pooling = classifier_pooling
        self.classifier_dropout = classifier_dropout
        kwargs.setdefault("tie_word_embeddings", False)  # config.json says whether the decoder is tied
        super().__init__(**kwargs)
