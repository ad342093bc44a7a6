"""Small synthetic datasets shared by the algorithm tests."""

import numpy as np
import scipy.sparse as sp
from sklearn.datasets import make_classification

from hyfl.data.dataset import Dataset


def synthetic(n=120, m=10, seed=0, classes=2, sparsity=0.0):
    X, y = make_classification(
        n,
        m,
        n_informative=min(6, m),
        n_redundant=0,
        n_classes=classes,
        n_clusters_per_class=1,
        random_state=seed,
    )
    X = (X - X.mean(0)) / X.std(0)
    if sparsity:
        X[np.random.default_rng(seed).random(X.shape) < sparsity] = 0.0
    if classes == 2:
        return Dataset(sp.csr_matrix(X), np.where(y > 0, 1.0, -1.0), "syn")
    return Dataset(sp.csr_matrix(X), y, "syn3", task="multiclass")
