"""The intercept: a constant column whose weight is regularized (liblinear's objective).

Checked against scikit-learn's liblinear solvers with ``fit_intercept=True`` and the
same ``intercept_scaling`` (an independent solver of the same objective), against the
accuracy of scikit-learn's default models on data that needs a bias, and through
partitions, party files, configs, the CLI and model files.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import load_breast_cancer
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import MaxAbsScaler, MinMaxScaler
from sklearn.svm import LinearSVC
from typer.testing import CliRunner

from hyfl import HyFDCAClassifier
from hyfl.cli import app
from hyfl.data import load_parties
from hyfl.data.dataset import Dataset, parse_intercept, split_intercept, with_intercept
from hyfl.errors import HyflError
from hyfl.experiments.config import parse_config
from hyfl.model_file import load_model
from hyfl.partition import from_blocks, stack, with_constant_feature
from hyfl.problem import make_problem, solve_centralized

runner = CliRunner()


@pytest.fixture(scope="module")
def minmax_cancer():
    """Breast cancer scaled to [0, 1]: its classes are not separated through the origin."""
    X, y = load_breast_cancer(return_X_y=True)
    return MinMaxScaler().fit_transform(X), y


def _liblinear(loss: str, lam: float, n: int, scaling: float):
    """scikit-learn's liblinear model of ``lam/2 ||(w, b/s)||^2 + mean loss``."""
    C = 1.0 / (lam * n)
    if loss == "hinge":
        return LinearSVC(loss="hinge", C=C, intercept_scaling=scaling, tol=1e-10,
                         max_iter=1_000_000)
    return LogisticRegression(solver="liblinear", C=C, intercept_scaling=scaling, tol=1e-10,
                              max_iter=100_000)


@pytest.mark.parametrize(("loss", "scaling"), [("hinge", 1.0), ("logistic", 1.0),
                                               ("logistic", 5.0)])
def test_the_certificate_bounds_the_distance_to_liblinears_intercept_optimum(
        minmax_cancer, loss, scaling):
    """P(w) - P* <= gap, with P* from liblinear's own fit of the same objective, and the
    centralized reference of the augmented problem agrees with liblinear."""
    X, y = minmax_cancer
    lam = 1e-2
    clf = HyFDCAClassifier(loss=loss, lam=lam, intercept_scaling=scaling, tol=1e-4,
                           random_state=0, max_iter=3000).fit(X, y)
    problem = make_problem(with_intercept(Dataset(sp.csr_matrix(X), np.where(y == 1, 1.0, -1.0)),
                                          scaling), loss, lam)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = _liblinear(loss, lam, len(y), scaling).fit(X, y)
    # liblinear's intercept_ is scaling * its last weight, as ours
    w_ref = np.append(reference.coef_.ravel(), reference.intercept_ / scaling)[:, None]
    p_star = problem.primal(w_ref)
    w = np.append(clf.coef_, clf.intercept_ / scaling)[:, None]
    assert problem.primal(w) - p_star <= clf.gap_ + 1e-9
    assert clf.gap_ <= 1e-4 * problem.primal(w)
    assert solve_centralized(problem, cache=False).primal == pytest.approx(p_star, rel=1e-6)
    assert clf.intercept_ == pytest.approx(float(reference.intercept_[0]), abs=0.1)


def test_the_default_reaches_scikit_learns_default_accuracy_where_a_bias_is_needed(
        minmax_cancer):
    """Five-fold accuracy within 0.5 points of LogisticRegression() (without an intercept,
    hyfl's logistic model was 4.6 points below it here)."""
    X, y = minmax_cancer
    folds = StratifiedKFold(5, shuffle=True, random_state=0)
    ours = cross_val_score(HyFDCAClassifier(loss="logistic", random_state=0), X, y, cv=folds)
    theirs = cross_val_score(LogisticRegression(), X, y, cv=folds)
    without = cross_val_score(HyFDCAClassifier(loss="logistic", fit_intercept=False,
                                               random_state=0), X, y, cv=folds)
    assert ours.mean() >= theirs.mean() - 0.005
    assert without.mean() < theirs.mean() - 0.02  # the data do need the bias


def test_hinge_accuracy_matches_linear_svc_on_a_split(minmax_cancer):
    X, y = minmax_cancer
    train = np.arange(len(y)) % 3 != 0
    ours = HyFDCAClassifier(random_state=0, tol=1e-3).fit(X[train], y[train])
    theirs = LinearSVC().fit(X[train], y[train])
    assert ours.score(X[~train], y[~train]) >= theirs.score(X[~train], y[~train]) - 0.005


def test_a_pipeline_pickles_and_predicts_with_its_intercept(minmax_cancer):
    import pickle

    X, y = minmax_cancer
    pipe = make_pipeline(MaxAbsScaler(), HyFDCAClassifier(loss="logistic", random_state=0))
    pipe.fit(sp.csr_matrix(X), y)
    again = pickle.loads(pickle.dumps(pipe))
    np.testing.assert_array_equal(again.predict_proba(X), pipe.predict_proba(X))
    clf = pipe[-1]
    np.testing.assert_allclose(clf.decision_function(X), X @ clf.coef_ + clf.intercept_)


def test_with_intercept_appends_the_constant_and_split_takes_it_off():
    data = Dataset(sp.csr_matrix(np.array([[0.0, 2.0], [3.0, 0.0]])), np.array([1.0, -1.0]),
                   meta={"feature_names": ("a", "b")})
    augmented = with_intercept(data, 4.0)
    np.testing.assert_array_equal(augmented.X.toarray(), [[0, 2, 4], [3, 0, 4]])
    assert augmented.meta["intercept_scaling"] == 4.0
    assert augmented.meta["feature_names"] == ("a", "b", "(intercept)")
    coef, bias = split_intercept(np.array([[1.0], [2.0], [0.5]]), 4.0)
    assert coef.ravel().tolist() == [1.0, 2.0] and bias.tolist() == [2.0]
    coef, bias = split_intercept(np.array([[1.0], [2.0]]), None)
    assert coef.ravel().tolist() == [1.0, 2.0] and bias.tolist() == [0.0]


@pytest.mark.parametrize(("value", "expected"), [
    (True, 1.0), (False, None), ("off", None), ("ON", 1.0), ("10", 10.0), (2, 2.0), (None, None),
])
def test_parse_intercept(value, expected):
    assert parse_intercept(value) == expected


@pytest.mark.parametrize("value", ["-1", 0, "often", float("nan")])
def test_a_bad_intercept_is_refused_with_the_fix(value):
    with pytest.raises(HyflError, match="intercept.*(off|positive)"):
        parse_intercept(value)


def _covered_once(partition, X) -> None:
    """Every stored entry of X is owned by exactly one client (the stacked rows sum to X)."""
    stacked = stack(partition, X)
    pooled = sp.csr_matrix((np.ones(stacked.X.nnz), stacked.X.indices,
                            stacked.X.indptr), shape=stacked.X.shape)
    per_sample = sp.csr_matrix(
        (np.ones(stacked.X.shape[0]), (stacked.row_sample, np.arange(stacked.X.shape[0]))),
        shape=(X.shape[0], stacked.X.shape[0])) @ pooled
    np.testing.assert_array_equal(per_sample.toarray(), (X != 0).toarray().astype(float))


def test_a_grid_of_parties_gives_the_constant_to_one_client_per_sample_group():
    X = sp.csr_matrix(np.arange(1.0, 25.0).reshape(6, 4))
    groups = [np.arange(3), np.arange(3, 6)]
    halves = [np.arange(2), np.arange(2, 4)]
    partition = from_blocks([(g, h) for g in groups for h in halves], 6, 4)
    augmented = with_intercept(Dataset(X, np.ones(6)), 1.0).X
    extended = with_constant_feature(partition, augmented)
    assert extended.entry_owner is None  # a whole feature of clients 0 and 2
    assert [4 in f for f in extended.features] == [True, False, True, False]
    _covered_once(extended, augmented)


def test_overlapping_parties_own_the_constant_entry_by_entry():
    """Client 1 holds samples 2-5, of which client 0 (samples 0-3) holds 2-3 first: no
    whole-feature assignment exists, so each sample's constant goes to its first holder."""
    X = sp.csr_matrix(np.arange(1.0, 25.0).reshape(6, 4))
    partition = from_blocks([(np.arange(4), np.arange(2)), (np.arange(2, 6), np.arange(2, 4)),
                             (np.arange(2), np.arange(2, 4)), (np.arange(4, 6), np.arange(2))],
                            6, 4)
    augmented = with_intercept(Dataset(X, np.ones(6)), 1.0).X
    extended = with_constant_feature(partition, augmented)
    assert extended.entry_owner is not None
    owners = extended.entry_owner[augmented.indices == 4]
    assert owners.tolist() == [0, 0, 0, 0, 1, 1]
    _covered_once(extended, augmented)


def test_party_files_train_with_an_intercept(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.random((60, 4)) + 2.0  # far from the origin: a bias is needed
    y = np.where(X[:, 0] + X[:, 2] > 5.0, "yes", "no")
    import pandas as pd

    ids = np.arange(60)
    pd.DataFrame({"id": ids, "f0": X[:, 0], "f1": X[:, 1], "label": y}).to_csv(
        tmp_path / "a.csv", index=False)
    pd.DataFrame({"id": ids, "f2": X[:, 2], "f3": X[:, 3]}).to_csv(tmp_path / "b.csv",
                                                                   index=False)
    out = tmp_path / "run"
    result = runner.invoke(app, ["run", "--data", f"parties:{tmp_path / 'a.csv'},"
                                 f"{tmp_path / 'b.csv'}", "--iterations", "400",
                                 "--participation", "full", "--out", str(out), "-q"])
    assert result.exit_code in (0, 3), result.output
    run = json.loads((out / "run.json").read_text())
    assert run["task"]["intercept_scaling"] == 1.0
    model = load_model(out / "model.npz")
    assert model.provenance["feature_names"] == ["f0", "f1", "f2", "f3"]  # not the constant
    assert model.n_features == 4 and model.intercept[0] < -1.0
    data, partition = load_parties({"a": tmp_path / "a.csv", "b": tmp_path / "b.csv"},
                                   psi=False)
    assert partition.n_features == 4


def test_the_cli_flag_and_the_config_key(tmp_path):
    out = tmp_path / "off"
    result = runner.invoke(app, ["run", "--iterations", "2", "--intercept", "off", "--out",
                                 str(out), "-q"])
    assert result.exit_code in (0, 3), result.output
    assert json.loads((out / "run.json").read_text())["task"]["intercept_scaling"] is None
    assert load_model(out / "model.npz").intercept.tolist() == [0.0]
    bad = runner.invoke(app, ["run", "--iterations", "2", "--intercept", "-2", "--out",
                              str(tmp_path / "bad")])
    assert bad.exit_code != 0 and "intercept" in bad.output
    base = {"experiment": {"name": "x", "budget": {"iterations": 2}},
            "data": {"dataset": "breast_cancer"}, "partition": {"spec": "grid:2x2"},
            "algorithms": {"hyfdca": {}}}
    assert parse_config(base).data.intercept == 1.0
    for value, expected in ((False, None), (10, 10.0), ("off", None)):
        config = parse_config({**base, "data": {"dataset": "breast_cancer", "intercept": value}})
        assert config.data.intercept == expected
        assert config.spec("hyfdca", 0).intercept == expected
        assert parse_config(config.to_dict()).data.intercept == expected  # resolved: kept
    with pytest.raises(HyflError, match="intercept.*true, false or a positive number"):
        parse_config({**base, "data": {"dataset": "breast_cancer", "intercept": -1}})
