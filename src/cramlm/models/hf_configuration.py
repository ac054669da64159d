"""cramlm model config for transformers (written by `cramlm export hf`).

``cramlm export hf`` copies this file verbatim as ``configuration_cramlm.py`` into remote-code
exports (see hf_remote.py), so it imports nothing from cramlm."""

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
