"""Holding rows out of a data set for validation: which rows, and the two parts."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from hyfl.data.dataset import Dataset
from hyfl.errors import fail

__all__ = ["holdout_rows", "split_rows"]


def holdout_rows(n_samples: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (train_rows, val_rows) holding ``fraction`` of ``n_samples`` out, seeded."""
    if not 0 < fraction < 1:
        raise fail(
            "val_fraction", f"must be in (0, 1), got {fraction!r}", "Pass e.g. val_fraction=0.2."
        )
    n_val = int(round(fraction * n_samples))
    if not 0 < n_val < n_samples:
        raise fail(
            "val_fraction",
            f"={fraction} of {n_samples} samples leaves an empty train or validation part",
            "Use a larger dataset or a fraction that keeps both parts non-empty.",
        )
    order = np.random.default_rng(seed).permutation(n_samples)
    # Sorted indices keep the original sample order within each part.
    return np.sort(order[n_val:]), np.sort(order[:n_val])


def split_rows(
    data: Dataset, train_rows: np.ndarray, val_rows: np.ndarray, fraction: float, seed: int
) -> tuple[Dataset, Dataset]:
    """``data`` cut into its train and validation rows (names and meta say so)."""
    parts = []
    for label, rows in (("train", train_rows), ("val", val_rows)):
        meta = dict(data.meta, holdout=label, val_fraction=fraction, seed=seed)
        name = data.name if label == "train" else f"{data.name}-val"
        weight = None if data.sample_weight is None else data.sample_weight[rows]
        parts.append(replace(data, X=data.X[rows], y=data.y[rows], name=name, meta=meta,
                             sample_weight=weight))
    return parts[0], parts[1]
