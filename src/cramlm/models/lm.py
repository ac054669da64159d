"""What the registered language-model wrappers share (crammed_bert.py: the MLM; gpt.py: the causal
LM): the trunk (model.Trunk), an output layer tied to the token embedding, the weight init,
``encode`` for downstream heads and the training FLOPs. Each wrapper adds its head and loss."""

from __future__ import annotations

import torch
from torch import nn

from cramlm.models.model import Trunk, init_weights


class TransformerLM(nn.Module):
    causal = False  # the trunk's attention: bidirectional (encoders) or causal (decoders)

    def __init__(self, cfg, vocab_size: int):
        super().__init__()
        self.cfg = cfg
        self.hidden_size = cfg.hidden_size
        self.vocab_size = vocab_size
        self.trunk = Trunk(cfg, vocab_size, causal=self.causal)

    def init_and_tie(self, decoder: nn.Linear) -> None:
        """Initialise every weight (after the head exists), then tie ``decoder`` to the token embedding."""
        init_weights(self, self.cfg.init_std, self.cfg.init, self.cfg.num_layers, self.cfg.zero_init_out)
        if self.cfg.tie_embeddings:
            decoder.weight = self.trunk.tokens.weight

    @property
    def tokens(self) -> nn.Embedding:  # the token embedding (its weight is the tied decoder's)
        return self.trunk.tokens

    def encode(self, input_ids, attention_mask=None, position_ids=None, document_ids=None, token_type_ids=None) -> torch.Tensor:
        """(B, T) -> (B, T, H): the trunk's last hidden states."""
        return self.trunk(input_ids, attention_mask, position_ids, document_ids, token_type_ids)

    def forward_flops_per_token(self, seq_len: int, predicted_fraction: float = 1.0) -> float:
        raise NotImplementedError

    def flops_per_token(self, seq_len: int, predicted_fraction: float = 1.0) -> float:
        """Training FLOPs per token (forward + backward = 3 x forward: every matmul's backward is
        two matmuls of the same size, one for the input gradient, one for the weight gradient).
        ``predicted_fraction``: share of positions that go through the output head."""
        return 3 * self.forward_flops_per_token(seq_len, predicted_fraction)
