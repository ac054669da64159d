"""Validation sums: nats over the scored tokens, summed over batches, for pretraining's val_loss
(Trainer.validate) and `cramlm eval`'s held-out loss (data/heldout.py, which defines the sequences);
summed over processes, they give the same loss on any number of them (token-weighted)."""

from __future__ import annotations

import contextlib

import torch

from cramlm.constants import IGNORE_INDEX
from cramlm.progress import progress_bar


def _targets(objective: str, labels: torch.Tensor) -> torch.Tensor:
    """The scored targets of each sequence (a causal LM predicts labels[:, 1:])."""
    return labels[:, 1:] if objective == "clm" else labels


def scored_counts(objective: str, labels: torch.Tensor, text: torch.Tensor) -> tuple[int, int]:
    """(scored tokens, scored tokens that are text) of a batch."""
    targets = _targets(objective, labels)
    scored = targets != IGNORE_INDEX
    return int(scored.sum()), int((scored & _targets(objective, text)).sum())


def heldout_sums(model: torch.nn.Module, objective: str, batches, device: torch.device | str = "cpu",
                 autocast=None, progress: bool = False) -> torch.Tensor:
    """float64 (3,) device tensor: nats, scored tokens and scored text tokens summed over the
    ``(batch, counts)`` pairs of :meth:`cramlm.eval.lm.HeldOut.batches` (a batch that does not count adds 0)."""
    sums = torch.zeros(3, dtype=torch.float64, device=device)
    for batch, counts in progress_bar(iterable=batches, desc="held-out", enabled=progress, leave=False):
        scored, text = scored_counts(objective, batch["labels"], batch["text"])
        with autocast() if autocast else contextlib.nullcontext():
            loss = model(input_ids=batch["input_ids"].to(device), labels=batch["labels"].to(device))["loss"]
        if counts and scored:  # (a batch without scored tokens has a NaN mean loss: it adds nothing)
            sums[0] += loss.double() * scored
            sums[1] += scored
            sums[2] += text
    return sums
