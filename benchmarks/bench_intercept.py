"""hyfl's default intercept against scikit-learn's default models, where a bias is needed.

Two measurements on the breast-cancer data (whose classes are not separated through
the origin once the features are min-max scaled):

* the estimators: five-fold cross-validated accuracy of ``HyFDCAClassifier()`` with
  the hinge and the logistic loss (every other parameter its default), with and
  without the intercept, beside ``LinearSVC()`` and ``LogisticRegression()`` with
  theirs, on the same folds;
* the command line: ``hyfl run``'s defaults (``hyfl demo``'s split: a quarter held
  out, seed 0) with ``--loss hinge`` and ``--loss logistic``, with and without the
  intercept, beside the two scikit-learn defaults fitted on the same training rows.

Usage::

    python benchmarks/bench_intercept.py            # about 2 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import datetime
import os
import time
import warnings

from sklearn.datasets import load_breast_cancer
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import MinMaxScaler
from sklearn.svm import LinearSVC

from hyfl import HyFDCAClassifier
from hyfl.data import train_validation
from hyfl.experiments.runner import RunSpec, execute
from machine import cpu_model, git

REFERENCES = {"hinge": LinearSVC, "logistic": LogisticRegression}


def estimators(folds: int) -> list[tuple]:
    X, y = load_breast_cancer(return_X_y=True)
    cv = StratifiedKFold(folds, shuffle=True, random_state=0)
    rows = []
    for loss, reference in REFERENCES.items():
        theirs = cross_val_score(make_pipeline(MinMaxScaler(), reference()), X, y, cv=cv).mean()
        for fit_intercept in (True, False):
            start, cpu = time.time(), time.process_time()
            model = HyFDCAClassifier(loss=loss, fit_intercept=fit_intercept, random_state=0)
            ours = cross_val_score(make_pipeline(MinMaxScaler(), model), X, y, cv=cv).mean()
            rows.append(("estimator, 5-fold", loss, fit_intercept, ours, reference.__name__,
                         theirs, time.time() - start, time.process_time() - cpu))
    return rows


def command_line(out: str) -> list[tuple]:
    train, val = train_validation("breast_cancer", val_fraction=0.25, seed=0)
    y_train = (train.y > 0).astype(int)
    y_val = (val.y > 0).astype(int)
    rows = []
    for loss, reference in REFERENCES.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            theirs = reference().fit(train.X, y_train).score(val.X, y_val)
        for intercept in (1.0, None):
            start, cpu = time.time(), time.process_time()
            spec = RunSpec(data="breast_cancer", val_fraction=0.25, loss=loss, intercept=intercept,
                           iterations=600)
            outcome = execute(spec, os.path.join(out, f"{loss}-{intercept}"), overwrite=True)
            ours = outcome.result.final["val_accuracy"]
            rows.append(("hyfl run, 600 rounds", loss, intercept is not None, ours,
                         reference.__name__, theirs, time.time() - start,
                         time.process_time() - cpu))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--out", default="/tmp/hyfl-bench-intercept")
    args = parser.parse_args()
    rows = estimators(args.folds) + command_line(args.out)
    load = os.getloadavg()[0]
    print(f"{datetime.date.today()}, {cpu_model()}, {os.cpu_count()} cores, load {load:.1f}, "
          f"commit {git('rev-parse', '--short', 'HEAD')}")
    print("| setting | loss | intercept | hyfl accuracy | scikit-learn default | its accuracy "
          "| points behind | wall s | CPU s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for setting, loss, intercept, ours, name, theirs, wall, cpu in rows:
        behind = 100 * (theirs - ours)
        print(f"| {setting} | {loss} | {'yes' if intercept else 'no'} | {ours:.4f} | {name}() | "
              f"{theirs:.4f} | {behind:+.2f} | {wall:.1f} | {cpu:.1f} |")


if __name__ == "__main__":
    main()
