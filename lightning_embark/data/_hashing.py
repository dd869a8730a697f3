"""Stable, vectorised hashing used for splits, synthetic data and string categories.

Everything here is a pure function of its inputs, identical across processes, runs
and platforms (unlike Python's ``hash()``, which is salted per process). That is
what makes the train/val split and the synthetic stream reproducible on every rank
without any communication.
"""

from __future__ import annotations

import zlib

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_MASK64 = (1 << 64) - 1
#: Stream tag of the train/validation split.
_SPLIT_TAG = 0x5B117


def splitmix64(x: np.ndarray | int) -> np.ndarray:
    """SplitMix64's finaliser: a fast bijective mixer on uint64 values.

    Args:
        x: An integer or an array of integers (taken modulo 2**64).

    Returns:
        A uint64 array of the same shape, well mixed in every bit.
    """
    z = np.asarray(x).astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        z += _GOLDEN
        z ^= z >> np.uint64(30)
        z *= _M1
        z ^= z >> np.uint64(27)
        z *= _M2
        z ^= z >> np.uint64(31)
    return z


def key(*parts: int) -> int:
    """Fold integers (seed, stream tag, table index...) into one 64-bit key.

    Scalar keys are built with Python integers so that no numpy overflow warning
    fires; the result feeds :func:`hash_with`.
    """
    h = 0x243F6A8885A308D3
    for part in parts:
        h = int(splitmix64((h ^ (int(part) & _MASK64)) & _MASK64))
    return h


def hash_with(base: int, counters: np.ndarray) -> np.ndarray:
    """Hash each counter under a key: one independent uint64 per counter."""
    c = np.asarray(counters).astype(np.uint64)
    with np.errstate(over="ignore"):
        return splitmix64(splitmix64(c ^ np.uint64(base)) + np.uint64(base))


def to_unit(h: np.ndarray) -> np.ndarray:
    """Map uint64 hashes to float64 uniforms in [0, 1) using the top 53 bits."""
    return (h >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def stable_string_hash(text: str) -> int:
    """A process-independent 32-bit hash of a string (CRC-32 of its UTF-8 bytes)."""
    return zlib.crc32(text.encode("utf-8"))


def in_split(
    split: str, *, seed: int, val_fraction: float, first_index: int, count: int
) -> np.ndarray:
    """Which of the examples ``first_index .. first_index + count - 1`` are in ``split``
    (``"train"``, ``"val"`` or ``"all"``): example ``i`` is in ``val`` when
    ``to_unit(hash(seed, i)) < val_fraction``, so the split depends on the example's
    index in its file only, never on ranks, batch size or chunking."""
    if split == "all":
        return np.ones(count, dtype=bool)
    indices = np.arange(first_index, first_index + count, dtype=np.uint64)
    is_val = to_unit(hash_with(key(seed, _SPLIT_TAG), indices)) < val_fraction
    return is_val if split == "val" else ~is_val
