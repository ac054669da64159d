"""The held-out language-model loss: one definition for pretraining's ``val_loss`` and for
``cramlm eval``'s LM loss, so the same checkpoint gets the same number from both.

The held-out set is the first sequences of the packed validation file (``val.cramtok``), cut as
in pretraining (``[CLS]`` + seq_length-1 tokens for masked LMs, seq_length tokens for causal
LMs), in ``train.validate_batches`` microbatches of up to ``impl.microbatch_size`` sequences
(smaller on a small validation file, so that there are that many). MLM batches are masked once,
by a generator seeded with the run's ``seed + 1``. The loss is the mean of the microbatch losses
(each the model's mean over its scored positions); CLM also gets the perplexity, exp(loss).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from cramlm.data.tokenizer import CLS_ID, MASK_ID, SPECIAL_TOKENS

if TYPE_CHECKING:
    import torch

    from cramlm.data.cramtok import PackedTokens


def block_start(objective: str) -> int | None:
    """The token put before each pretraining sequence: [CLS] for masked LMs; none for causal LMs,
    whose sequences are plain windows of the token stream (documents end with the separator)."""
    return CLS_ID if objective == "mlm" else None


def held_out_batches(
    val: PackedTokens | None,
    seq_length: int,
    objective: str,
    vocab_size: int,
    mlm_probability: float,
    seed: int,
    batches: int,
    microbatch_size: int,
) -> list[dict[str, torch.Tensor]]:
    """The held-out microbatches (see the module docstring); [] when there is no validation file
    or it holds fewer tokens than one sequence."""
    from cramlm.data.collate import MLMCollator, causal_collate
    from cramlm.data.dataset import BlockDataset

    if val is None or batches <= 0:
        return []
    try:
        blocks = BlockDataset(val, seq_length, block_start(objective))
    except ValueError:  # fewer tokens than one sequence
        return []
    # a smaller microbatch on a small validation file, so that there are `batches` of them to
    # share among processes (the same set on any process count)
    size = max(1, min(microbatch_size, len(blocks) // batches))
    count = min(batches, len(blocks) // size)
    if objective == "mlm":
        collate = MLMCollator(vocab_size, MASK_ID, len(SPECIAL_TOKENS), mlm_probability, seed)
    else:
        collate = causal_collate
    return [collate(blocks.batch(range(i * size, (i + 1) * size))) for i in range(count)]


def run_held_out_batches(cfg: Any, val: PackedTokens | None, vocab_size: int) -> list[dict[str, torch.Tensor]]:
    """:func:`held_out_batches` with the settings of a pretraining config (``PretrainConfig``)."""
    return held_out_batches(val, cfg.data.seq_length, type(cfg.arch).objective, vocab_size, cfg.train.mlm_probability,
                            cfg.seed + 1, cfg.train.validate_batches, cfg.impl.microbatch_size)


def lm_eval(
    model: torch.nn.Module,
    objective: str,
    batches: list[dict[str, torch.Tensor]],
    device: torch.device | str = "cpu",
    progress: bool = True,
) -> dict:
    """The held-out loss of ``model`` on ``batches`` (from :func:`held_out_batches`)."""
    import torch

    from cramlm.progress import progress_bar

    if not batches:
        raise ValueError("no held-out sequences: the validation file is shorter than one sequence")
    model = model.to(device).eval()
    total = 0.0
    with torch.inference_mode():
        for batch in progress_bar(iterable=batches, desc="LM eval", enabled=progress, leave=False):
            total += model(**{k: v.to(device) for k, v in batch.items()})["loss"].float().item()
    mean = total / len(batches)
    out = {"objective": objective, "loss": mean, "sequences": sum(len(b["input_ids"]) for b in batches),
           "batches": len(batches)}
    if objective == "clm":
        out["perplexity"] = math.exp(mean)
    return out
