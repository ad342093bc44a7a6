"""The in-memory dataset every part of hyfl works on."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import scipy.sparse as sp

from hyfl._names import INTERCEPT_SCALING
from hyfl.errors import check_positive, fail


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
    sample_weight : ndarray, shape (n_samples,), optional
        Each sample's loss weight, as its data give it (a party file's weight
        column); None: every sample weighs 1.
    """

    X: sp.csr_matrix
    y: np.ndarray
    name: str = "data"
    task: str = "binary"
    meta: dict = field(default_factory=dict)
    sample_weight: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.X.shape[0] != self.y.shape[0]:
            raise fail(
                f"dataset {self.name!r}",
                f"has {self.X.shape[0]} samples but {self.y.shape[0]} labels",
                "Give one label per sample.",
            )
        if self.sample_weight is not None and np.shape(self.sample_weight) != (self.X.shape[0],):
            raise fail(
                f"dataset {self.name!r}",
                f"has {np.size(self.sample_weight)} sample weights for {self.X.shape[0]} "
                "samples",
                "Give one weight per sample.",
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


def append_constant_column(X: sp.csr_matrix, value: float) -> sp.csr_matrix:
    """Add a last column holding ``value`` in every row (a bias feature).

    Parameters
    ----------
    X : scipy.sparse.csr_matrix, shape (n_samples, n_features), sorted indices
    value : float

    Returns
    -------
    scipy.sparse.csr_matrix, shape (n_samples, n_features + 1)
    """
    row_ends = X.indptr[1:]
    data = np.insert(X.data, row_ends, value)
    indices = np.insert(X.indices, row_ends, X.shape[1])
    indptr = X.indptr + np.arange(X.shape[0] + 1, dtype=X.indptr.dtype)
    return sp.csr_matrix((data, indices, indptr), shape=(X.shape[0], X.shape[1] + 1))


def with_intercept(data: Dataset, scaling: float = INTERCEPT_SCALING) -> Dataset:
    """``data`` with a constant last column of value ``scaling``: the intercept.

    hyfl fits an intercept as liblinear does: the model's last weight ``w_b``
    multiplies the constant ``scaling``, so the intercept is ``b = scaling * w_b``
    and the problem stays ``lam/2 ||(w, w_b)||^2 + mean loss`` -- the bias is
    regularized by ``lam / (2 scaling^2) b^2``, weakly for a large ``scaling``
    (which, in return, slows the dual steps, whose curvature grows with
    ``||x_i||^2``). Every solver, certificate and cost of hyfl then applies
    unchanged, and scikit-learn's liblinear models with ``fit_intercept=True``
    and the same ``intercept_scaling`` solve the same objective.

    ``meta["intercept_scaling"]`` records the scaling: models split the last
    weight off as the intercept (:func:`split_intercept`).
    """
    meta = dict(data.meta, intercept_scaling=float(scaling))
    if meta.get("feature_names") is not None:
        meta["feature_names"] = (*meta["feature_names"], "(intercept)")
    return replace(data, X=append_constant_column(data.X, scaling), meta=meta)


def parse_intercept(value) -> float | None:
    """The intercept column's value from a flag or config value, None for no intercept.

    ``True`` or ``"on"``: :data:`INTERCEPT_SCALING`; ``False``, ``"off"`` or
    ``"none"``: None; a positive number (or its text): that value.
    """
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("on", "true", "yes"):
            return INTERCEPT_SCALING
        if text in ("off", "false", "no", "none"):
            return None
        try:
            value = float(text)
        except ValueError:
            value = text
    if value is True:
        return INTERCEPT_SCALING
    if value is False or value is None:
        return None
    return check_positive("intercept", value, fix="Give the constant column's value, such as "
                          "1 (liblinear's default), or off for no intercept.")


def split_intercept(weights: np.ndarray, scaling: float | None) -> tuple[np.ndarray, np.ndarray]:
    """``(coef, intercept)`` of weights fitted on :func:`with_intercept` data.

    ``weights`` of shape (M + 1, C) give coef (M, C) and intercept (C,) =
    ``scaling * weights[-1]``; with ``scaling`` None (no intercept column), the
    weights and zeros.
    """
    weights = np.asarray(weights, dtype=np.float64)
    if scaling is None:
        return weights, np.zeros(weights.shape[1:])
    return weights[:-1], scaling * weights[-1]
