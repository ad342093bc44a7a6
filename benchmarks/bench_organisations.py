"""Convergence on organisations' own files: the old defaults against the new, step by step.

Each dataset is cut by ``tests/organisation_cut.py`` into three organisations' files (a
hospital and a lab with labels, a clinic without, partly overlapping string ids, three
columns the hospital and the lab share) and trained by ``hyfl run``'s engine with
``--standardize`` and hinge loss (the default), in four settings that add one change
each:

* ``old``: the defaults before issue 43 (lam 1e-4, participation 0.5, one local pass);
* ``lam 1/N``: scikit-learn's ``C = 1``;
* ``+ full``: every party every round (the default for party files);
* ``+ passes`` (the new default): passes per round from the subproblem's condition.

It reports the round at which the relative loss settles at 1e-2 and 1e-3 (the first
evaluated round from which every later one stays at or below) and the last value.
Datasets: breast cancer and wine (scikit-learn's, embedded), digits (0-4 against 5-9),
and 3,000-row samples of adult, ijcnn1 and covtype when ``../shared/data`` has them.

Usage::

    python benchmarks/bench_organisations.py --rounds 300 --out docs/organisations.csv
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from organisation_cut import breast_cancer_cut, organisation_cut, wine_quality_cut  # noqa: E402

SETTINGS = {
    "old": dict(lam=1e-4, participation="0.5", hyper={"local_passes": 1}),
    "lam 1/N": dict(participation="0.5", hyper={"local_passes": 1}),
    "+ full": dict(hyper={"local_passes": 1}),
    "+ passes": dict(),
}


def _digits(folder):
    from sklearn.datasets import load_digits

    d = load_digits()
    return organisation_cut(d.data, np.where(d.target < 5, "low", "high"), folder, seed=1)


def _sample_of(name):
    def cut(folder):
        from hyfl.data.registry import load_dataset

        ds = load_dataset(name)
        rows = np.random.default_rng(0).choice(ds.X.shape[0], 3000, replace=False)
        X, y = ds.X[rows].toarray(), np.asarray(ds.y)[rows]
        X = X[:, X.std(0) > 0]
        if np.unique(y).size > 2:
            y = np.where(y == np.unique(y)[0], 1, -1)
        return organisation_cut(X, np.where(y > 0, "yes", "no"), folder, seed=2)
    return cut


CUTS = {"breast_cancer": breast_cancer_cut, "wine": wine_quality_cut, "digits": _digits,
        "adult-3000": _sample_of("adult"), "ijcnn1-3000": _sample_of("ijcnn1"),
        "covtype-3000": _sample_of("covtype")}


def settled(iterations, values, level):
    above = np.nonzero(~(values <= level))[0]
    if not above.size:
        return int(iterations[0])
    return int(iterations[above[-1] + 1]) if above[-1] + 1 < len(values) else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--datasets", default=",".join(CUTS))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    from hyfl.experiments.runner import RunSpec, execute

    rows = []
    for name in args.datasets.split(","):
        with tempfile.TemporaryDirectory() as folder:
            try:
                CUTS[name](Path(folder))
            except Exception as error:  # a shared-data set that is absent here
                print(f"{name}: skipped ({error})")
                continue
            for setting, options in SETTINGS.items():
                spec = RunSpec(data=f"parties:{folder};id=patient;label=outcome",
                               standardize=True, iterations=args.rounds, eval_every=1,
                               **options)
                started = time.process_time()
                outcome = execute(spec)
                cpu = time.process_time() - started
                metrics = outcome.result.metrics
                it = np.array([m["iteration"] for m in metrics])
                rel = np.array([m["relative_loss"] for m in metrics])
                row = {"dataset": name, "N": outcome.summary["n_samples"], "setting": setting,
                       "lam": outcome.summary["lam"], "settled 1e-2": settled(it, rel, 1e-2),
                       "settled 1e-3": settled(it, rel, 1e-3), "final": float(rel[-1]),
                       "cpu s": round(cpu, 1)}
                rows.append(row)
                print(row, flush=True)
    table = pd.DataFrame(rows)
    print(table.to_string(index=False))
    if args.out is not None:
        table.to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
