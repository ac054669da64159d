"""What every model config shares. Models are plain ``nn.Module``s: no training or distributed
logic inside; the trainer only calls ``model(**batch)["loss"]``."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from cramlm.config.base import ComponentConfig, PositiveInt


class ModelConfig(ComponentConfig):
    kind: ClassVar[str] = "model"
    # the pretraining objective the model's forward computes from a batch: masked LM (batch has
    # input_ids + labels with -100 at unscored positions) or causal LM (input_ids + labels shifted
    # inside the model). The data stage builds batches to match.
    objective: ClassVar[Literal["mlm", "clm"]] = "mlm"
    type: str = Field(description="the architecture: crammed-bert (masked LM: cramming, BERT, ModernBERT-like), "
                      "gpt2 or llama (causal LMs), or a plugin's registered name")
    max_seq_length: PositiveInt = Field(
        128, description="longest input in tokens the model accepts (sizes position tables; data.seq_length <= it)")


def takes_document_ids(model) -> bool:
    """Whether the model's forward accepts ``document_ids`` (cramlm's models do; a plugin may not)."""
    import inspect

    params = inspect.signature(model.forward).parameters.values()
    return any(p.name == "document_ids" or p.kind is p.VAR_KEYWORD for p in params)


def tied_aliases(model) -> dict[str, str]:
    """{alias: canonical} for parameters registered under several names (e.g. a decoder tied to
    the embedding); the canonical name is the first one in module order."""
    first: dict[int, str] = {}
    aliases = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            aliases[name] = first[id(p)]
        else:
            first[id(p)] = name
    return aliases


def build_model(cfg: ModelConfig, vocab_size: int):
    """Build the registered model for ``cfg`` with the tokenizer's vocabulary size."""
    from cramlm.config.registry import build

    return build("model", cfg, vocab_size)
