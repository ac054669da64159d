"""Models: plain nn.Modules built from registered configs (crammed-bert, gpt2, llama).

Importing this package does not import torch: the configs are declared in config.py and the
model modules (model.py: the layers; crammed_bert.py, gpt.py: the registered wrappers) are
imported by the registry on the first build."""

from cramlm.models.base import ModelConfig, build_model

__all__ = ["ModelConfig", "build_model"]
