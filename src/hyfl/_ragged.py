"""Small vectorized helpers for ragged index ranges (no Python loops)."""

from __future__ import annotations

import numpy as np


def concat_ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s, s + n) for s, n in zip(starts, lengths)])``, vectorized."""
    starts = np.asarray(starts, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.empty(0, dtype=np.int64)
    offsets = np.cumsum(lengths) - lengths
    return np.repeat(starts - offsets, lengths) + np.arange(total, dtype=np.int64)


def segment_ids(lengths: np.ndarray) -> np.ndarray:
    """``repeat(arange(len(lengths)), lengths)``: which segment each element is in."""
    return np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
