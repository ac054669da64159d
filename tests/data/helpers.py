"""Helpers of the data tests: padded batches of whole documents (the padding and document-mask paths
of the collator and the model, which BlockDataset never pads)."""

from __future__ import annotations

from array import array

import numpy as np
import torch

from cramlm.data.cramtok import PackedTokens
from cramlm.data.dataset import _boundaries


class DocumentPackedDataset:
    """Whole documents packed into blocks of at most ``seq_length`` tokens, padded with ``pad_id``.

    Documents are taken in order and a block is closed when the next document does not fit; a
    document longer than a block is split into ``seq_length`` pieces. So every block is a
    contiguous token range (``starts[k]:starts[k+1]``), O(blocks) memory. Items carry
    ``document_ids`` (-1 on padding), ``position_ids`` (reset per document; 0 on padding) and
    ``attention_mask``.
    """

    def __init__(self, packed: PackedTokens, seq_length: int, pad_id: int):
        self.packed, self.seq_length, self.pad_id = packed, seq_length, pad_id
        starts, fill = array("q", [0]), 0  # 8 bytes per block while building
        for length in packed.lengths().tolist():
            if fill and fill + length > seq_length:  # close the current block
                starts.append(starts[-1] + fill)
                fill = 0
            while length > seq_length:  # a long document: full pieces of its own
                starts.append(starts[-1] + fill + seq_length)
                length -= seq_length
                fill = 0
            fill += length
        if fill:
            starts.append(starts[-1] + fill)
        self.starts = np.frombuffer(starts, np.int64).copy()
        if len(self.starts) < 2:
            raise ValueError(f"{packed.path}: no tokens to pack")
        self.padding_tokens = int((seq_length - np.diff(self.starts)).sum())

    def __len__(self) -> int:
        return len(self.starts) - 1

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        start, end = int(self.starts[i]), int(self.starts[i + 1])
        n, L = end - start, self.seq_length
        input_ids = np.full(L, self.pad_id, np.int64)
        input_ids[:n] = self.packed.tokens[start:end]
        docs, positions = _boundaries(self.packed, start, end)
        document_ids, position_ids = np.full(L, -1, np.int64), np.zeros(L, np.int64)
        document_ids[:n], position_ids[:n] = docs, positions
        return {"input_ids": input_ids, "document_ids": document_ids, "position_ids": position_ids,
                "attention_mask": (document_ids >= 0).astype(np.int64)}

    def batch(self, indices: np.ndarray) -> dict[str, torch.Tensor]:
        rows = [self[int(i)] for i in indices]
        return {k: torch.from_numpy(np.stack([r[k] for r in rows])) for k in rows[0]}

