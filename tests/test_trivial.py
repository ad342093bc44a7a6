"""Judging whether a finished run is better than the trivial models (hyfl.runtime.trivial)."""

import math

import numpy as np

from hyfl.runtime.trivial import TrivialResult, advice, judge_trivial, majority_rate

NAN = math.nan


def _rows(final: dict, zero_primal: float = 0.69) -> list[dict]:
    zero = {"iteration": 0.0, "primal": zero_primal, "train_accuracy": 0.5, "val_accuracy": NAN}
    return [zero, {"iteration": 10.0, "val_accuracy": NAN, **final}]


def test_a_model_below_the_zero_primal_and_above_the_majority_is_not_trivial():
    rows = _rows({"primal": 0.3, "train_accuracy": 0.95})
    assert judge_trivial(rows, majority_rate=0.6) is None


def test_a_primal_not_below_the_zero_models_is_trivial_with_the_figures():
    verdict = judge_trivial(_rows({"primal": 0.85, "train_accuracy": 0.95}), majority_rate=0.6)
    assert verdict is not None and verdict.iteration == 10
    assert [c.metric for c in verdict.failed] == ["primal"]
    assert verdict.reason == "primal 0.85 >= zero model's 0.69"
    # equal (a model that never moved) is not below
    assert judge_trivial(_rows({"primal": 0.69}, zero_primal=0.69)) is not None


def test_validation_accuracy_is_judged_against_the_validation_majority():
    rows = _rows({"primal": 0.3, "train_accuracy": 0.99, "val_accuracy": 0.902})
    verdict = judge_trivial(rows, majority_rate=0.5, val_majority_rate=0.904)
    assert verdict.reason == "validation accuracy 0.902 <= majority class 0.904"
    assert judge_trivial(rows, majority_rate=0.5, val_majority_rate=0.9) is None
    # without the validation labels' majority rate the accuracy check is skipped,
    # not made against the training accuracy
    assert judge_trivial(rows, majority_rate=0.995) is None


def test_training_accuracy_is_judged_without_validation_and_both_checks_are_named():
    verdict = judge_trivial(_rows({"primal": 1.2, "train_accuracy": 0.6}), majority_rate=0.6)
    assert [c.metric for c in verdict.failed] == ["primal", "train_accuracy"]
    assert verdict.reason == (
        "primal 1.2 >= zero model's 0.69; training accuracy 0.600 <= majority class 0.600"
    )


def test_regression_has_only_the_primal_check():
    rows = _rows({"primal": 0.3, "train_accuracy": NAN})
    assert judge_trivial(rows, majority_rate=None) is None
    assert judge_trivial(_rows({"primal": 0.7, "train_accuracy": NAN})).failed[0].metric == "primal"


def test_the_record_round_trips_through_json_form():
    verdict = judge_trivial(_rows({"primal": 1.2, "train_accuracy": 0.6}), majority_rate=0.6)
    record = verdict.to_dict()
    assert record["reason"] == verdict.reason and record["checks"][0]["against"] == "zero_model"
    assert TrivialResult.from_dict(record) == verdict
    assert TrivialResult.from_dict(None) is None


def test_no_rows_or_no_zero_row_skip_what_cannot_be_judged():
    assert judge_trivial([]) is None
    assert judge_trivial([{"iteration": 5.0, "primal": 9.0}]) is None


def test_majority_rate_and_advice():
    assert majority_rate([0, 1, 1, 1]) == 0.75
    assert majority_rate([]) is None
    assert "--step-rule (e.g. safe)" in advice({"step_rule", "iic"})
    assert "--step-rule (e.g. cocoa)" in advice({"step_rule"}, "safe")  # not the one it ran
    assert "--a, --b" in advice({"a", "b", "mu"})
    assert "--eta0" in advice({"eta0"})
    assert advice(()).startswith("Try more rounds (--iterations)")


# -- the scikit-learn estimators ------------------------------------------------------------


def _breast_cancer():
    from sklearn.datasets import load_breast_cancer
    from sklearn.preprocessing import MinMaxScaler

    X, y = load_breast_cancer(return_X_y=True)
    return MinMaxScaler().fit_transform(X), y


def _fit(estimator, X, y):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        estimator.fit(X, y)
    return [w for w in caught if w.category.__name__ == "TrivialModelWarning"]


def test_classifier_fit_warns_when_its_model_is_trivial():
    from hyfl import HyFDCAClassifier
    from hyfl.errors import TrivialModelWarning

    # Noise features, 90% of one class, no intercept: even the optimum cannot beat always
    # predicting the majority class, whatever the algorithm does.
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(200, 3)), (np.arange(200) % 10 != 0).astype(int)
    clf = HyFDCAClassifier(partition="grid:2x2", max_iter=50, random_state=0)
    warned = _fit(clf, X, y)
    assert len(warned) == 1 and issubclass(warned[0].category, TrivialModelWarning)
    assert issubclass(TrivialModelWarning, UserWarning)
    message = str(warned[0].message)
    assert "no better than trivial" in message and "<= majority class 0.900" in message
    assert "train_accuracy" in [c.metric for c in clf.trivial_.failed]
    X, y = _breast_cancer()
    good = HyFDCAClassifier(partition="grid:3x3", participation=0.5, max_iter=20, random_state=0)
    assert _fit(good, X, y) == [] and good.trivial_ is None


def test_regressor_fit_warns_on_the_primal_only():
    from hyfl import HyFDCARegressor

    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 4))
    y = X @ np.array([1.0, -2.0, 0.5, 0.0]) + 0.1 * rng.normal(size=60)
    # lam = 1e9: the optimum is the zero model to far below the judge's float tolerance
    reg = HyFDCARegressor(partition="grid:2x2", lam=1e9, max_iter=20, random_state=0)
    warned = _fit(reg, X, y)
    assert [c.metric for c in reg.trivial_.failed] == ["primal"] and len(warned) == 1
    assert "zero model's 2.125" in str(warned[0].message)
    good = HyFDCARegressor(partition="grid:2x2", max_iter=30, random_state=0)
    assert _fit(good, X, y) == [] and good.trivial_ is None
