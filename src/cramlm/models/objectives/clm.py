"""Causal language modelling (GPT; what a causal arch trains): labels are the inputs (the model
shifts them), the arch's own forward is the loss, its held-out loss the next-token loss, its
zero-shot score the summed log-probability, its export a causal LM."""

from __future__ import annotations

from cramlm.config.registry import register
from cramlm.models.objectives.base import Objective, Scorer
from cramlm.models.objectives.config import CLMObjectiveConfig


@register("objective", "clm", CLMObjectiveConfig)
class CausalLM(Objective):
    name = "clm"
    auto_class = "AutoModelForCausalLM"

    def collator(self, vocab_size: int, seed: int):
        from cramlm.data.collate import causal_collate

        return causal_collate

    def scorers(self, model) -> list[Scorer]:
        return [Scorer("log-probability", "clm", lambda ids, mask: model(ids, mask)["logits"], full_logits=True)]
