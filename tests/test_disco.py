"""DiSCO: the engine against the slow reference, fast convergence, cost counts, refusals."""

import numpy as np
import pytest

from hyfl.algorithms import make_algorithm
from hyfl.algorithms.disco import DiSCO
from hyfl.errors import HyflError
from hyfl.participation import Full, RandomFraction
from hyfl.partition import grid, horizontal, stack, vertical
from hyfl.problem import make_problem, solve_centralized
from hyfl.runtime.simulation import random_streams, simulate
from reference_disco import ReferenceDiSCO
from test_fedhybrid import synthetic


def run_both(problem, partition, participation, cfg, rounds, seed=3):
    state = cfg.setup(problem, stack(partition, problem.X))
    reference = ReferenceDiSCO(problem, partition, cfg.beta, cfg.shift, cfg.max_pcg_iterations)
    assert state.tolerance == pytest.approx(reference.tolerance, rel=1e-12)
    rng, alg_rng = random_streams(seed)
    for t in range(1, rounds + 1):
        active = participation.active(t, rng)
        state = cfg.round(state, active, alg_rng)
        reference.round(active)
        np.testing.assert_allclose(state.w, reference.w, atol=1e-10, rtol=0)
    return state


@pytest.mark.parametrize(("loss", "schedule"), [("logistic", Full), ("squared", RandomFraction),
                                                ("smoothed_hinge", Full)])
def test_engine_reproduces_the_slow_reference(loss, schedule):
    problem = make_problem(synthetic(), loss, 0.05)
    partition = horizontal(problem.n_samples, problem.n_features, 4, seed=0)
    participation = schedule(4, 0.5) if schedule is RandomFraction else schedule(4)
    state = run_both(problem, partition, participation, DiSCO(), rounds=6)
    assert np.abs(state.w).sum() > 0


def test_engine_reproduces_the_reference_on_weighted_multiclass_data():
    data = synthetic(n=90, m=7, classes=3)
    weight = np.random.default_rng(0).uniform(0.5, 2.0, 90)
    problem = make_problem(data, "logistic", 0.05, sample_weight=weight)
    partition = horizontal(90, 7, 3, seed=1)
    run_both(problem, partition, Full(3), DiSCO(beta=0.01, shift=0.01), rounds=5)


def test_newton_steps_reach_the_optimum_in_a_few_rounds():
    """Damped Newton: quadratic once the decrement is small -- relative loss 1e-10 within
    ten rounds, where first-order methods need hundreds."""
    problem = make_problem(synthetic(n=200, m=10), "logistic", 1e-3)
    optimum = solve_centralized(problem, cache=False)
    partition = horizontal(200, 10, 4, seed=0)
    result = simulate(make_algorithm("disco"), problem, partition, Full(4), 10, seed=0,
                      optimum=optimum)
    assert result.column("relative_loss")[-1] < 1e-10
    trips = np.diff(result.column("round_trips"))
    iterations = np.array([row["pcg_iterations"] for row in result.metrics[1:]])
    # every round: the gradient, then per PCG iteration a product with every client and
    # the master's preconditioning -- but the last, once the residual is small enough
    np.testing.assert_array_equal(trips, 1 + 2 * iterations)


def test_an_absent_federation_waits():
    problem = make_problem(synthetic(), "logistic", 0.05)
    partition = horizontal(problem.n_samples, problem.n_features, 4, seed=0)
    cfg = DiSCO()
    state = cfg.setup(problem, stack(partition, problem.X))
    after = cfg.round(state, np.zeros(4, dtype=bool), np.random.default_rng(0))
    assert np.array_equal(after.w, state.w) and after.stats["round_trips"] == 0


def test_refuses_the_hinge_loss_and_split_features():
    problem = make_problem(synthetic(), "hinge", 0.05)
    with pytest.raises(HyflError, match="DiSCO needs a smooth loss"):
        DiSCO().setup(problem, stack(horizontal(120, 8, 2, seed=0), problem.X))
    smooth = make_problem(synthetic(), "logistic", 0.05)
    for partition in (vertical(120, 8, 2), grid(120, 8, 2, 2, seed=0)):
        with pytest.raises(HyflError, match="DiSCO needs a horizontal partition"):
            DiSCO().setup(smooth, stack(partition, smooth.X))


@pytest.mark.parametrize(("field", "value"), [("beta", 0), ("shift", -1.0), ("shift", "x"),
                                              ("max_pcg_iterations", 0)])
def test_hyperparameters_are_validated(field, value):
    with pytest.raises(HyflError, match=field):
        DiSCO(**{field: value}).validated()
