"""crammed-bert (Geiping & Goldstein, 2022): a pre-norm BERT without biases, with a GELU-GLU
feed-forward, scaled sinusoidal positions and an MLM head evaluated only at masked positions.
Every architectural choice is a config field, so the original BERT (``arch=bert-original``) and a
ModernBERT-like encoder (``arch=crammed-bert-modern``) are presets of this same class. The layers
are in model.py, the config in config.py; this file is the registered MLM wrapper."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cramlm.config.registry import register
from cramlm.models.config import CrammedBertConfig, trunk_flops_per_token  # the config lives torch-free there
from cramlm.models.lm import TransformerLM
from cramlm.models.model import IGNORE_INDEX, MLMHead


class CrammedBert(TransformerLM):
    """Encoder (model.Trunk) + MLM head (model.MLMHead). ``encode`` gives hidden states for
    downstream heads (heads.py). Forward arguments and outputs: see ``forward``."""

    def __init__(self, cfg: CrammedBertConfig, vocab_size: int):
        super().__init__(cfg, vocab_size)
        self.head = MLMHead(cfg, vocab_size)
        self.init_and_tie(self.head.decoder)

    @property
    def decoder(self) -> nn.Linear:
        return self.head.decoder

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T)
        attention_mask: torch.Tensor | None = None,  # (B, T) 1 = token, 0 = padding
        labels: torch.Tensor | None = None,  # (B, T) the original token where scored, -100 elsewhere
        position_ids: torch.Tensor | None = None,  # (B, T); default: from document_ids, else 0..T-1
        document_ids: torch.Tensor | None = None,  # (B, T) packed documents: attention stays inside one
        token_type_ids: torch.Tensor | None = None,  # (B, T) when type_vocab_size > 0
    ) -> dict[str, torch.Tensor | None]:
        """{"loss", "logits"}, both keys always (the causal model's too):
        loss: mean cross-entropy over the scored positions (labels != -100); None without labels.
        logits: (B, T, V); None when sparse prediction computed the loss (labels given and
        ``cfg.sparse_prediction``): then only the scored positions go through the head, and the
        decoder and loss are fused (model.linear_cross_entropy), so outside torch.compile the (M, V) logits never
        exist at once."""
        hidden = self.encode(input_ids, attention_mask, position_ids, document_ids, token_type_ids)  # (B, T, H)
        if labels is not None and self.cfg.sparse_prediction:
            targets = labels.reshape(-1)  # (B*T,)
            picked = targets != IGNORE_INDEX  # about 15-25% of positions
            return {"loss": self.head.loss(hidden.reshape(-1, self.hidden_size)[picked], targets[picked]), "logits": None}
        logits = self.head(hidden)  # (B, T, V)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.float().view(-1, self.vocab_size), labels.view(-1), ignore_index=IGNORE_INDEX)
        return {"loss": loss, "logits": logits}

    def forward_flops_per_token(self, seq_len: int, predicted_fraction: float = 1.0) -> float:
        """Forward FLOPs per token. ``predicted_fraction``: share of positions scored (the masking
        rate); they alone go through the MLM head under sparse prediction, every position otherwise."""
        if not self.cfg.sparse_prediction:
            predicted_fraction = 1.0
        H = self.hidden_size
        head = (2 * H * H if self.cfg.head_transform else 0) + 2 * H * self.vocab_size
        return trunk_flops_per_token(self.cfg, seq_len) + predicted_fraction * head


@register("model", "crammed-bert", CrammedBertConfig)
def build_crammed_bert(cfg: CrammedBertConfig, vocab_size: int) -> CrammedBert:
    return CrammedBert(cfg, vocab_size)
