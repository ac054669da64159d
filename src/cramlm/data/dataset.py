"""Datasets over packed tokens, and a resumable shuffled batch stream."""

from __future__ import annotations

import numpy as np
import torch

from cramlm.data.packed import PackedTokens


class BlockDataset:
    """Fixed-length blocks cut across document boundaries (cramming / Modalities style).

    Block i is ``[CLS] + tokens[i*(L-1) : (i+1)*(L-1)]`` where L is ``seq_length``; documents are
    separated by the ``[SEP]`` that packing appends to each. The tail shorter than one block is
    not used (``unused_tail_tokens`` says how many tokens that is).
    """

    def __init__(self, packed: PackedTokens, seq_length: int, cls_id: int):
        self.packed = packed
        self.span = seq_length - 1
        self.cls_id = cls_id
        self.num_blocks = packed.num_tokens // self.span
        if self.num_blocks == 0:
            raise ValueError(f"{packed.path}: {packed.num_tokens} tokens, fewer than one sequence of {seq_length}")
        self.unused_tail_tokens = packed.num_tokens - self.num_blocks * self.span

    def __len__(self) -> int:
        return self.num_blocks

    def __getitem__(self, i: int) -> np.ndarray:
        start = i * self.span
        block = np.empty(self.span + 1, dtype=np.int64)
        block[0] = self.cls_id
        block[1:] = self.packed.tokens[start : start + self.span]
        return block

    def batch(self, indices: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.stack([self[int(i)] for i in indices]))


class ShuffledStream:
    """Endless stream of sample indices, a fresh seeded permutation each epoch.

    Its whole state is ``(epoch, position)``, so a checkpoint can save it and resume exactly.
    """

    def __init__(self, num_samples: int, seed: int):
        self.num_samples = num_samples
        self.seed = seed
        self.epoch = 0
        self.position = 0
        self._order = self._permutation()

    def _permutation(self) -> np.ndarray:
        return np.random.default_rng([self.seed, self.epoch]).permutation(self.num_samples)

    def take(self, count: int) -> np.ndarray:
        out = []
        while count:
            n = min(count, self.num_samples - self.position)
            out.append(self._order[self.position : self.position + n])
            self.position += n
            count -= n
            if self.position == self.num_samples:
                self.epoch += 1
                self.position = 0
                self._order = self._permutation()
        return np.concatenate(out)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._order = self._permutation()
