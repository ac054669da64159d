"""Seeded pseudo-random numbers and permutations that need no memory per element.

``mix64`` is the splitmix64 finaliser (a fixed, well-mixed uint64 per input). :class:`Permutation`
is a keyed Feistel network over the next even power of two >= n, with cycle walking to stay in
``[0, n)``: ``perm[i]`` is computed on demand, so shuffling N samples costs O(1) memory instead of
an N-element ``np.random.permutation``.
"""

from __future__ import annotations

import numpy as np

_U = np.uint64


def mix64(x) -> np.ndarray:
    """splitmix64 finaliser, vectorized over uint64 (wrapping arithmetic is intended)."""
    with np.errstate(over="ignore"):
        x = np.asarray(x, dtype=np.uint64) + _U(0x9E3779B97F4A7C15)
        x = (x ^ (x >> _U(30))) * _U(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> _U(27))) * _U(0x94D049BB133111EB)
        return x ^ (x >> _U(31))


def uniform(x) -> np.ndarray:
    """A float in [0, 1) per uint64 input."""
    return (mix64(x) >> _U(11)).astype(np.float64) / float(1 << 53)


class Permutation:
    """A bijection of ``[0, n)`` chosen by ``key`` (any int): ``perm(indices) -> indices``."""

    ROUNDS = 6

    def __init__(self, n: int, key: int):
        if n < 1:
            raise ValueError(f"cannot permute {n} elements")
        self.n = n
        bits = max(2, int(n - 1).bit_length())
        self.half = (bits + 1) // 2  # the domain is 2**(2*half) >= n, at most 4n
        self.mask = _U((1 << self.half) - 1)
        base = int(mix64(_U(key & (2**64 - 1))))
        self.keys = [mix64(_U((base + r) % 2**64)) for r in range(self.ROUNDS)]

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> _U(self.half), x & self.mask
        for k in self.keys:
            left, right = right, left ^ (mix64(right ^ k) & self.mask)
        return (left << _U(self.half)) | right

    def __call__(self, indices) -> np.ndarray:
        x = np.asarray(indices, dtype=np.uint64)
        if x.size and int(x.max()) >= self.n:
            raise IndexError(f"index {int(x.max())} out of range for a permutation of {self.n}")
        y = self._encrypt(x)
        outside = y >= _U(self.n)
        while outside.any():  # cycle walking: re-encrypt until inside [0, n); ends since it is a bijection
            y[outside] = self._encrypt(y[outside])
            outside = y >= _U(self.n)
        return y.astype(np.int64)
