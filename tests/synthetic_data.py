"""Small synthetic datasets shared by the algorithm tests."""

import numpy as np
import pandas as pd
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


def organisation_files(folder, seed=0):
    """Three organisations' files of one synthetic task (90 customers, 9 features, text
    labels ``<=50K``/``>50K``), each in its own row order, keyed by ``customer``: a bank
    (CSV, customers 0-59, x0-x2, labels), a telco (Parquet, 20-89, x3-x5, no labels) and
    a shop (CSV, 40-89, x6-x8, labels). Returns (paths, ids, X, y)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    n, m = 90, 9
    X = rng.uniform(0, 1, (n, m))
    w = rng.normal(size=m)
    y = np.where(X @ w > np.median(X @ w), ">50K", "<=50K")
    ids = np.array([f"cust-{i:03d}" for i in range(n)])

    def write(rows, columns, labelled, name):
        frame = pd.DataFrame({"customer": ids[rows]})
        for c in columns:
            frame[f"x{c}"] = X[rows, c]
        if labelled:
            frame["income"] = y[rows]
        frame = frame.sample(frac=1.0, random_state=seed)  # each file in its own order
        path = folder / name
        frame.to_parquet(path) if name.endswith(".parquet") else frame.to_csv(path, index=False)
        return path

    files = [write(np.arange(0, 60), range(0, 3), True, "bank.csv"),
             write(np.arange(20, 90), range(3, 6), False, "telco.parquet"),
             write(np.arange(40, 90), range(6, 9), True, "shop.csv")]
    return files, ids, X, y


def unlabelled_copies(files, folder, label="income"):
    """The organisations' ``files`` without their ``label`` column (new rows to score),
    written under ``folder`` with the same names and formats. Returns their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for path in files:
        frame = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
        frame = frame.drop(columns=[c for c in (label,) if c in frame])
        new = folder / path.name
        frame.to_parquet(new) if new.suffix == ".parquet" else frame.to_csv(new, index=False)
        out.append(new)
    return out


def horizontal_organisation_files(folder):
    """Two organisations with the same three columns for different customers (each
    column held by both: only the sum of their statistics is theirs to reveal)."""
    rng = np.random.default_rng(7)
    paths = []
    for k, start in enumerate((0, 40)):
        frame = pd.DataFrame({"customer": [f"c{i}" for i in range(start, start + 40)]})
        for c in range(3):
            frame[f"x{c}"] = rng.normal(10.0 * (k + 1), 2.0 + c, size=40)
        frame["income"] = np.where(rng.random(40) > 0.5, "yes", "no")
        paths.append(folder / f"org{k}.csv")
        frame.to_csv(paths[-1], index=False)
    return paths
