"""What every model config shares. Models are plain ``nn.Module``s: no training or distributed
logic inside; the trainer only calls ``model(**batch)["loss"]``."""

from __future__ import annotations

from typing import ClassVar

from cramlm.config.base import ComponentConfig


class ModelConfig(ComponentConfig):
    kind: ClassVar[str] = "model"
    max_seq_length: int = 128


def build_model(cfg: ModelConfig, vocab_size: int):
    """Build the registered model for ``cfg`` with the tokenizer's vocabulary size."""
    from cramlm.config.registry import build

    return build("model", cfg, vocab_size)
