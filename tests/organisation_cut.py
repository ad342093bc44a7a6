"""Cut a real dataset into three organisations' own files, as a cross-organisation job
has them: a hospital and a lab with labels, a clinic without, string ids that only
partly overlap, each file in its own row order, and a few columns that the hospital and
the lab both hold (their cells agree).

Run as a script to write the files of one dataset::

    python tests/organisation_cut.py breast_cancer /tmp/orgs

and train on them with
``hyfl run --data "parties:/tmp/orgs;id=patient;label=outcome" --standardize``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd


def organisation_cut(X, y, folder, *, seed=0, names=None, label_names=None):
    """Write ``hospital.csv``, ``lab.parquet`` and ``clinic.csv`` under ``folder``.

    Parameters
    ----------
    X : ndarray of shape (N, M)
        Dense features, M >= 6.
    y : ndarray of shape (N,)
        Labels (any values; written as text when ``label_names`` is given).
    folder : Path
    seed : int, default 0
        Row shuffle of the ids and of each file.
    names : list of str or None
        Column names (default ``f0 ... f{M-1}``).
    label_names : dict or None
        Map of label values to the text written (``{-1: "benign", 1: "malignant"}``).

    Returns
    -------
    paths : list of Path
        The three files, hospital first.
    ids : ndarray of str, shape (N,)
        The row ids, in the order of ``X``.

    Notes
    -----
    Rows: the hospital holds 60 % of the patients, the lab 60 % (the two overlap in
    20 %), the clinic 70 % drawn among all of them; every patient is labelled by the
    hospital or the lab. Columns: the hospital holds the first 45 %, the lab the next
    35 % plus the hospital's last three (shared), the clinic the rest.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    n, m = X.shape
    names = list(names) if names is not None else [f"f{j}" for j in range(m)]
    ids = np.array([f"P{k:05d}" for k in rng.permutation(n) + 1])
    order = rng.permutation(n)
    hospital_rows = order[: int(0.6 * n)]
    lab_rows = order[int(0.4 * n):]
    clinic_rows = rng.choice(n, int(0.7 * n), replace=False)
    a, b = int(0.45 * m), int(0.8 * m)
    hospital_cols = list(range(0, a))
    lab_cols = list(range(a - 3, b))
    clinic_cols = list(range(b, m))
    labels = np.array([label_names[v] for v in y]) if label_names else y

    def write(rows, cols, labelled, name):
        frame = pd.DataFrame({"patient": ids[rows]})
        for j in cols:
            frame[names[j]] = X[rows, j]
        if labelled:
            frame["outcome"] = labels[rows]
        frame = frame.sample(frac=1.0, random_state=seed)
        path = folder / name
        frame.to_parquet(path) if name.endswith(".parquet") else frame.to_csv(path, index=False)
        return path

    paths = [write(hospital_rows, hospital_cols, True, "hospital.csv"),
             write(lab_rows, lab_cols, True, "lab.parquet"),
             write(clinic_rows, clinic_cols, False, "clinic.csv")]
    return paths, ids


def breast_cancer_cut(folder, seed=0):
    """Breast-cancer rows (569 x 30, raw units) cut by :func:`organisation_cut`."""
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    return organisation_cut(data.data, data.target, folder, seed=seed,
                            names=[c.replace(" ", "_") for c in data.feature_names],
                            label_names={0: "malignant", 1: "benign"})


def wine_quality_cut(folder, seed=0):
    """sklearn's wine data as a two-class task (class 0 against the rest; 178 x 13)."""
    from sklearn.datasets import load_wine

    data = load_wine()
    y = np.where(data.target == 0, "cultivar_a", "other")
    return organisation_cut(data.data, y, folder, seed=seed,
                            names=[c.replace("/", "_") for c in data.feature_names])


CUTS = {"breast_cancer": breast_cancer_cut, "wine": wine_quality_cut}


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in CUTS:
        sys.exit(f"usage: python {sys.argv[0]} {{{','.join(CUTS)}}} FOLDER")
    for path in CUTS[sys.argv[1]](Path(sys.argv[2]))[0]:
        print(path)
