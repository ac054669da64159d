"""``cramlm eval``'s held-out language-model loss and bits per byte of a model on the held-out set
(``data/heldout.py`` defines the set, its masks and how the loss is counted: ``heldout-v1``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from cramlm.data.heldout import DEFINITION, HELDOUT_BATCH, HELDOUT_MLM_PROBABILITY, HeldOut

if TYPE_CHECKING:
    import torch

    from cramlm.eval.checkpoints import LMData


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


def lm_heldout(lm: LMData, val: str | Path | None = None, device: torch.device | str = "cpu", progress: bool = True) -> dict:
    """``heldout_eval`` of a cramlm run's model (a checkpoint's ``lm``) on the held-out set of ``val``
    (default: the run's own validation file), built from the data alone (data/heldout.py): the same
    sequences and masks for every recipe and machine."""
    from cramlm.data.cramtok import read_packed
    from cramlm.data.heldout import run_heldout_set

    val = Path(val or lm.val_path)
    sequences = run_heldout_set(lm.config, read_packed(val), lm.vocab_size, val)
    return heldout_eval(lm.model, sequences, device=device, progress=progress, objective=lm.objective)


def run_heldout(run_dir: str | Path, device: torch.device | str = "cpu") -> dict:
    """``cramlm eval``'s held-out numbers of the cramlm run folder ``run_dir`` (a name ending in
    -untrained: its untrained twin) on its own validation file, with ``run``: the folder. An RTD run
    is scored by its generator (labelled so); a run without its validation file, or an RTD run
    without its trained parts, raises FileNotFoundError."""
    from cramlm.eval.checkpoints import load_checkpoint

    lm = load_checkpoint(str(run_dir), ".").lm
    if lm is None or lm.val_path is None:
        raise FileNotFoundError(f"{run_dir}: the run's val.cramtok was not found")
    if lm.model is None:
        raise FileNotFoundError(f"{run_dir}: an RTD run without a checkpoint: its generator (the held-out loss) is gone")
    return {"run": str(run_dir), **lm_heldout(lm, device=device, progress=False)}


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
