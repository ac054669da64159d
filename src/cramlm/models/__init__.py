"""Models: plain nn.Modules built from registered configs."""

from cramlm.models import crammed_bert  # noqa: F401  (registers "crammed-bert")
from cramlm.models.base import ModelConfig, build_model

__all__ = ["ModelConfig", "build_model"]
