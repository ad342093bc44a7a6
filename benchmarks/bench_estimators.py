"""scikit-learn's ``check_estimator`` on both estimators at their defaults, and the
README's estimator example, each timed (CPU beside wall).

The example is timed twice in one process: the first ``fit`` pays Numba's one-off
start in the process (loading its registries and the cached kernels, about 0.4 s
here), the second is what each further fit (a grid search's, a fold's) costs.
``check_estimator`` runs with ``on_fail=None`` so that every check runs; the checks
that fail are listed (the weight-equivalence checks ask for 1e-7 agreement where
``fit`` stops at its certified ``tol``; tests/test_estimators.py says why).

Usage::

    python benchmarks/bench_estimators.py            # both parts, about 9 minutes
    python benchmarks/bench_estimators.py --example  # the README example only
"""

from __future__ import annotations

import argparse
import functools
import time
import warnings


def _timed(fn):
    cpu, wall = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.process_time() - cpu, time.perf_counter() - wall


def example() -> None:
    from sklearn.datasets import load_breast_cancer
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import MinMaxScaler

    from hyfl.estimators import HyFDCAClassifier

    X, y = load_breast_cancer(return_X_y=True)
    X = MinMaxScaler().fit_transform(X)
    X_train, _, y_train, _ = train_test_split(X, y, random_state=0)
    for which in ("first fit in the process", "second fit"):
        clf, cpu, wall = _timed(lambda: HyFDCAClassifier(
            loss="logistic", lam=1e-3, partition="grid:3x3", participation=0.5,
            random_state=0).fit(X_train, y_train))
        print(f"README example, {which}: CPU {cpu:.2f} s, wall {wall:.2f} s, "
              f"{clf.n_iter_} rounds, gap {clf.gap_:.2e}", flush=True)


def checks() -> None:
    from sklearn.utils.estimator_checks import check_estimator

    from hyfl import HyFDCAClassifier, HyFDCARegressor

    warnings.simplefilter("ignore")
    for estimator in (HyFDCAClassifier(), HyFDCARegressor()):
        results, cpu, wall = _timed(functools.partial(check_estimator, estimator, on_fail=None))
        failed = [r["check_name"] for r in results if r["status"] == "failed"]
        print(f"check_estimator({type(estimator).__name__}()): {len(results)} checks, "
              f"CPU {cpu:.0f} s, wall {wall:.0f} s, failed: {failed}", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--example", action="store_true", help="only the README example")
    args = parser.parse_args(argv)
    example()
    if not args.example:
        checks()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
