"""Models: plain nn.Modules built from registered configs (crammed-bert, gpt2, llama)."""

from cramlm.models import crammed_bert, gpt  # noqa: F401  (register the model types)
from cramlm.models.base import ModelConfig, build_model

__all__ = ["ModelConfig", "build_model"]
