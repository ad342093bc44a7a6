"""Primal, dual, gap and the centralized reference solver."""

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import make_classification

from hyfl.algorithms.hyfdca import HyFDCA
from hyfl.data.dataset import Dataset
from hyfl.errors import HyflError
from hyfl.participation import Full
from hyfl.partition import horizontal
from hyfl.problem import make_problem, solve_centralized
from hyfl.runtime.simulation import simulate


def data(n=150, m=8, seed=0, classes=2):
    X, y = make_classification(
        n,
        m,
        n_informative=5,
        n_redundant=0,
        n_classes=classes,
        n_clusters_per_class=1,
        random_state=seed,
    )
    if classes == 2:
        return Dataset(sp.csr_matrix(X), np.where(y > 0, 1.0, -1.0), "d")
    return Dataset(sp.csr_matrix(X), y, "d3", task="multiclass")


@pytest.mark.parametrize("loss", ["logistic", "squared", "smoothed_hinge"])
def test_primal_gradient_matches_finite_differences(loss):
    p = make_problem(data(), loss, 0.1)
    rng = np.random.default_rng(0)
    w = rng.normal(size=(p.n_features, 1))
    g = p.primal_gradient(w)
    h = 1e-6
    for j in range(p.n_features):
        e = np.zeros_like(w)
        e[j] = h
        assert g[j, 0] == pytest.approx((p.primal(w + e) - p.primal(w - e)) / (2 * h), abs=1e-6)


@pytest.mark.parametrize("loss", ["hinge", "logistic", "squared", "smoothed_hinge"])
def test_weak_duality_and_optimality_of_the_reference(loss):
    p = make_problem(data(), loss, 0.05)
    opt = solve_centralized(p, cache=False)
    rng = np.random.default_rng(1)
    for _ in range(20):  # the optimum beats random perturbations
        assert opt.primal <= p.primal(opt.w + 1e-3 * rng.normal(size=opt.w.shape)) + 1e-12
    if p.loss.smooth:
        assert opt.info["gradient_norm"] < 1e-7
    # A long HyFDCA run gives a dual certificate: D(alpha) <= P* <= P(w).
    result = simulate(
        HyFDCA(local_steps=40, step_rule="safe"),
        p,
        horizontal(150, 8, 3, seed=0),
        Full(3),
        2000,
        eval_every=2000,
    )
    dual = p.dual(result.duals)
    assert dual <= opt.primal + 1e-9
    assert opt.primal - dual < 1e-6 * opt.primal


def test_squared_loss_reference_is_the_exact_ridge_solution():
    d = data()
    p = make_problem(
        Dataset(d.X, np.random.default_rng(0).normal(size=150), "r", task="regression"),
        "squared",
        0.1,
    )
    w = solve_centralized(p, cache=False).w
    X = d.X.toarray()
    exact = np.linalg.solve(X.T @ X / 150 + 0.1 * np.eye(8), X.T @ p.Y / 150)
    np.testing.assert_allclose(w, exact, atol=1e-10)


def test_optimum_cache_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    p = make_problem(data(), "hinge", 0.05)
    first = solve_centralized(p)
    second = solve_centralized(p)
    assert second.info.get("cached") and second.primal == first.primal


def test_multiclass_encoding_prediction_and_objective():
    d = data(n=120, classes=3)
    p = make_problem(d, "hinge", 0.05)
    assert p.Y.shape == (120, 3) and set(np.unique(p.Y)) == {-1.0, 1.0}
    assert np.all((p.Y == 1).sum(axis=1) == 1)
    opt = solve_centralized(p, cache=False)
    # one-vs-rest objective is the sum of the binary objectives
    total = 0.0
    for c in range(3):
        yc = np.where(d.y == c, 1.0, -1.0)
        pc = make_problem(Dataset(d.X, yc, "c"), "hinge", 0.05)
        total += pc.primal(opt.w[:, [c]])
    assert p.primal(opt.w) == pytest.approx(total)
    assert p.accuracy(d.X, d.y, opt.w) > 0.7


def test_duality_gap_is_nonnegative_and_zero_at_matching_pair():
    p = make_problem(data(), "squared", 0.5)
    rng = np.random.default_rng(2)
    for _ in range(10):
        alpha = rng.normal(size=(150, 1))
        w = rng.normal(size=(8, 1))
        assert p.duality_gap(w, alpha) >= -1e-12
    # for the squared loss the optimal pair satisfies alpha = y - Xw
    w = solve_centralized(p, cache=False).w
    alpha = p.Y - p.X @ w
    assert p.duality_gap(w, alpha) == pytest.approx(0.0, abs=1e-10)


def test_bad_inputs_are_named():
    d = data()
    with pytest.raises(HyflError, match="lam"):
        make_problem(d, "hinge", -1.0)
    with pytest.raises(HyflError, match="loss"):
        make_problem(d, "huber", 1.0)
    bad = Dataset(sp.csr_matrix(np.array([[np.nan, 1.0]])), np.array([1.0]), "bad")
    with pytest.raises(HyflError, match="NaN"):
        make_problem(bad, "hinge", 1.0)
    reg = Dataset(d.X, np.linspace(0, 1, 150), "reg", task="regression")
    with pytest.raises(HyflError, match="squared"):
        make_problem(reg, "hinge", 1.0)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (np.nan, r"NaN or infinite feature value in row 2"),
        (1e200, r"feature value 1e\+200 in row 2"),
    ],
)
def test_in_memory_arrays_get_the_loaders_value_check(value, expected):
    X = np.array([[1.0, 0.0], [value, 2.0]])
    data = Dataset(X=sp.csr_matrix(X), y=np.array([1.0, -1.0]), name="mem", task="binary")
    with pytest.raises(HyflError, match=expected):
        make_problem(data)
