"""``cramlm eval``'s held-out language-model loss and bits per byte of a model on the held-out set
(``data/heldout.py`` defines the set, its masks and how the loss is counted: ``heldout-v1``)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from cramlm.data.heldout import DEFINITION, HELDOUT_BATCH, HELDOUT_MLM_PROBABILITY, HeldOut

if TYPE_CHECKING:
    import torch


def heldout_eval(model: torch.nn.Module, heldout: HeldOut | None, device: torch.device | str = "cpu",
                 batch_size: int = HELDOUT_BATCH, progress: bool = True, objective: str | None = None) -> dict:
    """``cramlm eval``'s held-out numbers of ``model`` (fp32, one process): loss (nats per scored
    token), bits per byte (None when the byte count is unknown), CLM perplexity, and what was scored.
    ``objective``: the run's objective where it is not the held-out set's kind (mlm or clm), e.g.
    rtd (ELECTRA: its loss on the MLM masks is its generator's MLM loss): reported under that name,
    with what scored it, so that it is never read as an MLM run's."""
    import torch

    if heldout is None or not len(heldout):
        raise ValueError("no held-out sequences: the validation file is shorter than one sequence")
    model = model.to(device).eval()
    from cramlm.train.validation import heldout_sums

    with torch.inference_mode():
        sums = heldout_sums(model, heldout.objective, heldout.batches(batch_size), device, progress=progress)
    out = summarize(heldout, *sums.tolist())
    if objective is not None and objective != heldout.objective:
        from cramlm.config.registry import config_class

        out.update(objective=objective, scored_by=config_class("objective", objective).heldout_scored_by)
    return out


def summarize(heldout: HeldOut, nats: float, scored: float, text: float) -> dict:
    """The record ``cramlm eval`` writes (``heldout`` in eval.json) from the summed nats and counts."""
    loss = nats / scored
    bpb = nats / math.log(2) / (text * heldout.bytes_per_token) if heldout.bytes_per_token and text else None
    out = {"definition": DEFINITION, "objective": heldout.objective, "loss": loss, "bpb": bpb,
           "scored_tokens": int(scored), "sequences": len(heldout), "file_sequences": heldout.file_blocks,
           "bytes_per_token": heldout.bytes_per_token}
    if heldout.objective == "mlm":
        out["mask_probability"] = HELDOUT_MLM_PROBABILITY
    else:
        out["perplexity"] = math.exp(loss)
    return out
