"""Task heads on top of an encoder that exposes ``encode(input_ids, attention_mask)`` and
``hidden_size``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SequenceClassifier(nn.Module):
    """Pooler (first token, dense, tanh; as BERT and cramming) -> dropout -> linear.
    ``num_labels == 1`` makes it a regressor trained with MSE."""

    def __init__(self, encoder: nn.Module, num_labels: int, dropout: float = 0.1, init_std: float = 0.02):
        super().__init__()
        self.encoder = encoder
        self.num_labels = num_labels
        H = encoder.hidden_size
        self.pooler = nn.Linear(H, H)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(H, num_labels)
        for layer in (self.pooler, self.classifier):
            nn.init.normal_(layer.weight, std=init_std)
            nn.init.zeros_(layer.bias)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        hidden = self.encoder.encode(input_ids, attention_mask)  # (B, T, H)
        pooled = torch.tanh(self.pooler(hidden[:, 0]))  # (B, H)
        logits = self.classifier(self.dropout(pooled))  # (B, C)
        out = {"logits": logits}
        if labels is not None:
            if self.num_labels == 1:
                out["loss"] = F.mse_loss(logits.squeeze(-1).float(), labels.float())
            else:
                out["loss"] = F.cross_entropy(logits.float(), labels)
        return out
