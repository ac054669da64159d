"""Masked language modelling (BERT; ``train.objective=mlm``, the default for masked LMs): batches
masked at ``train.mlm_probability`` (80/10/10), the arch's own forward is the loss (cross-entropy
at the masked positions), its held-out loss the MLM loss on the heldout-v1 masks, its zero-shot
score the pseudo-log-likelihood, its export a masked LM."""

from __future__ import annotations

from cramlm.config.registry import register
from cramlm.models.objectives.base import Objective, Scorer, at_positions, masked_collator
from cramlm.models.objectives.config import MLMObjectiveConfig


@register("objective", "mlm", MLMObjectiveConfig)
class MaskedLM(Objective):
    name = "mlm"

    def collator(self, vocab_size: int, seed: int):
        return masked_collator(self.train, vocab_size, seed)

    def scorers(self, model) -> list[Scorer]:
        return [Scorer("pll", "mlm", at_positions(model.encode, model.head))]
