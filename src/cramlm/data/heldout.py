"""The held-out set (definition ``heldout-v1``): a number that depends only on the
prepared data, so two runs on the same data compare whatever their recipe, microbatch, precision
or number of processes.

- **Sequences.** The validation file (``val.cramtok``) cut into blocks as in pretraining
  (``[CLS]`` + seq_length-1 tokens for masked LMs, seq_length tokens for causal LMs). The held-out
  set is every block when they hold at most :data:`HELDOUT_TOKENS` tokens (2,048 sequences of 128,
  256 of 1,024), else that many blocks chosen by :data:`HELDOUT_SEED`; in both cases in the order
  of a permutation seeded by :data:`HELDOUT_SEED`, so that a prefix of it is a sample too.
- **Mask** (MLM). :data:`HELDOUT_MLM_PROBABILITY` of the non-special positions, BERT's 80/10/10
  corruption, drawn from counter-based random numbers keyed by (block, position) and the fixed
  seed: independent of the training seed, the training collator, the batching and the subset.
- **Loss.** Total nats over all scored tokens divided by their number (not a mean of batch
  means), in fp32, batched by :data:`HELDOUT_BATCH` sequences (any batch gives the same number).
- **Bits per byte.** The same nats / ln 2 / the UTF-8 bytes of text the scored tokens stand for:
  scored text tokens (targets that are not special tokens, e.g. not the document separator) times
  the validation split's bytes per text token (``manifest.json``: ``val.bytes`` over its text
  tokens). For a causal LM scored on the whole file that is the bytes of the file's text; for a
  masked LM it is the bytes of the masked positions, on average. Tokenizer-independent, so runs
  with different tokenizers compare; MLM and CLM bits per byte measure different tasks (the MLM
  sees both sides of a masked token) and are labelled with their objective wherever they meet.

Pretraining's ``val_loss`` (the run's own quick check during training) scores the first
``train.validate_sequences`` of these same sequences and masks, token-weighted the same way, in
the run's precision; ``cramlm eval`` writes the whole set as ``heldout`` in ``eval.json``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cramlm.constants import IGNORE_INDEX
from cramlm.data.permute import mix64, uniform
from cramlm.data.tokenizer import CLS_ID, MASK_ID, SPECIAL_TOKENS

if TYPE_CHECKING:
    import torch

    from cramlm.data.cramtok import PackedTokens

DEFINITION = "heldout-v1"
HELDOUT_TOKENS = 2**18  # the held-out set holds at most this many tokens of sequences
HELDOUT_SEED = 0  # chooses the sequences (when the file holds more) and draws the mask
HELDOUT_MLM_PROBABILITY = 0.15  # BERT's rate, for every MLM recipe (cramming trains at 0.25)
HELDOUT_BATCH = 16  # sequences per forward in `cramlm eval` (the loss does not depend on it)


def block_start(objective: str) -> int | None:
    """The token put before each pretraining sequence: [CLS] for masked LMs; none for causal LMs,
    whose sequences are plain windows of the token stream (documents end with the separator)."""
    return CLS_ID if objective == "mlm" else None


@dataclass
class HeldOut:
    """The held-out sequences, masked: ``input_ids``/``labels`` (N, T) int64, ``blocks`` (N,) their
    block numbers in the validation file; ``text`` (N, T) bool, the scored targets that are text
    (for bits per byte); ``bytes_per_token`` of the validation text (None when unknown)."""

    objective: str
    input_ids: torch.Tensor
    labels: torch.Tensor
    text: torch.Tensor
    blocks: np.ndarray
    file_blocks: int
    bytes_per_token: float | None = None

    def __len__(self) -> int:
        return len(self.input_ids)

    def first(self, n: int) -> HeldOut:
        """The first ``n`` sequences (pretraining's val_loss: ``train.validate_sequences``)."""
        return HeldOut(self.objective, self.input_ids[:n], self.labels[:n], self.text[:n], self.blocks[:n],
                       self.file_blocks, self.bytes_per_token)

    def batches(self, batch_size: int, world: int = 1, rank: int = 0) -> list[tuple[dict[str, torch.Tensor], bool]]:
        """This process's share as (batch, counts) pairs: every process gets the same number of
        batches (FSDP needs every process in every forward) of at most ``batch_size`` sequences;
        a process left without sequences (fewer sequences than processes) scores the first one
        with ``counts=False``, so that it takes part without being counted."""
        import torch

        n = len(self)
        per_batch = max(1, batch_size)
        count = max(1, math.ceil(n / (world * per_batch)))  # batches per process
        chunks = np.array_split(np.arange(n), world * count)[rank * count : (rank + 1) * count]
        out = []
        for chunk in chunks:
            counts = len(chunk) > 0
            idx = torch.as_tensor(chunk if counts else np.arange(min(1, n)))
            out.append(({"input_ids": self.input_ids[idx], "labels": self.labels[idx], "text": self.text[idx]}, counts))
        return out


def heldout_mask(ids: np.ndarray, blocks: np.ndarray, vocab_size: int, p: float = HELDOUT_MLM_PROBABILITY,
                 seed: int = HELDOUT_SEED) -> tuple[np.ndarray, np.ndarray]:
    """(corrupted ids, labels) of MLM blocks ``ids`` (N, T): ``p`` of the non-special positions
    chosen, 80% -> [MASK], 10% -> a random non-special token, 10% kept; labels -100 elsewhere.
    Every draw is a counter-based number of (seed, block, position), so block b's mask is the
    same whichever blocks are drawn with it."""
    n_special = len(SPECIAL_TOKENS)
    T = ids.shape[1]
    counter = (blocks.astype(np.uint64)[:, None] * np.uint64(T) + np.arange(T, dtype=np.uint64)[None, :]) * np.uint64(4)
    salt = mix64(np.uint64(seed))
    u_choose, u_roll, u_id = (uniform(counter + np.uint64(k) ^ salt) for k in range(3))
    chosen = (u_choose < p) & (ids >= n_special)
    labels = np.where(chosen, ids, IGNORE_INDEX)
    out = ids.copy()
    out[chosen & (u_roll < 0.8)] = MASK_ID
    random = chosen & (u_roll >= 0.8) & (u_roll < 0.9)
    out[random] = n_special + (u_id[random] * (vocab_size - n_special)).astype(np.int64)
    return out, labels


def heldout_set(val: PackedTokens | None, seq_length: int, objective: str, vocab_size: int,
                max_tokens: int = HELDOUT_TOKENS, special_ids: set[int] | None = None,
                bytes_per_token: float | None = None) -> HeldOut | None:
    """The held-out set of a validation file (see the module docstring); None when there is no
    file or it holds fewer tokens than one sequence. ``special_ids``: ids that are not text
    (default: cramlm's special tokens and ids below them); ``bytes_per_token``: of the text."""
    import torch

    from cramlm.data.dataset import BlockDataset
    from cramlm.data.permute import Permutation

    if val is None:
        return None
    try:
        blocks = BlockDataset(val, seq_length, block_start(objective))
    except ValueError:  # fewer tokens than one sequence
        return None
    count = min(len(blocks), max(1, max_tokens // seq_length))
    chosen = Permutation(len(blocks), HELDOUT_SEED)(np.arange(count))
    ids = np.stack([blocks[int(i)] for i in chosen])  # (N, T)
    special = np.isin(ids, sorted(special_ids if special_ids is not None else range(len(SPECIAL_TOKENS))))
    if objective == "mlm":
        inputs, labels = heldout_mask(ids, chosen, vocab_size)
    else:
        inputs, labels = ids, ids  # the model shifts the labels
    return HeldOut(objective, torch.from_numpy(inputs), torch.from_numpy(np.asarray(labels, np.int64)),
                   torch.from_numpy(~special), chosen, len(blocks), bytes_per_token)


def text_stats(val_path: Path | str | None) -> tuple[set[int] | None, float | None]:
    """(special ids, bytes per text token) of a validation file, from the ``manifest.json`` beside
    it; (None, None) where there is none (a file packed on its own: ``<out>.manifest.json``)."""
    manifest = Path(val_path).parent / "manifest.json" if val_path else None
    try:
        info = json.loads(manifest.read_text()) if manifest else {}
    except (OSError, ValueError):
        return None, None
    special = {int(i) for i in (info.get("special_ids") or {}).values()}
    if isinstance(info.get("separator_id"), int):
        special.add(info["separator_id"])
    split = info.get("val") or {}
    text_tokens = (split.get("tokens") or 0) - (split.get("copies_written") or 0)  # less one separator per document
    bpt = split["bytes"] / text_tokens if isinstance(split.get("bytes"), int) and text_tokens > 0 else None
    return (special or None), bpt


def run_heldout_set(cfg: Any, val: PackedTokens | None, vocab_size: int, val_path: Path | str | None = None) -> HeldOut | None:
    """:func:`heldout_set` of a pretraining config (``PretrainConfig``): only the data settings
    (sequence length, objective) enter, never the training or implementation ones."""
    special, bpt = text_stats(val_path if val_path is not None else getattr(val, "path", None))
    return heldout_set(val, cfg.data.seq_length, type(cfg.arch).objective, vocab_size,
                       special_ids=special, bytes_per_token=bpt)
