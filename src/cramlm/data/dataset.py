"""Datasets over packed tokens, and a resumable shuffled sample stream.

- :class:`BlockDataset`: fixed blocks cut across documents (cramming / Modalities "continuous"),
  optionally with the document boundaries of every block (``document_ids`` and ``position_ids``
  per token), so a model can reset positions and mask attention across documents.
"""

from __future__ import annotations

import numpy as np
import torch

from cramlm.data.cramtok import PackedTokens
from cramlm.data.permute import Permutation


def _boundaries(packed: PackedTokens, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
    """(document index within the span, position within the span's piece of its document) of
    tokens[start:end]. A document cut by the span's start counts from the span's start: positions
    stay below the block length, which absolute position tables (arch.max_seq_length) need; RoPE
    sees the same relative positions either way."""
    positions = np.arange(start, end, dtype=np.uint64)
    doc = np.searchsorted(packed.offsets, positions, side="right") - 1
    first = np.maximum(packed.offsets[doc].astype(np.int64), start)
    return doc - doc[0], positions.astype(np.int64) - first


class BlockDataset:
    """Fixed-length blocks cut across document boundaries (cramming / Modalities style).

    Block i is ``[CLS] + tokens[i*(L-1) : (i+1)*(L-1)]`` where L is ``seq_length`` (``cls_id=None``:
    no prefix, ``tokens[i*L : (i+1)*L]``, e.g. for causal LMs); documents are separated by the
    separator that packing appends to each. The tail shorter than one block is not used
    (``unused_tail_tokens`` says how many tokens that is).
    """

    def __init__(self, packed: PackedTokens, seq_length: int, cls_id: int | None):
        self.packed = packed
        self.cls_id = cls_id
        self.span = seq_length - 1 if cls_id is not None else seq_length
        self.seq_length = seq_length
        self.num_blocks = packed.num_tokens // self.span
        if self.num_blocks == 0:
            raise ValueError(f"{packed.path}: {packed.num_tokens} tokens, fewer than one sequence of {seq_length}")
        self.unused_tail_tokens = packed.num_tokens - self.num_blocks * self.span

    def __len__(self) -> int:
        return self.num_blocks

    def __getitem__(self, i: int) -> np.ndarray:
        start = i * self.span
        if self.cls_id is None:
            return self.packed.tokens[start : start + self.span].astype(np.int64)
        block = np.empty(self.span + 1, dtype=np.int64)
        block[0] = self.cls_id
        block[1:] = self.packed.tokens[start : start + self.span]
        return block

    def boundaries(self, i: int) -> dict[str, np.ndarray]:
        """``document_ids`` (0, 1, ... within the block) and ``position_ids`` (reset at each
        document start) for block i; the [CLS] prefix belongs to the first document."""
        start = i * self.span
        docs, positions = _boundaries(self.packed, start, start + self.span)
        if self.cls_id is not None:  # [CLS] takes position 0 of the first document; shift it
            positions = positions + (docs == 0)
            docs, positions = np.concatenate([[0], docs]), np.concatenate([[0], positions])
        return {"document_ids": docs, "position_ids": positions}

    def batch(self, indices: np.ndarray) -> torch.Tensor:
        """int64[B, L] blocks."""
        return torch.from_numpy(np.stack([self[int(i)] for i in indices]))

    def batch_with_boundaries(self, indices: np.ndarray) -> dict[str, torch.Tensor]:
        rows = [self.boundaries(int(i)) for i in indices]
        return {"input_ids": self.batch(indices),
                **{k: torch.from_numpy(np.stack([r[k] for r in rows])) for k in ("document_ids", "position_ids")}}


class ShuffledStream:
    """Endless stream of sample indices: a fresh seeded permutation each epoch, computed on demand
    (a Feistel permutation: O(1) memory, whatever the dataset size).

    The stream is one global sequence (epoch after epoch), the same on every process: ``at(g)``
    gives the sample indices at global positions ``g`` without moving, so each process looks up
    only the positions of its own microbatches (``trainer.StepData``), and ``skip(n)`` moves every
    process past a whole step. Its whole state is how many indices were taken (``state_dict``), so
    a checkpoint can save it and resume exactly, on any number of processes.
    """

    def __init__(self, num_samples: int, seed: int):
        self.num_samples, self.seed = num_samples, seed
        self.step = 0  # indices taken: the next global position
        self._perms: dict[int, Permutation] = {}

    def _perm(self, epoch: int) -> Permutation:
        perm = self._perms.get(epoch)
        if perm is None:  # (a prefetch thread may look up positions too: no shared dict is mutated)
            perm = Permutation(self.num_samples, self.seed * 1_000_003 + epoch)
            self._perms = {epoch: perm}
        return perm

    def take(self, count: int) -> np.ndarray:
        """The next ``count`` sample indices (and move past them)."""
        out = self.at(self.step + np.arange(count, dtype=np.int64))
        self.skip(count)
        return out

    def skip(self, count: int) -> None:
        self.step += count

    def at(self, g: np.ndarray) -> np.ndarray:
        """Sample indices at global stream positions ``g`` (int64; the state does not change)."""
        g = np.asarray(g, dtype=np.int64)
        count = len(g)
        epochs, positions = g // self.num_samples, g % self.num_samples
        out = np.empty(count, np.int64)
        for epoch in np.unique(epochs).tolist():
            where = epochs == epoch
            out[where] = self._perm(epoch)(positions[where])
        return out

    @property
    def epoch(self) -> int:
        return self.step // self.num_samples

    @property
    def position(self) -> int:
        return self.step % self.num_samples

    def state_dict(self) -> dict:
        return {"step": self.step, "seed": self.seed, "epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])
