"""Pretraining collation: masked LM (BERT's 80/10/10 corruption, never touching special tokens) and
causal LM (labels are the inputs; the model shifts them)."""

from __future__ import annotations

import torch

from cramlm.constants import IGNORE_INDEX


class MLMCollator:
    """Choose ``mlm_probability`` of the non-special positions; of those, 80% become [MASK], 10% a
    random non-special token, 10% stay. Labels are the original ids there and -100 elsewhere."""

    def __init__(self, vocab_size: int, mask_id: int, num_special: int, mlm_probability: float, seed: int = 0):
        if not 0.0 < mlm_probability < 1.0:
            raise ValueError(f"mlm_probability must be in (0, 1), got {mlm_probability}")
        self.vocab_size = vocab_size
        self.mask_id = mask_id
        self.num_special = num_special  # ids below this are special: [PAD] [UNK] [CLS] [SEP] [MASK]
        self.p = mlm_probability
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, batch) -> dict[str, torch.Tensor]:
        """``batch``: int64 (B, T) ids, or a dict with ``input_ids`` and whatever else the dataset
        gives (document-aware packing: document_ids, position_ids, attention_mask), passed through;
        positions where ``attention_mask`` is 0 are never chosen."""
        g = self.generator
        out = dict(batch) if isinstance(batch, dict) else {}
        input_ids = (batch["input_ids"] if isinstance(batch, dict) else batch).clone()
        special = input_ids < self.num_special
        if "attention_mask" in out:
            special |= out["attention_mask"] == 0
        chosen = (torch.rand(input_ids.shape, generator=g) < self.p) & ~special
        labels = torch.where(chosen, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
        roll = torch.rand(input_ids.shape, generator=g)
        to_mask = chosen & (roll < 0.8)
        to_random = chosen & (roll >= 0.8) & (roll < 0.9)
        random_ids = torch.randint(self.num_special, self.vocab_size, input_ids.shape, generator=g)
        input_ids[to_mask] = self.mask_id
        input_ids[to_random] = random_ids[to_random]
        out.update(input_ids=input_ids, labels=labels)
        return out

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])


def causal_collate(batch) -> dict[str, torch.Tensor]:
    """CLM batches: labels = input_ids (the model shifts them). ``batch``: int64 (B, T) ids, or a dict
    with ``input_ids`` and the blocks' document boundaries (train.document_attention), passed through."""
    out = dict(batch) if isinstance(batch, dict) else {"input_ids": batch}
    out["labels"] = out["input_ids"]
    return out
