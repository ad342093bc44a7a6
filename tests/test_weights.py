"""Sample and class weights: the weighted losses, their certificate, and the estimators.

The weighted loss of a sample of weight ``c`` is ``c l(z, y)``. Checked here: each
method against its definition (Fenchel-Young at the optimal dual, the dual step
against a brute-force maximization), the weighted problem against scikit-learn's
liblinear fitted with ``sample_weight`` (an independent solver), HyFDCA's certificate
on weighted problems in both engines, and the estimators' ``sample_weight`` and
``class_weight`` as a scikit-learn user would use them.
"""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import MaxAbsScaler
from sklearn.svm import LinearSVC

from hyfl import HyFDCA, HyFDCAClassifier, HyFDCARegressor, make_problem, simulate
from hyfl.data.dataset import Dataset
from hyfl.errors import HyflError
from hyfl.losses import LOSSES
from hyfl.participation import RandomFraction
from hyfl.partition import grid, parse_partition
from hyfl.privacy.ciphers import make_cipher
from hyfl.problem import solve_centralized
from hyfl.runtime.protocol import run_protocol

RNG = np.random.default_rng(7)


def _imbalanced(n=400, m=6, seed=0):
    """Two classes, 1 in 10 positive, separated away from the origin."""
    rng = np.random.default_rng(seed)
    y = np.where(rng.random(n) < 0.1, 1, 0)
    X = rng.normal(size=(n, m)) + 2.0 + 1.2 * y[:, None] * np.r_[1.0, 1.0, np.zeros(m - 2)]
    return X, y


# -- the losses --------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(LOSSES))
def test_weighted_losses_follow_their_definitions(name):
    loss = LOSSES[name]
    n = 50
    y = np.where(RNG.random(n) < 0.5, 1.0, -1.0) if loss.classification else RNG.normal(size=n)
    z = RNG.normal(size=n) * 2
    c = RNG.uniform(0.1, 5.0, n)
    np.testing.assert_allclose(loss.value(z, y, c), c * loss.value(z, y))
    np.testing.assert_allclose(loss.derivative(z, y, c), c * loss.derivative(z, y))
    lo, hi = loss.dual_bounds(y)
    wlo, whi = loss.dual_bounds(y, c)
    np.testing.assert_allclose(wlo, c * lo)
    np.testing.assert_allclose(whi, c * hi)
    # Fenchel-Young with equality at alpha = -c l'(z): c l(z) + (c l)*(-alpha) = -alpha z
    alpha = loss.dual_target(z, y, c)
    np.testing.assert_allclose(loss.value(z, y, c) + loss.conjugate(alpha, y, c), -alpha * z,
                               atol=1e-9)


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_the_weighted_dual_step_maximizes_its_one_dimensional_objective(name):
    loss = LOSSES[name]
    n = 12
    y = np.where(RNG.random(n) < 0.5, 1.0, -1.0) if loss.classification else RNG.normal(size=n)
    c = RNG.uniform(0.2, 4.0, n)
    lo, hi = loss.dual_bounds(y, c)
    alpha = np.where(np.isfinite(lo), lo + 0.3 * (hi - lo), RNG.normal(size=n))
    z, q = RNG.normal(size=n), RNG.uniform(0.1, 3.0, n)
    step = loss.dual_step(alpha, z, q, y, c)

    def objective(d, i):
        return -loss.conjugate(alpha[i] + d, y[i:i + 1], c[i:i + 1]) - d * z[i] - q[i] * d * d / 2

    for i in range(n):
        low = lo[i] - alpha[i] if np.isfinite(lo[i]) else -20.0
        high = hi[i] - alpha[i] if np.isfinite(hi[i]) else 20.0
        grid_points = np.linspace(low, high, 20001)
        best = np.max(objective(grid_points, i))
        assert objective(np.array([step[i]]), i)[0] >= best - 1e-6


def test_unit_weights_change_nothing():
    loss = LOSSES["logistic"]
    y = np.where(RNG.random(30) < 0.5, 1.0, -1.0)
    alpha, z, q = 0.4 * y, RNG.normal(size=30), np.full(30, 0.7)
    assert np.array_equal(loss.dual_step(alpha, z, q, y, np.ones(30)),
                          loss.dual_step(alpha, z, q, y))


def test_weights_of_another_shape_are_refused():
    with pytest.raises(HyflError, match="shapes"):
        LOSSES["hinge"].value(np.zeros(3), np.ones(3), np.ones(2))


# -- the problem and its reference solver ------------------------------------------------

@pytest.mark.parametrize("loss", ["hinge", "logistic", "squared", "smoothed_hinge"])
def test_the_weighted_reference_matches_an_independent_solver(loss):
    X, y = _imbalanced(200)
    c = np.random.default_rng(1).uniform(0.2, 3.0, 200)
    task = "regression" if loss == "squared" else "binary"
    labels = X[:, 0] - X[:, 1] if task == "regression" else np.where(y == 1, 1.0, -1.0)
    problem = make_problem(Dataset(sp.csr_matrix(X), labels, task=task), loss, 1e-2,
                           sample_weight=c)
    optimum = solve_centralized(problem, cache=False)
    if loss == "squared":  # weighted normal equations: (X^T C X / n + lam I) w = X^T C y / n
        A = X.T @ (c[:, None] * X) / 200 + 1e-2 * np.eye(6)
        reference = np.linalg.solve(A, X.T @ (c * labels) / 200)
    elif loss == "hinge":  # the weighted dual, a box-constrained QP: s_i = y_i a_i in [0, c_i]
        from scipy.optimize import minimize

        lam, n, signs = 1e-2, 200, np.where(y == 1, 1.0, -1.0)

        def negative_dual(s):
            w = X.T @ (signs * s) / (lam * n)
            return -(np.sum(s) / n - 0.5 * lam * w @ w), -(1 / n - signs * (X @ w) / n)

        fit = minimize(negative_dual, np.zeros(n), jac=True, method="L-BFGS-B",
                       bounds=list(zip(np.zeros(n), c)), options={"ftol": 1e-15, "gtol": 1e-12,
                                                                   "maxiter": 100_000})
        assert optimum.primal == pytest.approx(-fit.fun, rel=1e-6)  # strong duality
        return
    else:  # its gradient vanishes at the optimum
        gradient = problem.primal_gradient(optimum.w)
        assert np.linalg.norm(gradient) < 1e-7
        return
    assert optimum.primal == pytest.approx(problem.primal(reference[:, None]), rel=1e-9)


def test_weights_that_are_not_positive_are_refused_naming_the_row():
    data = Dataset(sp.csr_matrix(np.eye(3)), np.array([1.0, -1.0, 1.0]))
    with pytest.raises(HyflError, match="row 2 .*Drop the samples of weight 0"):
        make_problem(data, "hinge", 0.1, sample_weight=[1.0, 0.0, 2.0])
    with pytest.raises(HyflError, match="one weight per sample"):
        make_problem(data, "hinge", 0.1, sample_weight=[1.0, 2.0])


# -- HyFDCA on weighted problems ---------------------------------------------------------

@pytest.fixture(scope="module")
def weighted():
    X, y = _imbalanced(300)
    c = np.random.default_rng(2).uniform(0.3, 3.0, 300)
    return make_problem(Dataset(sp.csr_matrix(X), np.where(y == 1, 1.0, -1.0)), "hinge", 1e-2,
                        sample_weight=c)


@pytest.mark.parametrize("rule", ["cocoa", "safe", "theory"])
def test_the_certificate_of_a_weighted_run_bounds_its_suboptimality(weighted, rule):
    optimum = solve_centralized(weighted, cache=False)
    partition = parse_partition("grid:3x2", weighted.X, seed=0)
    result = simulate(HyFDCA(step_rule=rule), weighted, partition, RandomFraction(6, 0.5), 150,
                      seed=0)
    suboptimality = weighted.primal(result.weights) - optimum.primal
    assert -1e-12 <= suboptimality <= result.final["gap"] + 1e-12
    if rule == "cocoa":  # (the others' single dual steps are slower)
        assert result.final["gap"] <= 0.01 * result.column("gap")[0]


def test_the_paper_rule_refuses_weights(weighted):
    partition = parse_partition("grid:2x2", weighted.X, seed=0)
    with pytest.raises(HyflError, match="paper.*weights"):
        simulate(HyFDCA(step_rule="paper", local_steps=2), weighted, partition,
                 RandomFraction(4, 0.5), 2, seed=0)


@pytest.mark.parametrize("cipher_name", ["none", "ckks"])
def test_the_protocol_engine_reproduces_a_weighted_run(weighted, cipher_name):
    n, m = weighted.n_samples, weighted.n_features
    partition, participation = grid(n, m, 3, 2), RandomFraction(6, 0.5)
    cipher = make_cipher(cipher_name)
    stacked = simulate(HyFDCA(), weighted, partition, participation, 8, seed=3, cipher=cipher)
    secure = run_protocol(HyFDCA(), weighted, partition, participation, 8, cipher, seed=3)
    tolerance = 0.0 if cipher_name == "none" else 1e-6
    np.testing.assert_allclose(secure.weights, stacked.weights, atol=tolerance)
    assert secure.final["primal"] == pytest.approx(stacked.final["primal"], abs=1e-6)


# -- the estimators ----------------------------------------------------------------------

def test_balanced_class_weight_solves_liblinears_balanced_problem():
    X, y = _imbalanced()
    clf = HyFDCAClassifier(class_weight="balanced", lam=1e-2, tol=1e-5, random_state=0,
                           max_iter=3000).fit(X, y)
    n = len(y)
    svc = LinearSVC(loss="hinge", class_weight="balanced", C=1 / (1e-2 * n), tol=1e-12,
                    max_iter=1_000_000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        svc.fit(X, y)
    # The same objective, liblinear's intercept_scaling 1 being hyfl's default.
    counts = np.bincount(y)
    c = (n / (2 * counts))[y]
    c = c / c.mean()
    from hyfl.data.dataset import with_intercept

    problem = make_problem(with_intercept(Dataset(sp.csr_matrix(X), np.where(y == 1, 1.0, -1.0))),
                           "hinge", 1e-2, sample_weight=c)
    ours = problem.primal(np.append(clf.coef_, clf.intercept_)[:, None])
    theirs = problem.primal(np.append(svc.coef_.ravel(), svc.intercept_)[:, None])
    assert ours - theirs <= clf.gap_ + 1e-9
    recall = np.mean(clf.predict(X)[y == 1] == 1)
    unweighted = HyFDCAClassifier(lam=1e-2, tol=1e-5, random_state=0, max_iter=3000).fit(X, y)
    assert recall > np.mean(unweighted.predict(X)[y == 1] == 1)  # the minority is heard


def test_integer_weights_reach_the_optimum_of_repeated_samples():
    X, y = _imbalanced(120)
    k = np.random.default_rng(3).integers(1, 4, 120)
    weighted = HyFDCAClassifier(lam=1e-2, tol=1e-6, random_state=0, max_iter=5000,
                                loss="logistic").fit(X, y, sample_weight=k)
    repeated = HyFDCAClassifier(lam=1e-2, tol=1e-6, random_state=0, max_iter=5000,
                                loss="logistic").fit(np.repeat(X, k, axis=0), np.repeat(y, k))
    np.testing.assert_allclose(weighted.coef_, repeated.coef_, atol=1e-3)
    assert weighted.intercept_ == pytest.approx(repeated.intercept_, abs=1e-3)


def test_a_zero_weight_is_a_removed_sample():
    X, y = _imbalanced(100)
    weight = np.ones(100)
    weight[::7] = 0.0
    kept = weight > 0
    a = HyFDCAClassifier(random_state=0, max_iter=50, tol=0)
    b = HyFDCAClassifier(random_state=0, max_iter=50, tol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a.fit(X, y, sample_weight=weight)
        b.fit(X[kept], y[kept])
    np.testing.assert_array_equal(a.coef_, b.coef_)


def test_a_pipeline_with_class_weight_in_a_grid_search_pickles_and_predicts():
    X, y = _imbalanced(240)
    pipe = make_pipeline(MaxAbsScaler(), HyFDCAClassifier(loss="logistic", random_state=0,
                                                          tol=1e-3))
    search = GridSearchCV(pipe, {"hyfdcaclassifier__class_weight": [None, "balanced"]},
                          cv=3, scoring="balanced_accuracy")
    search.fit(sp.csr_matrix(X), y)
    best = pickle.loads(pickle.dumps(search.best_estimator_))
    np.testing.assert_array_equal(best.predict_proba(X), search.predict_proba(X))
    assert search.best_params_["hyfdcaclassifier__class_weight"] == "balanced"


def test_the_regressor_takes_sample_weights():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(150, 3))
    y = X @ np.array([1.0, -2.0, 0.5]) + 3.0 + 0.1 * rng.normal(size=150)
    c = rng.uniform(0.5, 2.0, 150)
    reg = HyFDCARegressor(lam=1e-3, tol=1e-4, random_state=0).fit(X, y, sample_weight=c)
    # The weighted mean of the squared loss, with the intercept's column: exactly solved.
    A = np.column_stack([X, np.ones(150)])
    cw = c / c.mean()

    def objective(w):
        return 0.5e-3 * w @ w + np.mean(cw * 0.5 * (A @ w - y) ** 2)

    exact = np.linalg.solve(A.T @ (cw[:, None] * A) / 150 + 1e-3 * np.eye(4),
                            A.T @ (cw * y) / 150)
    ours = objective(np.append(reg.coef_, reg.intercept_))
    assert objective(exact) <= ours <= objective(exact) + reg.gap_ + 1e-12
    assert reg.gap_ <= 1e-4 * ours


@pytest.mark.parametrize(("weight", "match"), [
    (np.full(10, -1.0), "finite and >= 0"),
    (np.ones(3), "one weight per sample"),
    (np.zeros(10), "zero for every sample"),
])
def test_bad_sample_weights_name_the_fix(weight, match):
    X, y = _imbalanced(10, seed=5)
    y[:2] = [0, 1]
    with pytest.raises(HyflError, match=match):
        HyFDCAClassifier(max_iter=2).fit(X, y, sample_weight=weight)


def test_an_unknown_class_in_class_weight_is_refused():
    X, y = _imbalanced(40)
    with pytest.raises(HyflError, match="class_weight"):
        HyFDCAClassifier(class_weight={7: 2.0}, max_iter=2).fit(X, y)


def test_fedhybrid_newton_reaches_the_weighted_optimum(weighted):
    """The baselines step on the weighted loss too: FedHybrid's Newton-type clients (weighted
    gradient and Hessian) reach the weighted problem's optimum."""
    from hyfl.algorithms import make_algorithm
    from hyfl.participation import Full

    partition = parse_partition("horizontal:3", weighted.X, seed=0)
    logistic = make_problem(Dataset(weighted.X, weighted.Y[:, 0]), "logistic", weighted.lam,
                            sample_weight=weighted.W[:, 0])
    optimum = solve_centralized(logistic, cache=False)
    result = simulate(make_algorithm("fedh-n"), logistic, partition, Full(3), 200, seed=0,
                      optimum=optimum)
    assert result.column("relative_loss")[-1] < 1e-10


def test_one_full_batch_fedsgd_round_is_a_weighted_gradient_step(weighted):
    from hyfl.algorithms import make_algorithm
    from hyfl.participation import Full

    n = weighted.n_samples
    partition = parse_partition("vertical:2", weighted.X, seed=0)
    result = simulate(make_algorithm("fedsgd", {"batch_size": n, "eta0": 0.5}), weighted,
                      partition, Full(2), 1, seed=0)
    w0 = np.zeros((weighted.n_features, 1))
    z = weighted.X @ w0
    gradient = weighted.X.T @ (weighted.W * LOSSES["hinge"].derivative(z, weighted.Y)) / n
    np.testing.assert_allclose(result.weights, w0 - 0.5 * gradient, atol=1e-12)


def test_class_weight_from_the_command_line_and_a_config(tmp_path):
    import json

    from typer.testing import CliRunner

    from hyfl.cli import app
    from hyfl.experiments.config import parse_config

    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", "--class-weight", "balanced", "--iterations", "3",
                                      "--out", str(out), "-q"])
    assert result.exit_code == 0, result.output
    assert json.loads((out / "run.json").read_text())["task"]["weighted"] is True
    wrong = CliRunner().invoke(app, ["run", "--class-weight", "heavy", "--out",
                                     str(tmp_path / "x")])
    assert wrong.exit_code != 0 and "balanced" in wrong.output
    base = {"experiment": {"name": "x", "budget": {"iterations": 2}},
            "data": {"dataset": "breast_cancer", "class_weight": "balanced"},
            "partition": {"spec": "grid:2x2"}, "algorithms": {"hyfdca": {}}}
    config = parse_config(base)
    assert config.spec("hyfdca", 0).class_weight == "balanced"
    assert parse_config(config.to_dict()).data.class_weight == "balanced"
    with pytest.raises(HyflError, match="class_weight.*Choose one of: balanced"):
        parse_config({**base, "data": {"dataset": "breast_cancer", "class_weight": "heavy"}})


# --------------------------------------------------------------------------- party files


def _party_frames(rng, n=40):
    import pandas as pd

    ids = [f"c{i:03d}" for i in range(n)]
    X = rng.normal(size=(n, 4))
    y = np.where(X[:, 0] - 0.5 * X[:, 2] + 0.3 * rng.normal(size=n) > 0, "yes", "no")
    weight = rng.integers(1, 4, size=n)
    bank = pd.DataFrame({"id": ids, "x0": X[:, 0], "x1": X[:, 1], "label": y, "w": weight})
    shop = pd.DataFrame({"id": ids, "x2": X[:, 2], "x3": X[:, 3]})
    return bank, shop, weight


def _repeated(frame, weight):
    out = frame.loc[np.repeat(np.arange(len(frame)), weight)].reset_index(drop=True)
    copy = out.groupby("id").cumcount().astype(str)
    out["id"] = out["id"] + "-" + copy
    return out.drop(columns=["w"], errors="ignore")


def test_a_party_files_weight_column_weighs_samples_as_repeats(tmp_path):
    """``;weight=w``: a sample of weight k counts as k copies of it (the weights are a
    weighted mean's), through the whole set-up of ``hyfl run``, with the intercept."""
    from hyfl.experiments.runner import RunSpec, prepare

    bank, shop, weight = _party_frames(np.random.default_rng(3))
    bank.to_csv(tmp_path / "bank.csv", index=False)
    shop.to_csv(tmp_path / "shop.csv", index=False)
    _repeated(bank, weight).to_csv(tmp_path / "bank-rep.csv", index=False)
    _repeated(shop, weight).to_csv(tmp_path / "shop-rep.csv", index=False)
    weighted = prepare(RunSpec(data=f"parties:{tmp_path / 'bank.csv'},{tmp_path / 'shop.csv'}"
                               ";weight=w;psi=false", lam=0.01, loss="logistic"))
    by_id = dict(zip(bank["id"], weight / weight.mean()))
    ids = weighted.train.meta["sample_ids"]
    np.testing.assert_allclose(weighted.problem.W[:, 0], [by_id[i] for i in ids])
    repeated = prepare(RunSpec(data=f"parties:{tmp_path / 'bank-rep.csv'},"
                               f"{tmp_path / 'shop-rep.csv'};psi=false", lam=0.01,
                               loss="logistic"))
    assert repeated.problem.n_samples == weight.sum()
    np.testing.assert_allclose(weighted.optimum.primal, repeated.optimum.primal, rtol=1e-6)
    np.testing.assert_allclose(weighted.optimum.w, repeated.optimum.w, atol=1e-4)


def test_party_files_weights_that_disagree_or_are_missing_are_named(tmp_path):
    from hyfl.data import load_party_spec

    bank, shop, weight = _party_frames(np.random.default_rng(4))
    shop["w"] = weight
    shop.loc[7, "w"] = 9
    bank.to_csv(tmp_path / "bank.csv", index=False)
    shop.to_csv(tmp_path / "shop.csv", index=False)
    spec = f"parties:{tmp_path / 'bank.csv'},{tmp_path / 'shop.csv'};weight=w;psi=false"
    with pytest.raises(HyflError, match=r"sample 'c007' has weight \d in party file .*bank"
                       r".* but 9 in party file .*shop"):
        load_party_spec(spec)
    # Horizontal parties, one without the column: its samples have no weight.
    other = bank.assign(id=[f"d{i:03d}" for i in range(len(bank))]).drop(columns=["w"])
    other.to_csv(tmp_path / "other.csv", index=False)
    with pytest.raises(HyflError, match="samples 'd000', .* have no weight"):
        load_party_spec(f"parties:{tmp_path / 'bank.csv'},{tmp_path / 'other.csv'};"
                        "weight=w;psi=false")
    bank.loc[3, "w"] = 0
    bank.to_csv(tmp_path / "bank.csv", index=False)
    with pytest.raises(HyflError, match=r"has weight 0 in column 'w' .*ID 'c003'"):
        load_party_spec(spec)


def test_a_model_of_weighted_party_files_predicts_without_the_weight_option(tmp_path):
    """The model knows its weight column: ``hyfl predict`` never reads it as a feature,
    with the spec option ``;weight=`` or without it."""
    from typer.testing import CliRunner

    from hyfl.cli import app

    bank, shop, _ = _party_frames(np.random.default_rng(5))
    bank.to_csv(tmp_path / "bank.csv", index=False)
    shop.to_csv(tmp_path / "shop.csv", index=False)
    files = f"parties:{tmp_path / 'bank.csv'},{tmp_path / 'shop.csv'}"
    runner = CliRunner()
    done = runner.invoke(app, ["run", "--data", f"{files};weight=w;psi=false", "--iterations",
                               "20", "--out", str(tmp_path / "r"), "--no-progress"])
    assert done.exit_code in (0, 3), done.output
    model = str(tmp_path / "r" / "model.npz")
    done = runner.invoke(app, ["predict", model, "--data", f"{files};psi=false",
                               "--out", str(tmp_path / "p.csv")])
    assert done.exit_code == 0, done.output
    done = runner.invoke(app, ["predict", model, "--data", f"{files};weight=w;psi=false",
                               "--out", str(tmp_path / "q.csv")])
    assert done.exit_code == 0, done.output
    assert (tmp_path / "p.csv").read_text() == (tmp_path / "q.csv").read_text()
