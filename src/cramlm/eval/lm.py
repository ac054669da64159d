"""Held-out language-model evaluation on a packed validation file (``val.cramtok``).

MLM models: mean cross-entropy over masked positions, with a fixed-seed mask (the same positions
for every checkpoint of a run, so numbers compare). CLM models: mean next-token loss and its
perplexity. Sequences are cut as in pretraining (``[CLS]`` + seq_length-1 tokens).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from cramlm.data.collate import MLMCollator
from cramlm.data.dataset import BlockDataset
from cramlm.data.packed import read_packed
from cramlm.data.tokenizer import CLS_ID, MASK_ID, SPECIAL_TOKENS
from cramlm.models.crammed_bert import IGNORE_INDEX
from cramlm.progress import progress_bar


@torch.inference_mode()
def lm_eval(
    model: torch.nn.Module,
    objective: str,
    val_path: Path,
    seq_length: int,
    mlm_probability: float = 0.25,
    max_sequences: int | None = 512,
    batch_size: int = 32,
    device: torch.device | str = "cpu",
    seed: int = 0,
    progress: bool = True,
) -> dict:
    packed = read_packed(val_path)
    dataset = BlockDataset(packed, seq_length, CLS_ID)
    n = min(len(dataset), max_sequences or len(dataset))
    indices = np.linspace(0, len(dataset) - 1, n).astype(np.int64)  # spread over the whole file
    collator = MLMCollator(packed.vocab_size, MASK_ID, len(SPECIAL_TOKENS), mlm_probability, seed)
    model = model.to(device).eval()
    total_loss, total_tokens = 0.0, 0
    for start in progress_bar(iterable=range(0, n, batch_size), desc="LM eval", enabled=progress, leave=False):
        input_ids = dataset.batch(indices[start : start + batch_size])  # (B, T)
        if objective == "mlm":
            batch = collator(input_ids)
            scored = int((batch["labels"] != IGNORE_INDEX).sum())
        else:
            batch = {"input_ids": input_ids, "labels": input_ids}
            scored = input_ids.numel() - input_ids.shape[0]  # every position but the first is predicted
        loss = model(**{k: v.to(device) for k, v in batch.items()})["loss"].float().item()
        total_loss += loss * scored
        total_tokens += scored
    mean = total_loss / max(1, total_tokens)
    out = {"objective": objective, "loss": mean, "sequences": n, "scored_tokens": total_tokens, "file": str(val_path)}
    if objective == "clm":
        out["perplexity"] = math.exp(mean)
    return out
