"""Pretraining collation: masked LM (BERT's 80/10/10 corruption, never touching special tokens) and
causal LM (labels are the inputs; the model shifts them).

MLM masks are keyed: ``collator(batch, positions)``, where ``positions[b]`` is sequence b's position
in the global shuffled stream (``dataset.ShuffledStream``). Every random number is a counter-based
hash of (seed, position, token index) (splitmix64, ``permute.mix64``), so a sequence's masks depend
on nothing else: not on which process collates it, the microbatch size, the number of processes, or
what was drawn before. Any process can mask any slice of the stream on its own, vectorised (a few
numpy passes over the tokens; one thread: 0.12 / 0.29 / 1.95 ms for 8 / 128 / 1024 sequences of
128), and the collator has no state to save. A batch given without positions (a sample, a test) is
masked as the stream's first B sequences.
"""

from __future__ import annotations

import numpy as np
import torch

from cramlm.constants import IGNORE_INDEX
from cramlm.data.permute import mix64

_U = np.uint64
_GOLDEN = _U(0x9E3779B97F4A7C15)  # splitmix64's increment: token t of a sequence is counter t
_LOW32 = _U(0xFFFFFFFF)
_RANDOM_ID_SALT = _U(0xD1B54A32D192ED03)  # a second, independent word for the random replacement id
_SAMPLE_SALT = _U(0x8CB92BA72F3D8DD7)  # a third one: the uniform the RTD generator samples with


def stream_positions(positions, n: int) -> np.ndarray:
    """The (n,) stream positions a keyed draw uses: ``positions``, or 0 ... n-1 for a batch on its own."""
    return np.arange(n, dtype=np.int64) if positions is None else np.asarray(positions)


class MLMCollator:
    """Choose ``mlm_probability`` of the non-special positions; of those, 80% become [MASK], 10% a
    random non-special token, 10% stay. Labels are the original ids there and -100 elsewhere.
    ``sample_noise`` (train.objective=rtd): also ``sample_noise``, float64 (B, T) uniforms in [0, 1)
    from the same keyed words, with which the generator samples its replacement
    at each masked position (models/objectives/rtd.py): the replaced tokens are then a pure function of the
    stream position and the weights, as the masks are."""

    def __init__(self, vocab_size: int, mask_id: int, num_special: int, mlm_probability: float, seed: int = 0,
                 sample_noise: bool = False):
        if not 0.0 < mlm_probability < 1.0:
            raise ValueError(f"mlm_probability must be in (0, 1), got {mlm_probability}")
        self.vocab_size = vocab_size
        self.mask_id = mask_id
        self.num_special = num_special  # ids below this are special: [PAD] [UNK] [CLS] [SEP] [MASK]
        self.p = mlm_probability
        self.sample_noise = sample_noise
        self.seed = seed
        self.key = mix64(_U(seed % 2**64) ^ _U(0x6A09E667F3BCC909))  # this seed's stream of sequence keys

    def __call__(self, batch, positions=None) -> dict[str, torch.Tensor]:
        """``batch``: int64 (B, T) ids, or a dict with ``input_ids`` and whatever else the dataset
        gives (document-aware packing: document_ids, position_ids, attention_mask), passed through;
        positions where ``attention_mask`` is 0 are never chosen. ``positions``: int (B,) stream
        positions of the sequences (keyed masks, see the module docstring); None: 0 ... B-1."""
        out = dict(batch) if isinstance(batch, dict) else {}
        input_ids = (batch["input_ids"] if isinstance(batch, dict) else batch).clone()
        special = input_ids < self.num_special
        if "attention_mask" in out:
            special |= out["attention_mask"] == 0
        positions = stream_positions(positions, len(input_ids))
        chosen, to_mask, to_random, random_ids, noise = self._keyed(positions, input_ids.shape, special)
        if self.sample_noise:
            out["sample_noise"] = noise
        labels = torch.where(chosen, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
        input_ids[to_mask] = self.mask_id
        input_ids[to_random] = random_ids
        out.update(input_ids=input_ids, labels=labels)
        return out

    def _keyed(self, positions: np.ndarray, shape, special):
        """One 64-bit word per token, word = splitmix64(key(seed, position) + (t + 1) * golden):
        its high 32 bits choose the position (< p), its low 32 bits roll 80/10/10; a second word,
        hashed only where a random token is needed, picks it."""
        B, T = shape
        if positions.shape != (B,):
            raise ValueError(f"positions: {positions.shape}, expected ({B},), one stream position per sequence")
        sequence = mix64(positions.astype(np.int64).astype(_U) ^ self.key)  # (B,)
        with np.errstate(over="ignore"):
            words = mix64(sequence[:, None] + np.arange(T, dtype=_U)[None, :] * _GOLDEN)  # (B, T)
        high, low = words >> _U(32), words & _LOW32
        chosen = (high < _U(int(self.p * 2**32))) & ~special.numpy()
        to_mask = chosen & (low < _U(int(0.8 * 2**32)))
        to_random = chosen & (low >= _U(int(0.8 * 2**32))) & (low < _U(int(0.9 * 2**32)))
        extra = mix64(words[to_random] ^ _RANDOM_ID_SALT) >> _U(11)  # 53 bits
        span = self.vocab_size - self.num_special
        random_ids = self.num_special + (extra.astype(np.float64) * (span / 2.0**53)).astype(np.int64)
        as_torch = torch.from_numpy
        noise = None
        if self.sample_noise:  # 53 bits of a third word per token -> [0, 1)
            noise = as_torch((mix64(words ^ _SAMPLE_SALT) >> _U(11)).astype(np.float64) / 2.0**53)
        return (as_torch(chosen), as_torch(to_mask), as_torch(to_random), as_torch(np.minimum(random_ids, self.vocab_size - 1)),
                noise)


def causal_collate(batch) -> dict[str, torch.Tensor]:
    """CLM batches: labels = input_ids (the model shifts them). ``batch``: int64 (B, T) ids, or a dict
    with ``input_ids`` and the blocks' document boundaries (train.document_attention), passed through."""
    out = dict(batch) if isinstance(batch, dict) else {"input_ids": batch}
    out["labels"] = out["input_ids"]
    return out
