"""HyFDCA's step rules as objects: one registry, one place a name is resolved, and each
per-sample rule's step checked against a brute-force maximization of its own objective."""

from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest

import hyfl
from hyfl import _names
from hyfl.algorithms.hyfdca import HyFDCA
from hyfl.algorithms.step_rules import RULES, step_rule
from hyfl.errors import HyflError
from hyfl.losses import get_loss

SOURCE = pathlib.Path(hyfl.__file__).parent


def test_the_registry_is_the_cli_list_and_each_rule_its_own_module():
    assert tuple(RULES) == _names.STEP_RULES
    for name, rule in RULES.items():
        assert rule.name == name
        assert type(rule).__module__ == f"hyfl.algorithms.step_rules.{name}"
        assert HyFDCA(step_rule=name).validated().rule is rule


def test_no_engine_compares_a_rule_name():
    """The rule is resolved once (HyFDCA.rule); engines ask it, never compare its name."""
    comparison = re.compile(r"step_rule\s*(==|!=|in\b)")
    found = [f"{path.relative_to(SOURCE)}:{number}"
             for path in SOURCE.rglob("*.py") if path.name != "fedhybrid.py"  # its own rules
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if comparison.search(line)]
    assert found == []


def test_an_unknown_rule_names_the_choices():
    with pytest.raises(HyflError, match="cocoa, safe, theory, paper"):
        _ = HyFDCA(step_rule="fast").rule


def _dual_objective(loss, alpha, z, y, q, d):
    """``-l*(-(a + d)) - d z - q d^2 / 2`` (``-inf`` outside the dual domain)."""
    return -loss.conjugate(alpha + d, y) - d * z - 0.5 * q * d * d


def _brute_force_best(loss, alpha, z, y, q):
    """The best step on a fine grid over the feasible interval (the slow reference)."""
    lo, hi = loss.dual_bounds(y)
    lo = np.maximum(lo, alpha - 50.0) - alpha
    hi = np.minimum(hi, alpha + 50.0) - alpha
    grid = np.linspace(0.0, 1.0, 20001)
    d = lo[..., None] + (hi - lo)[..., None] * grid
    with np.errstate(invalid="ignore", over="ignore"):
        values = _dual_objective(loss, alpha[..., None], z[..., None], y[..., None],
                                 q[..., None], d)
    return np.nanmax(np.where(np.isfinite(values), values, -np.inf), axis=-1)


def _sample(loss_name, rng, n=40):
    loss = get_loss(loss_name)
    y = rng.choice([-1.0, 1.0], size=(n, 1)) if loss.classification else rng.normal(size=(n, 1))
    lo, hi = loss.dual_bounds(y)
    inside = rng.uniform(0.05, 0.95, size=(n, 1))
    if np.isfinite(lo).all() and np.isfinite(hi).all():
        alpha = lo + (hi - lo) * inside
    else:
        alpha = rng.normal(size=(n, 1))
    z = rng.normal(scale=2.0, size=(n, 1))
    sq_norms = rng.uniform(0.5, 3.0, size=n)
    return loss, alpha, z, y, sq_norms


@pytest.mark.parametrize("loss_name", ["hinge", "smoothed_hinge", "squared", "logistic"])
def test_the_safe_step_maximizes_its_quadratic_model(loss_name):
    rng = np.random.default_rng(3)
    loss, alpha, z, y, sq_norms = _sample(loss_name, rng)
    lam, N, beta = 0.1, 50, 1.7
    d = RULES["safe"].dual_steps(loss, alpha=alpha, z=z, y=y, sq_norms=sq_norms, lam=lam,
                                 n_samples=N, beta=beta, gamma_t=1.0)
    q = np.broadcast_to(beta * sq_norms[:, None] / (lam * N), alpha.shape)
    reached = _dual_objective(loss, alpha, z, y, q, d)
    best = _brute_force_best(loss, alpha, z, y, q)
    assert np.all(reached >= best - 1e-6 * (1 + np.abs(best)))


@pytest.mark.parametrize("loss_name", ["hinge", "squared", "logistic"])
def test_the_theory_step_stays_on_its_segment_and_is_best_there(loss_name):
    rng = np.random.default_rng(4)
    loss, alpha, z, y, sq_norms = _sample(loss_name, rng)
    lam, N, gamma_t = 0.1, 50, 0.5
    share = RULES["theory"].client_shares("N_k/N", np.full(alpha.shape[0], 10), N)
    assert share.shape == (alpha.shape[0], 1) and np.all(share == 10 / N)
    assert RULES["theory"].client_shares("1", np.full(3, 10), N) is None
    d = RULES["theory"].dual_steps(loss, alpha=alpha, z=z, y=y, sq_norms=sq_norms, lam=lam,
                                   n_samples=N, beta=1.0, gamma_t=gamma_t, client_share=share)
    end = share * (loss.dual_target(z, y) - alpha)
    assert np.all(np.minimum(0, end) - 1e-12 <= d) and np.all(d <= np.maximum(0, end) + 1e-12)
    q = gamma_t * sq_norms[:, None] / lam
    # The best point of the segment, on a grid of it: the rule's step is at least as good.
    grid = np.linspace(0.0, 1.0, 4001)
    with np.errstate(invalid="ignore", over="ignore"):
        values = _dual_objective(loss, alpha[..., None], z[..., None], y[..., None],
                                 q[..., None], end[..., None] * grid)
    best = np.nanmax(np.where(np.isfinite(values), values, -np.inf), axis=-1)
    assert np.all(_dual_objective(loss, alpha, z, y, q, d) >= best - 1e-6 * (1 + np.abs(best)))


def test_the_paper_rule_is_algorithm_5_as_printed():
    rng = np.random.default_rng(5)
    loss, alpha, z, y, sq_norms = _sample("hinge", rng)
    lam, N = 0.1, 50
    d = RULES["paper"].dual_steps(loss, alpha=alpha, z=z, y=y, sq_norms=sq_norms, lam=lam,
                                  n_samples=N, beta=1.0, gamma_t=1.0)
    assert np.array_equal(d, y * np.clip(lam * N * (1 - z) + y * alpha, 0, 1) - alpha)
    squared = get_loss("squared")
    d = RULES["paper"].dual_steps(squared, alpha=alpha, z=z, y=y, sq_norms=sq_norms, lam=lam,
                                  n_samples=N, beta=1.0, gamma_t=1.0)
    q = np.full_like(alpha, 1 / (lam * N))
    assert np.all(_dual_objective(squared, alpha, z, y, q, d)
                  >= _brute_force_best(squared, alpha, z, y, q) - 1e-6)


def test_the_cocoa_rule_takes_no_per_sample_steps_and_checks_its_hyperparameters():
    with pytest.raises(NotImplementedError):
        RULES["cocoa"].dual_steps(get_loss("hinge"), alpha=np.zeros((1, 1)), z=np.zeros((1, 1)),
                                  y=np.ones((1, 1)), sq_norms=np.ones(1), lam=1.0, n_samples=1,
                                  beta=1.0, gamma_t=1.0)
    with pytest.raises(HyflError, match="sip_scope"):
        HyFDCA(sip_scope="drawn").validated()
    with pytest.raises(HyflError, match="gamma"):
        HyFDCA(gamma=0.5).validated()
    HyFDCA(step_rule="safe", sip_scope="drawn", gamma=0.5).validated()


@pytest.mark.parametrize("name, refreshed, horizontal, trips", [
    ("safe", False, False, 4.0),  # SIP, steps/duals, primal aggregation, the test
    ("safe", True, False, 5.5),  # + the refresh of returning clients
    ("paper", False, True, 2.0),  # section 3.1: full participation, horizontal
    ("theory", True, False, 4.5),  # the paper's 4.5 with partial participation
    # SIP, proposals, image, direction, step (each party takes it): hyfdca_round's script
    ("cocoa", False, False, 5.0),
    ("cocoa", True, True, 5.5),
])
def test_round_trips_per_rule(name, refreshed, horizontal, trips):
    assert step_rule(name).round_trips(refreshed=refreshed, horizontal=horizontal,
                                       refresh_inner_products=False) == trips
    assert HyFDCA(step_rule=name).round_trips(refreshed=refreshed,
                                              horizontal=horizontal) == trips
