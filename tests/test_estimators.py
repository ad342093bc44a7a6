"""The scikit-learn estimators: scikit-learn's own checks, the acceptance case, equivalence."""

from __future__ import annotations

import inspect
import time
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import load_breast_cancer, load_iris
from sklearn.preprocessing import MinMaxScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

import hyfl
from hyfl import HyFDCA, HyFDCAClassifier, HyFDCARegressor, HyflError, make_problem, simulate
from hyfl.data.dataset import Dataset, with_intercept
from hyfl.participation import parse_participation
from hyfl.partition import parse_partition
from hyfl.problem import solve_centralized

# Few rounds keep scikit-learn's ~50 checks per estimator fast (they check the API; the
# tests below check convergence); their data are tiny.
_FAST = dict(max_iter=30, random_state=0)

# Expected failures of scikit-learn's checks (at most two per estimator, each with its
# reason). The tiny data sets (1 sample, 1 feature) pass, because the estimators cap the
# partition's group counts at the data's size.
# Weighted and repeated samples define the same problem (the loss is the weighted mean),
# but the federation's iterates differ (other rows in other blocks): after max_iter=30
# rounds they agree to ~1e-3, not to the check's 1e-7. test_weights.py checks that
# both reach the same certified optimum.
_WEIGHT_EQUIVALENCE = ("the same optimum, other iterates: equal at convergence "
                       "(test_weights.py), not after 30 rounds")
EXPECTED_FAILURES: dict[str, dict[str, str]] = {
    name: {"check_sample_weight_equivalence_on_dense_data": _WEIGHT_EQUIVALENCE,
           "check_sample_weight_equivalence_on_sparse_data": _WEIGHT_EQUIVALENCE}
    for name in ("HyFDCAClassifier", "HyFDCARegressor")
}


def _expected(estimator) -> dict[str, str]:
    return EXPECTED_FAILURES[type(estimator).__name__]


_ESTIMATORS = [HyFDCAClassifier(**_FAST), HyFDCARegressor(**_FAST)]


@(
    parametrize_with_checks(_ESTIMATORS, expected_failed_checks=_expected)
    if "expected_failed_checks" in inspect.signature(parametrize_with_checks).parameters
    else parametrize_with_checks(_ESTIMATORS)  # scikit-learn < 1.6: nothing is expected to fail
)
def test_sklearn_check_estimator(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning at max_iter=30
        check(estimator)


def test_expected_failures_are_few():
    assert all(len(v) <= 2 for v in EXPECTED_FAILURES.values())


def _problem(X, y, loss, lam, task="binary", scaling=1.0):
    """The problem a default estimator solves: the data with the constant intercept column."""
    return make_problem(with_intercept(Dataset(sp.csr_matrix(X), y, task=task), scaling), loss,
                        lam)


def _weights(estimator, scaling=1.0):
    """The estimator's weights on the augmented data: coef, then intercept / scaling."""
    return np.append(estimator.coef_, estimator.intercept_ / scaling)[:, None]


@pytest.fixture(scope="module")
def breast_cancer():
    X, y = load_breast_cancer(return_X_y=True)
    return MinMaxScaler().fit_transform(X), y


def test_defaults_reach_the_centralized_optimum(breast_cancer):
    """The library's default rule, certified at relative gap 1e-3 within 500 rounds."""
    X, y = breast_cancer
    start = time.perf_counter()
    clf = HyFDCAClassifier(
        loss="hinge", lam=1e-3, partition="grid:3x3", participation=0.5, random_state=0,
        max_iter=500, tol=1e-3,
    ).fit(X, y)
    assert clf.step_rule == HyFDCA().step_rule == "cocoa"
    seconds = time.perf_counter() - start
    problem = _problem(X, np.where(y == 1, 1.0, -1.0), "hinge", 1e-3)
    optimum = solve_centralized(problem, cache=False)
    relative = (problem.primal(_weights(clf)) - optimum.primal) / abs(optimum.primal)
    print(f"rounds {clf.n_iter_}, {seconds:.1f} s, relative loss {relative:.2e}")
    assert relative <= 1e-3
    assert clf.n_iter_ < clf.max_iter  # stopped by the tolerance, certified by the gap
    assert clf.gap_ <= clf.tol * abs(clf.history_["primal"][-1])
    assert len(clf.history_["gap"]) == clf.n_iter_ + 1
    assert clf.score(X, y) > 0.9
    assert clf.intercept_ != 0.0 and clf.n_features_in_ == 30


def test_coef_equals_a_direct_simulate_call(breast_cancer):
    X, y = breast_cancer
    clf = HyFDCAClassifier(partition="grid:3x3", participation=0.5, max_iter=40, tol=0,
                           random_state=3, step_rule="cocoa")
    with pytest.warns(Warning):  # ConvergenceWarning: tol=0 runs max_iter rounds
        clf.fit(X, y)
    problem = _problem(X, np.where(y == 1, 1.0, -1.0), "hinge", 1e-3)
    partition = parse_partition("grid:3x3", problem.X, seed=3)
    result = simulate(HyFDCA(step_rule="cocoa"), problem, partition,
                      parse_participation(0.5, 9), 40, seed=3)
    assert clf.n_iter_ == 40
    np.testing.assert_array_equal(clf.coef_, result.weights[:-1, 0])
    assert clf.intercept_ == result.weights[-1, 0]  # times intercept_scaling 1
    assert clf.gap_ == result.final["gap"]


def test_multiclass_iris_predict_and_score():
    X, y = load_iris(return_X_y=True)
    names = np.array(["setosa", "versicolor", "virginica"])[y]
    clf = HyFDCAClassifier(loss="logistic", lam=1e-3, partition="grid:2x2", max_iter=300,
                           random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf.fit(X, names)
    assert list(clf.classes_) == ["setosa", "versicolor", "virginica"]
    assert clf.coef_.shape == (3, 4) and clf.intercept_.shape == (3,)
    assert clf.decision_function(X).shape == (150, 3)
    assert set(clf.predict(X)) <= set(names)
    assert clf.score(X, names) > 0.8


@pytest.mark.parametrize("loss", ["hinge", "logistic", "smoothed_hinge"])
def test_binary_losses_and_labels(loss, breast_cancer):
    X, y = breast_cancer
    labels = np.array(["benign", "malignant"])[1 - y]  # any two labels
    clf = HyFDCAClassifier(loss=loss, lam=1e-2, max_iter=300, tol=1e-3, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # smoothed_hinge: not certified in 300 rounds
        clf.fit(X, labels)
    assert clf.coef_.shape == (30,)
    assert clf.score(X, labels) > 0.85  # no intercept, strong regularization
    d = clf.decision_function(X)
    np.testing.assert_array_equal(clf.predict(X), clf.classes_[(d >= 0).astype(int)])


def test_regressor_reaches_ridge():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 6))
    y = X @ rng.normal(size=6) + 0.1 * rng.normal(size=200)
    reg = HyFDCARegressor(lam=1e-3, partition="grid:2x3", random_state=0).fit(X, y)
    assert reg.coef_.shape == (6,) and isinstance(reg.intercept_, float)
    assert reg.score(X, y) > 0.95
    assert reg.gap_ <= reg.tol * abs(reg.history_["primal"][-1])
    problem = _problem(X, y, "squared", 1e-3, task="regression")
    optimum = solve_centralized(problem, cache=False)
    assert (problem.primal(_weights(reg)) - optimum.primal) / optimum.primal <= 1e-3


def test_tiny_data_caps_the_partition():
    X = np.array([[1.0], [-1.0], [2.0]])
    clf = HyFDCAClassifier(partition="grid:3x3", max_iter=20, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf.fit(X, [1, 0, 1])
    assert clf.partition_ == "grid:3x2"  # one feature and the intercept's column


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda X, y: HyFDCAClassifier().fit(np.where(X > 0.5, np.nan, X), y), "NaN"),
        (lambda X, y: HyFDCAClassifier().fit(X, y[:-1]), "inconsistent numbers of samples"),
        (lambda X, y: HyFDCAClassifier(loss="squared").fit(X, y), "loss is 'squared'"),
        (lambda X, y: HyFDCAClassifier(loss="nope").fit(X, y), "Choose one of"),
        (lambda X, y: HyFDCARegressor(loss="hinge").fit(X, y), "loss is 'hinge'"),
        (lambda X, y: HyFDCAClassifier(lam=-1).fit(X, y), "lam must be > 0"),
        (lambda X, y: HyFDCAClassifier(tol=-1).fit(X, y), "tol must be"),
        (lambda X, y: HyFDCAClassifier(partition="grid:nope").fit(X, y), "not understood"),
        (lambda X, y: HyFDCAClassifier().fit(X, np.zeros(len(y))), "one class"),
    ],
)
def test_bad_input_errors(make, match, breast_cancer):
    X, y = breast_cancer
    with pytest.raises(HyflError, match=match):
        make(X[:40], y[:40])


def test_predict_refuses_another_feature_count(breast_cancer):
    X, y = breast_cancer
    clf = HyFDCAClassifier(lam=1e-2, max_iter=50, tol=0, random_state=0)
    with pytest.warns(Warning):  # ConvergenceWarning: tol=0 runs max_iter rounds
        clf.fit(X, y)
    with pytest.raises(HyflError, match="features"):
        clf.predict(X[:, :5])


def test_constructor_only_stores():
    clf = HyFDCAClassifier(loss="nope", lam=-1, partition=3)
    assert clf.get_params()["loss"] == "nope"
    assert "HyFDCAClassifier" in hyfl.__all__


def test_predict_proba_is_the_logistic_model_and_only_for_it(breast_cancer):
    """Probabilities exist for the logistic loss only (hasattr is False otherwise, as for
    scikit-learn's LinearSVC); they are the sigmoid of the decision value, sum to one, give
    the predicted class, and their AUC is the decision values' (scikit-learn's own)."""
    from sklearn.metrics import roc_auc_score

    X, y = breast_cancer
    assert not hasattr(HyFDCAClassifier(), "predict_proba")
    clf = HyFDCAClassifier(loss="logistic", lam=1e-2, max_iter=200, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf.fit(X, y)
    p = clf.predict_proba(X)
    assert p.shape == (len(y), 2)
    np.testing.assert_allclose(p.sum(axis=1), 1.0)
    np.testing.assert_allclose(p[:, 1], 1.0 / (1.0 + np.exp(-clf.decision_function(X))))
    np.testing.assert_array_equal(clf.classes_[np.argmax(p, axis=1)], clf.predict(X))
    np.testing.assert_allclose(np.exp(clf.predict_log_proba(X)), p)
    assert roc_auc_score(y, p[:, 1]) == pytest.approx(roc_auc_score(y, clf.decision_function(X)))
    iris = HyFDCAClassifier(loss="logistic", max_iter=50, random_state=0)
    X3, y3 = load_iris(return_X_y=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        iris.fit(X3, y3)
    p3 = iris.predict_proba(X3)
    np.testing.assert_allclose(p3.sum(axis=1), 1.0)
    np.testing.assert_array_equal(np.argmax(p3, axis=1), np.argmax(iris.decision_function(X3),
                                                                   axis=1))


def test_a_label_skewed_partition_reaches_the_optimum(breast_cancer):
    """Each sample group holds one class only (grid:2x2@classes:1): the certified
    optimum is the central one all the same (the primal-dual method does not average)."""
    X, y = breast_cancer
    clf = HyFDCAClassifier(partition="grid:2x2@classes:1", lam=1e-2, max_iter=400, tol=1e-3,
                           random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf.fit(X, y)
    assert clf.partition_ == "grid:2x2@classes:1"
    problem = _problem(X, np.where(y == 1, 1.0, -1.0), "hinge", 1e-2)
    optimum = solve_centralized(problem, cache=False)
    relative = (problem.primal(_weights(clf)) - optimum.primal) / abs(optimum.primal)
    assert relative <= 1e-3 and clf.n_iter_ < clf.max_iter  # certified: gap <= tol
