"""The in-memory dataset every part of hyfl works on."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from hyfl.errors import fail


@dataclass(frozen=True)
class Dataset:
    """A labelled data matrix.

    Parameters
    ----------
    X : scipy.sparse.csr_matrix, shape (n_samples, n_features), float64
        Samples in rows. Always CSR with sorted indices and no explicit zeros
        required; dense data is stored as CSR too so all code has one path.
    y : ndarray, shape (n_samples,)
        Labels. Binary classification uses {-1, +1}; multiclass uses integer
        class labels ``0..C-1``; regression uses real values.
    name : str
        Human-readable name (dataset name or file name).
    task : {"binary", "multiclass", "regression"}
    meta : dict
        Free-form provenance (source path, preprocessing notes, image shape).
    """

    X: sp.csr_matrix
    y: np.ndarray
    name: str = "data"
    task: str = "binary"
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.X.shape[0] != self.y.shape[0]:
            raise fail(
                f"dataset {self.name!r}",
                f"has {self.X.shape[0]} samples but {self.y.shape[0]} labels",
                "Give one label per sample.",
            )

    @property
    def n_samples(self) -> int:
        return self.X.shape[0]

    @property
    def n_features(self) -> int:
        return self.X.shape[1]

    @property
    def classes(self) -> np.ndarray:
        """Sorted distinct labels (empty for regression)."""
        return np.unique(self.y) if self.task != "regression" else np.empty(0)
