"""Task heads on top of an encoder that exposes ``encode(input_ids, attention_mask, position_ids=,
document_ids=, token_type_ids=)`` and ``hidden_size``. (The pretraining heads are not here: the
MLM head is ``MLMHead`` in model.py, the causal LM head a linear layer in gpt.py.)"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn



def pool(hidden: torch.Tensor, attention_mask: torch.Tensor | None, how: str) -> torch.Tensor:
    """(B, T, H) -> (B, H): the first token ([CLS]), the mean over non-padding tokens, or the last
    non-padding token (padding on the right; a causal LM's summary of the whole input). Copied
    verbatim into remote-code exports (hf_remote.py), so it uses nothing but torch."""
    if how == "first":
        return hidden[:, 0]
    if how == "last":
        if attention_mask is None:
            return hidden[:, -1]
        last = (attention_mask.sum(dim=1) - 1).clamp(min=0)  # (B,)
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    if how == "mean":
        if attention_mask is None:
            return hidden.mean(dim=1)
        weights = attention_mask.to(hidden.dtype)[..., None]  # (B, T, 1)
        return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
    raise ValueError(f"unknown pooling '{how}'")


class SequenceClassifier(nn.Module):
    """Pooler (first token or mean, then dense + tanh; as BERT and cramming) -> dropout -> linear.
    ``num_labels == 1`` makes it a regressor trained with MSE. The pooler's width is
    ``pooler_size``, else the encoder config's ``pooler_size`` (crammed-bert: 1024, cramming's
    GLUE-sane head), else the hidden size (BERT's pooler)."""

    def __init__(
        self,
        encoder: nn.Module,
        num_labels: int,
        dropout: float = 0.1,
        init_std: float = 0.02,
        pooling: Literal["first", "mean", "last"] = "first",
        pooler_size: int | None = None,
    ):
        super().__init__()
        self.encoder = encoder
        self.num_labels = num_labels
        self.pooling = pooling
        H = encoder.hidden_size
        width = pooler_size or getattr(getattr(encoder, "cfg", None), "pooler_size", None) or H
        self.pooler = nn.Linear(H, width)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(width, num_labels)
        for layer in (self.pooler, self.classifier):
            nn.init.normal_(layer.weight, std=init_std)
            nn.init.zeros_(layer.bias)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **inputs,
    ) -> dict[str, torch.Tensor]:
        hidden = self.encoder.encode(input_ids, attention_mask, **inputs)  # (B, T, H)
        pooled = torch.tanh(self.pooler(pool(hidden, attention_mask, self.pooling)))  # (B, H)
        logits = self.classifier(self.dropout(pooled))  # (B, C)
        out = {"logits": logits}
        if labels is not None:
            if self.num_labels == 1:
                out["loss"] = F.mse_loss(logits.squeeze(-1).float(), labels.float())
            else:
                out["loss"] = F.cross_entropy(logits.float(), labels)
        return out
